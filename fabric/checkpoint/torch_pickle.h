// Reads the state dicts torch.save writes (and save_state_dict) without running any code: a small
// pickle interpreter that knows only what a state dict contains (dicts, OrderedDict, tuples,
// lists, strings, numbers, tensors via torch._utils._rebuild_tensor_v2 / _rebuild_parameter and
// storages via persistent ids). Any other global is refused with an error naming it.
#ifndef FABRIC_CHECKPOINT_TORCH_PICKLE_H_
#define FABRIC_CHECKPOINT_TORCH_PICKLE_H_

#include <torch/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace fabric::internal {

// `pickle`: the bytes of data.pkl; `record(key)` returns the raw bytes of storage `key`
// (archive/data/<key>). Returns the top-level dict's entries, in order. Throws std::runtime_error
// describing the first problem.
std::vector<std::pair<std::string, torch::Tensor>> read_state_dict_pickle(
    const std::string& pickle, const std::function<std::string(const std::string&)>& record);

}  // namespace fabric::internal

#endif  // FABRIC_CHECKPOINT_TORCH_PICKLE_H_
