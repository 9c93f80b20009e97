// A float8 Linear's input cast made by the kernel that writes the input (fp8.h: Fp8InputCast,
// fp8_input_from, fp8_stand_in; fp8_layers.h: produced_forward).
#include <torch/autograd.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/nn/fp8.h"
#include "fabric/nn/fp8_gemm.h"

namespace fabric::nn {

namespace detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y's stand-in (fp8_stand_in): a tensor of y's sizes over one zero (zero strides, no view of
// anything autograd tracks), whose gradient goes to y unchanged.
struct StandIn : torch::autograd::Function<StandIn> {
  static torch::Tensor forward(AutogradContext* /*ctx*/, const torch::Tensor& y) {
    const torch::Tensor zero = torch::zeros({1}, y.options());
    const std::vector<int64_t> strides(static_cast<size_t>(y.dim()), 0);
    return torch::empty({0}, y.options()).set_(zero.storage(), 0, y.sizes(), strides);
  }
  static variable_list backward(AutogradContext* /*ctx*/, variable_list grads) { return grads; }
};

}  // namespace

std::optional<Fp8InputCast> input_cast_for(Fp8Scaling scaling, Fp8History* history,
                                           const torch::Tensor& like, const torch::Tensor& weight) {
  if (scaling == Fp8Scaling::kRowwise || (scaling == Fp8Scaling::kDelayed && history == nullptr) ||
      like.dim() < 1 || weight.dim() != 2 || like.size(-1) != weight.size(1))
    return std::nullopt;
  const int64_t k = weight.size(1), m = like.numel() / k;
  if (!fits(m, k, weight.size(0))) return std::nullopt;
  if (scaling == Fp8Scaling::kTensorwise) {
    Fp8InputCast cast;
    cast.amax = torch::zeros({}, like.options().dtype(torch::kFloat));
    return cast;
  }
  const auto [amax, seeded] = history_inputs(scaling, history, like);
  if (!seeded.data_ptr<bool>()[0]) return std::nullopt;  // the seeding pass casts for itself
  Fp8InputCast cast;
  cast.history = amax.select(0, 0);
  // Recorded whenever the pass may train; finish_input_cast clears the record when it did not.
  cast.record = torch::GradMode::is_enabled();
  cast.q = torch::empty({m, k}, like.options().dtype(torch::kFloat8_e4m3fn));
  cast.inverse = torch::empty({}, like.options().dtype(torch::kFloat));
  return cast;
}

Fp8Input finish_input_cast(const Fp8InputCast& cast, bool trains) {
  if (!cast.q.defined()) return {{}, {}, {}, cast.amax};  // tensorwise
  if (cast.record) {
    if (trains)
      push_history(cast.history);
    else
      cast.history.select(0, cast.history.size(0) - 1).zero_();
  }
  return {cast.q, transposed(cast.q), cast.inverse};
}

}  // namespace detail

torch::Tensor fp8_stand_in(const torch::Tensor& y) { return detail::StandIn::apply(y); }

namespace {

// slot (one float32) = max(slot, y's largest magnitude): a record's atomic maximum, as the
// layer's own cast takes it.
void take_amax(const torch::Tensor& slot, const torch::Tensor& y) {
  slot.copy_(torch::maximum(slot, y.abs().amax().to(torch::kFloat)));
}

// y's cast into `cast` (fp8_input_from's, without gradients).
void take_cast(const torch::Tensor& y, Fp8InputCast& cast) {
  const torch::Tensor y2 = y.detach().reshape({-1, y.size(-1)}).contiguous();
  if (!cast.q.defined() || y2.sizes() != cast.q.sizes())
    throw Error("fp8_input_from: the output " + c10::str(y.sizes()) +
                " is not of the cast's size " +
                (cast.q.defined() ? c10::str(cast.q.sizes()) : std::string("(none)")));
  // The layer's own delayed cast of y, its record taken here (the push is the layer's).
  const detail::Delayed d{cast.history, /*seed=*/false, /*record=*/false, /*margin=*/0};
  const detail::Quantized qy =
      detail::quantize(y2, torch::kFloat8_e4m3fn, detail::kE4m3Max, false, &d);
  cast.q.copy_(qy.q);
  cast.inverse.copy_(qy.rows_inverse);
  if (cast.record) take_amax(cast.history.select(0, cast.history.size(0) - 1), y2);
}

}  // namespace

torch::Tensor fp8_input_from(const torch::Tensor& y, Fp8InputCast& cast) {
  if (!cast.q.defined()) {  // tensorwise: y's amax (as the layer's own cast takes it), y itself
    if (!cast.amax.defined() || cast.amax.numel() != 1)
      throw Error("fp8_input_from: a cast with neither q nor amax");
    const torch::NoGradGuard no_grad;
    take_amax(cast.amax, y.detach());
    cast.taken = true;
    return y;
  }
  {
    const torch::NoGradGuard no_grad;
    take_cast(y, cast);
  }
  cast.taken = true;
  return fp8_stand_in(y);  // (with gradients as the caller has them)
}

}  // namespace fabric::nn
