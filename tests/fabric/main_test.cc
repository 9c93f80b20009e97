// fabric/main.h: LibTorch's errors that do not say what to change are said in the project's terms
// (issue 67: "DefaultCPUAllocator", "index out of range in self" and "probability tensor contains
// inf/nan" reached users as they were).
#include "fabric/main.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/embedding.h>

#include <cmath>
#include <string>

namespace {

// The first line of the error `f` throws (LibTorch's, without its stack).
template <class F>
std::string torch_error(F f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "(no error)";
}

TEST(ExplainTorchError, RealAllocatorEmbeddingAndSamplingErrorsSayWhatToChange) {
  // 2^40 floats: 4 TiB, refused by the allocator at once.
  const std::string oom = torch_error([] { torch::empty({int64_t{1} << 40}, torch::kFloat); });
  ASSERT_NE(oom.find("DefaultCPUAllocator"), std::string::npos) << oom;
  EXPECT_EQ(fabric::explain_torch_error(oom),
            "out of memory: a tensor of 4096.0 GiB did not fit in this machine's memory; lower "
            "the sizes in the config (data.batch_size; the model's sizes: its model.* keys, or a "
            "smaller model.pretrained) or see what a run needs with "
            "//tools:estimate_memory");

  torch::nn::Embedding table(10, 4);
  const std::string index = torch_error([&] { table(torch::tensor({12}, torch::kLong)); });
  EXPECT_EQ(
      fabric::explain_torch_error(index).rfind("index out of range in an embedding: an id", 0), 0u)
      << index;

  const std::string sample = torch_error([] {
    torch::multinomial(torch::tensor({std::nanf(""), 1.0f}), 1);
  });
  EXPECT_EQ(
      fabric::explain_torch_error(sample).rfind("sampling from a distribution with inf/nan", 0), 0u)
      << sample;

  EXPECT_EQ(fabric::explain_torch_error("shape '[2, 3]' is invalid for input of size 5"),
            "shape '[2, 3]' is invalid for input of size 5");
}

}  // namespace
