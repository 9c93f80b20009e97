#include "fabric/accelerators/device_info.h"

#include <dlfcn.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/CPUAllocator.h>

#include <filesystem>

#ifdef FABRIC_WITH_CUDA
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/nccl.h>
#endif

namespace fabric {
namespace {

std::string library_dir_of(const void* symbol) {
  Dl_info dl{};
  if (dladdr(symbol, &dl) == 0 || dl.dli_fname == nullptr) return "unknown";
  std::error_code ec;
  auto path = std::filesystem::canonical(dl.dli_fname, ec);
  return ec ? std::string(dl.dli_fname) : path.parent_path().string();
}

std::optional<std::string> cpu_capability_of(const std::string& config) {
  const std::string key = "CPU capability usage: ";
  auto pos = config.find(key);
  if (pos == std::string::npos) return std::nullopt;
  pos += key.size();
  return config.substr(pos, config.find('\n', pos) - pos);
}

#ifdef FABRIC_WITH_CUDA
void query_cuda_devices(RuntimeInfo& info) {
  // Through LibTorch (not cudart directly) so we link no CUDA library of our own.
  const int count = c10::cuda::device_count();  // 0, not an error, without a driver or device
  for (int i = 0; i < count; ++i) {
    const cudaDeviceProp& prop = *at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(i));
    CudaDeviceInfo d;
    d.index = i;
    d.name = prop.name;
    d.capability_major = prop.major;
    d.capability_minor = prop.minor;
    d.total_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    d.multiprocessor_count = prop.multiProcessorCount;
    d.supports_bf16 = prop.major >= 8;
    info.devices.push_back(std::move(d));
  }
  info.cuda_available = !info.devices.empty();
  // LibTorch packs the NCCL version it was built with as major << 32 | minor << 16 | patch.
  const uint64_t v = torch::cuda::nccl::version();
  info.nccl_version = std::to_string(v >> 32) + "." + std::to_string((v >> 16) & 0xffff) + "." +
                      std::to_string(v & 0xffff);
}
#endif

}  // namespace

std::string format_cudnn_version(long version) {
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

std::optional<double> peak_dense_tflops(const std::string& device_name,
                                        const std::string& precision) {
  const bool half = precision == "bf16-mixed" || precision == "bf16-true" ||
                    precision == "16-mixed" || precision == "16-true";
  if (!half && precision != "32-true") return std::nullopt;
  auto has = [&](const char* part) { return device_name.find(part) != std::string::npos; };
  struct Peak {
    double half, fp32;
  };
  std::optional<Peak> p;
  if (has("H100") && has("PCIe")) {
    p = Peak{756, 51};
  } else if (has("H100") || has("H200")) {
    p = Peak{989, 67};
  } else if (has("A100")) {
    p = Peak{312, 19.5};
  } else if (has("L40S")) {
    p = Peak{362, 91.6};
  } else if (has(" L4")) {
    p = Peak{121, 30.3};
  } else if (has(" A10") && !has("A100") && !has("A10G")) {
    p = Peak{125, 31.2};
  }
  if (!p) return std::nullopt;
  return half ? p->half : p->fp32;
}

std::string format_cuda_version(long version) {
  return std::to_string(version / 1000) + "." + std::to_string(version / 10 % 100);
}

std::optional<std::string> build_setting(const std::string& show_config, const std::string& key) {
  const std::string needle = key + "=";
  size_t pos = 0;
  while ((pos = show_config.find(needle, pos)) != std::string::npos) {
    // Match whole keys only: the key starts the list or follows ", " / whitespace.
    if (pos == 0 || show_config[pos - 1] == ' ' || show_config[pos - 1] == '\t') {
      pos += needle.size();
      const size_t end = show_config.find_first_of(",\n", pos);
      return show_config.substr(pos, end == std::string::npos ? end : end - pos);
    }
    pos += needle.size();
  }
  return std::nullopt;
}

RuntimeInfo query_runtime_info() {
  RuntimeInfo info;
  const std::string config = at::show_config();
  info.libtorch_version = build_setting(config, "TORCH_VERSION").value_or("unknown");
  info.libtorch_commit = build_setting(config, "COMMIT_SHA").value_or("");
  info.cpu_capability = cpu_capability_of(config).value_or("unknown");
  info.libtorch_dir = library_dir_of(reinterpret_cast<const void*>(&c10::GetCPUAllocator));
  info.intra_op_threads = at::get_num_threads();
  info.inter_op_threads = at::get_num_interop_threads();

  const at::CUDAHooksInterface& hooks = at::detail::getCUDAHooks();
  info.libtorch_has_cuda = hooks.hasCUDART();
  if (info.libtorch_has_cuda) {
    info.cuda_runtime_version = format_cuda_version(hooks.versionCUDART());
    if (hooks.compiledWithCuDNN()) info.cudnn_version = format_cudnn_version(hooks.versionCuDNN());
  }
#ifdef FABRIC_WITH_CUDA
  if (info.libtorch_has_cuda) query_cuda_devices(info);
#endif
  return info;
}

}  // namespace fabric
