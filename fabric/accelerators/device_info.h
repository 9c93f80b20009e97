// fabric::RuntimeInfo: what the LibTorch loaded into this process can do on this machine
// (library version and location, CUDA devices, thread pools). Used by `bazel run //tools:env` and
// by the Connector to explain why a request (e.g. `accelerator: cuda`) cannot be met.
//
// Works on machines without a GPU and in --config=cpu_only builds (then `cuda_available` is false
// and `devices` is empty). Thread-safe; each call queries afresh.
//
// Example:
//   fabric::RuntimeInfo info = fabric::query_runtime_info();
//   if (!info.cuda_available) LOG(INFO) << "training on CPU with " << info.intra_op_threads << "
//   threads";
#ifndef FABRIC_ACCELERATORS_DEVICE_INFO_H_
#define FABRIC_ACCELERATORS_DEVICE_INFO_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fabric {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;          // e.g. "NVIDIA H100 80GB HBM3".
  int capability_major = 0;  // compute capability, e.g. 9.0 → 9, 0.
  int capability_minor = 0;
  int64_t total_memory_bytes = 0;
  int multiprocessor_count = 0;
  bool supports_bf16 = false;  // native bf16 math (capability ≥ 8.0).
};

struct RuntimeInfo {
  std::string libtorch_version;    // of the loaded library (its build settings), e.g. "2.11.0".
  std::string libtorch_commit;     // git commit of the PyTorch build, when it reports one.
  std::string libtorch_dir;        // folder of the loaded libc10.so.
  std::string cpu_capability;      // kernels LibTorch dispatches to, e.g. "AVX512".
  bool libtorch_has_cuda = false;  // the loaded LibTorch's CUDA part is present and registered.
  bool cuda_available = false;     // at least one CUDA device is usable.
  std::optional<std::string> cuda_runtime_version;  // e.g. "13.0".
  std::optional<std::string> cudnn_version;         // e.g. "9.19.0".
  std::optional<std::string> nccl_version;  // e.g. "2.28.9" (needs a FABRIC_WITH_CUDA build).
  std::vector<CudaDeviceInfo> devices;
  int intra_op_threads = 0;  // at::get_num_threads().
  int inter_op_threads = 0;  // at::get_num_interop_threads().
};

RuntimeInfo query_runtime_info();

// "9.19.0" from cuDNN's integer version (9 * 10000 + 19 * 100 + 0 since cuDNN 9).
// The dense peak in TFLOP/s of one CUDA device named `device_name` (CudaDeviceInfo::name) for
// matmuls at `precision` (bf16-mixed, bf16-true, 16-mixed, 16-true: 16-bit tensor cores; 32-true:
// float32 without TF32), from the vendors' data sheets: H100 SXM and H200 989 (16-bit) / 67
// (float32), H100 PCIe 756 / 51, A100 312 / 19.5, L40S 362 / 91.6, L4 121 / 30.3, A10 125 / 31.2.
// nullopt for other devices and precisions: MFU is then unknown (a config key may give the peak).
std::optional<double> peak_dense_tflops(const std::string& device_name,
                                        const std::string& precision);

std::string format_cudnn_version(long version);

// "13.0" from CUDA's integer runtime version (13 * 1000 + 0 * 10).
std::string format_cuda_version(long version);

// The value of `key` in at::show_config()'s "Build settings:" list ("key=value, ..."), if present.
std::optional<std::string> build_setting(const std::string& show_config, const std::string& key);

}  // namespace fabric

#endif  // FABRIC_ACCELERATORS_DEVICE_INFO_H_
