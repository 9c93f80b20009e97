// What the Hugging Face parity tests of generation share: the reference files make_llamas.py and
// make_gpt2.py write (NAME.ref.safetensors, NAME.gen.safetensors), their prompts as id lists, and
// greedy generation without a cache (the model's forward over the whole sequence every step).
#ifndef TESTS_FABRIC_HF_GENERATION_TESTING_H_
#define TESTS_FABRIC_HF_GENERATION_TESTING_H_

#include <torch/utils.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "fabric/checkpoint/safetensors.h"

namespace fabric::testing {

// A safetensors file's tensors by name.
inline std::map<std::string, torch::Tensor> tensors_of(const std::filesystem::path& file) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [n, t] : fabric::load_safetensors(file).tensors) out[n] = t;
  return out;
}

inline std::vector<int64_t> row(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// A generation reference's batch ("batch.prompt" [B, L] left-padded, "batch.lengths" [B]) as its
// prompts without the padding.
inline std::vector<std::vector<int64_t>> batch_prompts(
    const std::map<std::string, torch::Tensor>& gen) {
  const torch::Tensor padded = gen.at("batch.prompt");
  const std::vector<int64_t> lengths = row(gen.at("batch.lengths"));
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t b = 0; b < padded.size(0); ++b)
    prompts.push_back(row(padded[b].narrow(0, padded.size(1) - lengths[b], lengths[b])));
  return prompts;
}

// n greedy ids after `prompt`: argmax of the model's forward over the whole sequence each step.
template <typename Model>
std::vector<int64_t> greedy_without_cache(Model& model, std::vector<int64_t> prompt, int64_t n) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const torch::Tensor logits = model->forward(torch::tensor(prompt).view({1, -1}));
    out.push_back(logits[0][-1].argmax().item<int64_t>());
    prompt.push_back(out.back());
  }
  return out;
}

}  // namespace fabric::testing

#endif  // TESTS_FABRIC_HF_GENERATION_TESTING_H_
