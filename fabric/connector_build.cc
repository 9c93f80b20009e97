// What a resolved setup becomes (fabric/connector.h): the Strategy with its Precision, and the
// process-wide settings of steps 5 and 6. Kept apart from the resolution (connector.cc), which
// only reads the config and the machine facts.
#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include <cstdlib>
#include <mutex>

#include "fabric/accelerators/memory.h"
#include "fabric/connector.h"
#include "strategies/data_parallel.h"
#include "strategies/ddp.h"
#include "strategies/fsdp.h"
#include "strategies/model_parallel.h"
#include "strategies/single_device.h"

namespace fabric {

const char* strategy_name(StrategyKind kind) {
  switch (kind) {
    case StrategyKind::kDp:
      return "dp";
    case StrategyKind::kDdp:
      return "ddp";
    case StrategyKind::kFsdp:
      return "fsdp";
    case StrategyKind::kModelParallel:
      return "model_parallel";
    case StrategyKind::kSingleDevice:
      break;
  }
  return "single_device";
}

std::unique_ptr<Strategy> build_strategy(const ResolvedSetup& s) {
  auto precision = std::make_unique<Precision>(s.precision, s.accelerator, s.scaler);
  precision->set_fp8_exclude(s.fp8_exclude);
  precision->set_fp8_rowwise(s.fp8_rowwise);
  precision->set_fp8_amax_history(s.fp8_amax_history);
  precision->set_fp8_fast_accumulation(s.fp8_fast_accumulation);
  precision->set_fp8_grad_margin(s.fp8_grad_margin);
  switch (s.strategy) {
    case StrategyKind::kDp:
      return std::make_unique<strategies::DataParallel>(s.devices, std::move(precision));
    case StrategyKind::kDdp:
      return std::make_unique<strategies::Ddp>(
          s.environment, s.device, std::move(precision), s.ddp,
          std::vector<std::string>{});  // argv: /proc/self/cmdline
    case StrategyKind::kFsdp:
      return std::make_unique<strategies::Fsdp>(s.environment, s.device, std::move(precision),
                                                s.ddp, s.fsdp, std::vector<std::string>{});
    case StrategyKind::kModelParallel:
      return std::make_unique<strategies::ModelParallel>(
          s.environment, s.device, std::move(precision), s.ddp, s.fsdp, s.model_parallel,
          std::vector<std::string>{});
    case StrategyKind::kSingleDevice:
      break;
  }
  return std::make_unique<strategies::SingleDevice>(s.device, std::move(precision));
}

void apply_global_settings(const ResolvedSetup& s) {
  if (s.deterministic && s.accelerator == c10::DeviceType::CUDA) {
    // cuBLAS is deterministic only with a fixed workspace, and reads this variable when its first
    // handle is made; without it deterministic mode makes cuBLAS ops throw. Set before any CUDA
    // work and before self-launch, so children inherit it; a value the user set is kept.
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  }
  at::Context& ctx = at::globalContext();
  ctx.setDeterministicAlgorithms(s.deterministic, /*warn_only=*/false);
  ctx.setDeterministicCuDNN(s.deterministic);
  ctx.setBenchmarkCuDNN(s.cudnn_benchmark);
  ctx.setFloat32MatmulPrecision(s.matmul_precision);
  if (s.tensor_memory_limit_gb > 0)
    set_memory_limit(s.device, static_cast<int64_t>(s.tensor_memory_limit_gb * (1LL << 30)));
  if (s.num_threads > 0) {
    at::set_num_threads(static_cast<int>(s.num_threads));
    // The inter-op pool can be sized once, before it starts; a second Fabric in the process (or
    // a program that already used the pool) keeps the first size.
    static std::once_flag interop;
    std::call_once(interop, [&] {
      try {
        at::set_num_interop_threads(static_cast<int>(s.num_threads));
      } catch (const c10::Error&) {
      }
    });
  }
}

}  // namespace fabric
