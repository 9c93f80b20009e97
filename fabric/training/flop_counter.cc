#include "fabric/training/flop_counter.h"

// RecordFunction's layout differs with NDEBUG (a debug-only member); this file is compiled with
// NDEBUG so that it reads the structure as the LibTorch library built it (see BUILD.bazel).
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "fabric/core/error.h"

namespace fabric {
namespace {

std::atomic<FlopCounter*> g_counter{nullptr};
thread_local int t_depth = 0;  // counted operators open on this thread

enum class Kind {
  kNone,
  kMm,
  kAddmm,
  kBmm,
  kBaddbmm,
  kConv,
  kConvBackward,
  kAttention,
  kAttentionBackward
};

Kind kind_of(const char* name) {
  if (std::strncmp(name, "aten::", 6) != 0) return Kind::kNone;
  const char* op = name + 6;
  if (std::strcmp(op, "mm") == 0) return Kind::kMm;
  if (std::strcmp(op, "addmm") == 0) return Kind::kAddmm;
  if (std::strcmp(op, "bmm") == 0) return Kind::kBmm;
  if (std::strcmp(op, "baddbmm") == 0) return Kind::kBaddbmm;
  if (std::strcmp(op, "convolution") == 0) return Kind::kConv;
  if (std::strcmp(op, "convolution_backward") == 0) return Kind::kConvBackward;
  if (std::strcmp(op, "scaled_dot_product_attention") == 0) return Kind::kAttention;
  // The fused attention kernels' backward ops (the forward is counted at the composite op above,
  // whose implementation runs inside it); all take (grad_out, query, key, value, ...).
  static const char* const kAttentionBackward[] = {
      "_scaled_dot_product_flash_attention_backward",
      "_scaled_dot_product_flash_attention_for_cpu_backward",
      "_scaled_dot_product_efficient_attention_backward",
      "_scaled_dot_product_cudnn_attention_backward",
      "_scaled_dot_product_fused_attention_overrideable_backward",
      "_flash_attention_backward",
      "_efficient_attention_backward",
  };
  for (const char* b : kAttentionBackward)
    if (std::strcmp(op, b) == 0) return Kind::kAttentionBackward;
  return Kind::kNone;
}

double numel(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() ? static_cast<double>(v.toTensor().numel()) : 0;
}

// [.., m, k] x [.., k, n]: 2·m·k·n per leading index.
double matmul_flops(const c10::IValue& a, const c10::IValue& b) {
  if (!a.isTensor() || !b.isTensor()) return 0;
  const at::Tensor& x = a.toTensor();
  const at::Tensor& y = b.toTensor();
  if (x.dim() < 2 || y.dim() < 2) return 0;
  return 2.0 * static_cast<double>(x.numel()) * static_cast<double>(y.size(-1));
}

std::vector<int64_t> int_list(const c10::IValue& v) {
  return v.isIntList() ? v.toIntVector() : std::vector<int64_t>{};
}

// aten::convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
// groups): 2 · output elements · (weight elements / output channels) for a convolution; for a
// transposed one the input plays the output's part.
double conv_flops(const std::vector<c10::IValue>& in) {
  if (in.size() < 9 || !in[0].isTensor() || !in[1].isTensor()) return 0;
  const at::Tensor& x = in[0].toTensor();
  const at::Tensor& w = in[1].toTensor();
  if (w.dim() < 3 || x.dim() != w.dim()) return 0;
  const double per_output = static_cast<double>(w.numel()) / static_cast<double>(w.size(0));
  if (in[6].isBool() && in[6].toBool()) return 2.0 * static_cast<double>(x.numel()) * per_output;
  const auto stride = int_list(in[3]), padding = int_list(in[4]), dilation = int_list(in[5]);
  double out = static_cast<double>(x.size(0)) * static_cast<double>(w.size(0));
  for (int64_t d = 2; d < w.dim(); ++d) {
    const size_t i = static_cast<size_t>(d - 2);
    auto at = [&](const std::vector<int64_t>& v, int64_t fallback) {
      return v.empty() ? fallback : v[std::min(i, v.size() - 1)];
    };
    const int64_t size =
        (x.size(d) + 2 * at(padding, 0) - at(dilation, 1) * (w.size(d) - 1) - 1) / at(stride, 1) +
        1;
    out *= static_cast<double>(std::max<int64_t>(size, 0));
  }
  return 2.0 * out * per_output;
}

// aten::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
// transposed, output_padding, groups, output_mask).
double conv_backward_flops(const std::vector<c10::IValue>& in) {
  if (in.size() < 11 || !in[0].isTensor() || !in[1].isTensor() || !in[2].isTensor()) return 0;
  const at::Tensor& w = in[2].toTensor();
  if (w.dim() < 3) return 0;
  const bool transposed = in[7].isBool() && in[7].toBool();
  const double per_output = static_cast<double>(w.numel()) / static_cast<double>(w.size(0));
  const double forward = 2.0 * numel(transposed ? in[1] : in[0]) * per_output;
  double grads = 0;
  if (in[10].isBoolList()) {
    const auto mask = in[10].toBoolList();
    grads = (mask.size() > 0 && mask.get(0) ? 1 : 0) + (mask.size() > 1 && mask.get(1) ? 1 : 0);
  }
  return forward * grads;
}

// query [.., L, E], key [.., S, E], value [.., S, Ev]: QKᵀ and (softmax)·V.
double attention_flops(const c10::IValue& q, const c10::IValue& k, const c10::IValue& v) {
  if (!q.isTensor() || !k.isTensor() || !v.isTensor()) return 0;
  const at::Tensor& Q = q.toTensor();
  const at::Tensor& K = k.toTensor();
  const at::Tensor& V = v.toTensor();
  if (Q.dim() < 2 || K.dim() < 2 || V.dim() < 2) return 0;
  const double S = static_cast<double>(K.size(-2));
  return 2.0 * static_cast<double>(Q.numel()) * S +  // Q·Kᵀ
         2.0 * static_cast<double>(Q.numel() / Q.size(-1)) * S * static_cast<double>(V.size(-1));
}

double flops_of(Kind kind, const std::vector<c10::IValue>& in) {
  switch (kind) {
    case Kind::kMm:
    case Kind::kBmm:
      return in.size() >= 2 ? matmul_flops(in[0], in[1]) : 0;
    case Kind::kAddmm:
    case Kind::kBaddbmm:
      return in.size() >= 3 ? matmul_flops(in[1], in[2]) : 0;
    case Kind::kConv:
      return conv_flops(in);
    case Kind::kConvBackward:
      return conv_backward_flops(in);
    case Kind::kAttention:
      return in.size() >= 3 ? attention_flops(in[0], in[1], in[2]) : 0;
    case Kind::kAttentionBackward:
      return in.size() >= 4 ? 2.0 * attention_flops(in[1], in[2], in[3]) : 0;
    case Kind::kNone:
      return 0;
  }
  return 0;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  const Kind kind = kind_of(fn.name());
  if (kind == Kind::kNone) return nullptr;
  if (t_depth++ > 0) return nullptr;
  FlopCounter* counter = g_counter.load(std::memory_order_acquire);
  if (counter == nullptr) return nullptr;
  const auto inputs = fn.inputs();
  const std::vector<c10::IValue> in(inputs.begin(), inputs.end());
  const double flops = flops_of(kind, in);
  if (flops > 0) counter->add(fn.name(), flops);
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (kind_of(fn.name()) != Kind::kNone && t_depth > 0) --t_depth;
}

}  // namespace

FlopCounter::FlopCounter() {
  FlopCounter* expected = nullptr;
  if (!g_counter.compare_exchange_strong(expected, this))
    throw Error("FlopCounter: another FlopCounter is counting; one at a time per process");
  t_depth = 0;
  handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                           .needsInputs(true)
                                           .scopes({at::RecordScope::FUNCTION}));
}

FlopCounter::~FlopCounter() {
  at::removeCallback(handle_);
  g_counter.store(nullptr, std::memory_order_release);
}

void FlopCounter::add(const std::string& op, double flops) {
  const std::lock_guard<std::mutex> lock(mutex_);
  by_operator_[op] += flops;
  total_ += flops;
}

double FlopCounter::total() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return total_;
}

std::map<std::string, double> FlopCounter::by_operator() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return by_operator_;
}

}  // namespace fabric
