// Optimizer state (per-parameter buffers and parameter-group hyperparameters) as plain data in
// PyTorch's optimizer.state_dict() layout:
//   {"type": "Adam", "state": {0: {"step": 3, "exp_avg": T, "exp_avg_sq": T}, ...},
//    "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), ..., "params": [0, 1, ...]}, ...]}
// Parameters are numbered across groups in order, as in PyTorch. Supported: LibTorch's SGD, Adam,
// AdamW, RMSprop, Adagrad (other optimizers are refused with an error naming them).
#ifndef FABRIC_CHECKPOINT_OPTIMIZER_STATE_H_
#define FABRIC_CHECKPOINT_OPTIMIZER_STATE_H_

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <set>
#include <string>

namespace fabric {

// Throws fabric::Error for an unsupported optimizer type.
c10::IValue optimizer_state(const torch::optim::Optimizer& optimizer);

// Checks `state` against `optimizer` (type, groups, parameter counts, buffer shapes) and returns
// the function that applies it (buffers copied to each parameter's device). Nothing is changed
// before the returned function runs. Throws fabric::Error "SOURCE: <what differs>".
std::function<void()> prepare_optimizer_state(torch::optim::Optimizer& optimizer,
                                              const c10::IValue& state, const std::string& source);

// The parameter groups' `fields` (PyTorch's option names: "momentum", "weight_decay", "betas") as
// they are now; the returned function puts them back, e.g. after a load replaced them with a
// checkpoint's. Fields the optimizer's type lacks are skipped; those it has are added to `kept`
// when given. Throws fabric::Error for an unsupported optimizer type.
std::function<void()> keep_option_fields(torch::optim::Optimizer& optimizer,
                                         const std::set<std::string>& fields,
                                         std::set<std::string>* kept = nullptr);

}  // namespace fabric

#endif  // FABRIC_CHECKPOINT_OPTIMIZER_STATE_H_
