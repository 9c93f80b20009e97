#include "fabric/connector.h"

#include <string>
#include <vector>

#include "fabric/connector_steps.h"

namespace fabric {
namespace {

// fabric.precision against the accelerator: CPU fallbacks with a warning, GPU requirements.
PrecisionMode resolve_precision(const Config& c, const MachineFacts& m, c10::DeviceType accelerator,
                                std::vector<std::string>& warnings) {
  PrecisionMode p = parse_precision(c.get_string("fabric.precision"));
  if (accelerator == c10::DeviceType::CPU) {
    if (p == PrecisionMode::k16True) {
      throw c.error_at("fabric.precision",
                       "'16-true' is not supported on CPU (float16 CPU kernels are slow and "
                       "incomplete): use bf16-true or bf16-mixed, or run on cuda");
    }
    const std::string emulated = bf16_emulated_because(m);
    if (p == PrecisionMode::k16Mixed) {
      if (emulated.empty()) {
        warnings.push_back(c.origin("fabric.precision") +
                           ": fabric.precision: 16-mixed is not supported on CPU; using bf16-mixed "
                           "(this CPU computes bf16 natively: " +
                           m.cpu.bf16_flags + ")");
        p = PrecisionMode::kBf16Mixed;
      } else {
        warnings.push_back(c.origin("fabric.precision") +
                           ": fabric.precision: 16-mixed is not supported on CPU and bf16 would be "
                           "emulated (" +
                           emulated +
                           "; several times slower than float32); using 32-true. "
                           "fabric.precision=bf16-mixed forces bf16");
        p = PrecisionMode::k32True;
      }
    } else if ((p == PrecisionMode::kBf16Mixed || p == PrecisionMode::kBf16True ||
                p == PrecisionMode::kFp8Mixed) &&
               !emulated.empty()) {
      warnings.push_back(c.origin("fabric.precision") + ": fabric.precision: " + to_string(p) +
                         " is emulated on this CPU (" + emulated +
                         "): expect it several times slower than 32-true");
    }
    if (p == PrecisionMode::kFp8Mixed)
      warnings.push_back(c.origin("fabric.precision") +
                         ": fabric.precision: fp8-mixed on CPU runs its float8 GEMMs as "
                         "float32 GEMMs of the dequantized operands, about 5x slower than bf16 "
                         "at width 256 (1.0 ms per 256x256x256 GEMM on a 2-vCPU Xeon; "
                         "tools/bench/fp8_cpu_gemm.py): for checking numerics, not for speed");
  } else if (p == PrecisionMode::kFp8Mixed && !m.cuda_fp8_supported) {
    throw c.error_at("fabric.precision",
                     "'fp8-mixed' needs GPUs of compute capability >= 8.9 (Ada, Hopper or "
                     "newer) for float8 GEMMs: use bf16-mixed");
  } else if ((p == PrecisionMode::kBf16Mixed || p == PrecisionMode::kBf16True) &&
             !m.cuda_bf16_supported) {
    throw c.error_at("fabric.precision",
                     "'" + to_string(p) +
                         "' needs a GPU with bfloat16 support (compute capability "
                         ">= 8.0): use 16-mixed");
  }
  return p;
}

}  // namespace

namespace detail {

void resolve_precision_options(const Config& c, const MachineFacts& m, ResolvedSetup& s) {
  s.precision = resolve_precision(c, m, s.accelerator, s.warnings);
  const bool fp8 = s.precision == PrecisionMode::kFp8Mixed;
  auto no_effect = [&](const std::string& key) {
    s.warnings.push_back(c.origin(key) + ": " + key + ": has no effect under fabric.precision: " +
                         to_string(s.precision) + " (it configures fp8-mixed)");
  };
  s.fp8_exclude = comma_separated(c.get_string("fabric.fp8.exclude_modules"));
  if (!s.fp8_exclude.empty() && !fp8) no_effect("fabric.fp8.exclude_modules");
  const std::string recipe = c.get_string("fabric.fp8.recipe");
  s.fp8_rowwise = recipe == "rowwise";
  if (recipe != "tensorwise" && !fp8) no_effect("fabric.fp8.recipe");
  const int64_t history = c.get_int("fabric.fp8.amax_history");
  if (recipe == "delayed" && fp8) s.fp8_amax_history = history;
  if (recipe != "delayed" && c.origin("fabric.fp8.amax_history") != "default")
    s.warnings.push_back(c.origin("fabric.fp8.amax_history") +
                         ": fabric.fp8.amax_history: has no effect under fabric.fp8.recipe: " +
                         recipe + " (it configures delayed scaling)");
  s.fp8_grad_margin = c.get_int("fabric.fp8.grad_margin");
  if (recipe != "delayed" && c.origin("fabric.fp8.grad_margin") != "default")
    s.warnings.push_back(c.origin("fabric.fp8.grad_margin") +
                         ": fabric.fp8.grad_margin: has no effect under fabric.fp8.recipe: " +
                         recipe + " (it configures delayed scaling)");
  s.fp8_fast_accumulation = c.get_bool("fabric.fp8.fast_accumulation");
  if (!s.fp8_fast_accumulation && !fp8) no_effect("fabric.fp8.fast_accumulation");
  if (!s.fp8_rowwise || !fp8) return;
  if (s.accelerator != c10::DeviceType::CUDA)
    throw c.error_at("fabric.fp8.recipe",
                     "'rowwise' runs on CUDA GPUs only (LibTorch's CPU _scaled_mm takes one scale "
                     "per tensor): use tensorwise on a CPU");
  if (!m.cuda_fp8_rowwise_supported)
    throw c.error_at("fabric.fp8.recipe",
                     "'rowwise' needs GPUs of compute capability >= 9.0 (Hopper or newer): use "
                     "tensorwise");
}

}  // namespace detail
}  // namespace fabric
