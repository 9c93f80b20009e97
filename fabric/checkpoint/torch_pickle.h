// Reads the pickles torch.save writes (and save_archive) without running any code: a small pickle
// interpreter that knows only data (dicts, OrderedDict, tuples, lists, strings, numbers, bools,
// None, tensors via torch._utils._rebuild_tensor_v2 / _rebuild_parameter and storages via
// persistent ids). Any other global is refused with an error naming it.
#ifndef FABRIC_CHECKPOINT_TORCH_PICKLE_H_
#define FABRIC_CHECKPOINT_TORCH_PICKLE_H_

#include <ATen/core/ivalue.h>
#include <c10/core/Storage.h>

#include <functional>
#include <string>

namespace fabric::internal {

// `pickle`: the bytes of data.pkl; `record(key)` returns the raw bytes of storage `key`
// (archive/data/<key>) as a CPU byte storage, which the tensors then use without a copy. Returns
// the value: dicts (string or int keys) as GenericDict, lists as GenericList, tuples, strings,
// ints, doubles, bools, None, CPU tensors. Throws std::runtime_error describing the first problem
// (including nesting deeper than 64 levels). `metadata_only`: the storages hold no memory
// (check_archive); tensors are views of them.
c10::IValue read_pickle(const std::string& pickle,
                        const std::function<c10::Storage(const std::string&)>& record,
                        bool metadata_only = false);

}  // namespace fabric::internal

#endif  // FABRIC_CHECKPOINT_TORCH_PICKLE_H_
