// fabric/nn/fp8.h's module side: which devices run float8 GEMMs (fp8_supported) and which
// fabric::nn::Linear layers of a module get them (convert_to_fp8, with torchao's size filter).
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fabric/accelerators/device_info.h"
#include "fabric/nn/fp8.h"
#include "fabric/nn/fp8_quantize.h"
#include "fabric/nn/tensor_parallel.h"

namespace fabric::nn {

namespace {

// An exclude pattern of convert_to_fp8 (fabric.fp8.exclude_modules) that names no module: every
// Linear whose float8 GEMMs torchao's H100 measurements found slower than bf16 (its
// _auto_filter_for_recipe; TorchTitan's float8 filter_fqns entry of the same name) stays out:
// tensorwise (and delayed, tensorwise too) with in <= 4096 and out <= 1024; rowwise with
// out <= 2048, in <= 1024, or out <= 4096 and in <= 2048. The quantization passes cost more than
// the faster GEMM saves at those sizes (e.g. GPT-2 medium's two 1024-wide projections).
constexpr const char* kAutoFilter = "auto_filter_small_kn";

bool too_small_for_fp8(int64_t in, int64_t out, Fp8Scaling scaling) {
  if (scaling == Fp8Scaling::kRowwise)
    return out <= 2048 || in <= 1024 || (out <= 4096 && in <= 2048);
  return in <= 4096 && out <= 1024;
}

}  // namespace

bool fp8_supported(const torch::Device& device, std::string* why_not, Fp8Scaling scaling) {
  const bool rowwise = scaling == Fp8Scaling::kRowwise;
  if (device.is_cpu() && rowwise) {
    if (why_not) *why_not = "rowwise float8 scaling runs on CUDA only (the CPU's is tensorwise)";
    return false;
  }
  if (device.is_cpu()) return true;
  if (!device.is_cuda()) {
    if (why_not) *why_not = "float8 GEMMs run on CUDA and CPU devices, not " + device.str();
    return false;
  }
  for (const auto& d : query_runtime_info().devices) {
    if (d.index != device.index()) continue;
    const int need = rowwise ? 90 : 89;
    if (d.capability_major * 10 + d.capability_minor >= need) return true;
    if (why_not)
      *why_not = "cuda:" + std::to_string(d.index) + " has compute capability " +
                 std::to_string(d.capability_major) + "." + std::to_string(d.capability_minor) +
                 (rowwise ? " < 9.0 (rowwise float8 needs Hopper or newer)"
                          : " < 8.9 (float8 needs Ada, Hopper or newer)");
    return false;
  }
  if (why_not) *why_not = "no CUDA device " + device.str();
  return false;
}

Fp8Conversion convert_to_fp8(torch::nn::Module& module, const std::vector<std::string>& exclude,
                             Fp8Scaling scaling, int64_t history_length, bool fast_accumulation,
                             int64_t grad_margin) {
  detail::read_cast_grid_setting();
  if (scaling == Fp8Scaling::kDelayed) Fp8History check(history_length, grad_margin);  // throws
  Fp8Conversion out;
  // The module itself by reference (named_modules can include it only when a shared_ptr owns it).
  std::vector<std::pair<std::string, torch::nn::Module*>> all = {{"(root)", &module}};
  for (const auto& item : module.named_modules("", /*include_self=*/false))
    all.emplace_back(item.key(), item.value().get());
  std::vector<bool> used(exclude.size(), false);
  bool auto_filter = false;
  for (size_t i = 0; i < exclude.size(); ++i)
    if (exclude[i] == kAutoFilter) used[i] = auto_filter = true;  // matched or not: no typo
  for (const auto& [name, m] : all) {
    if (m->as<torch::nn::LinearImpl>() != nullptr) {
      out.plain.push_back(name);
      continue;
    }
    auto* l = m->as<LinearImpl>();
    if (l == nullptr) continue;
    bool skip = auto_filter && too_small_for_fp8(l->weight.size(1), l->weight.size(0), scaling);
    for (size_t i = 0; i < exclude.size(); ++i) {
      const bool hit = exclude[i] != kAutoFilter && plan_pattern_matches(exclude[i], name);
      used[i] = used[i] || hit;
      skip = skip || hit;
    }
    if (skip) {
      out.excluded.push_back(name);
    } else if (l->weight.size(0) % 16 != 0 || l->weight.size(1) % 16 != 0) {
      out.unfit.push_back(name);
    } else {
      l->set_fp8(true, scaling, history_length, fast_accumulation, grad_margin);
      out.converted.push_back(name);
    }
  }
  for (size_t i = 0; i < exclude.size(); ++i)
    if (!used[i]) out.unmatched.push_back(exclude[i]);
  return out;
}

}  // namespace fabric::nn
