// Helpers shared by sharded.cc (writing) and sharded_read.cc (reading) of the sharded checkpoint
// format (sharded.h). Private to //fabric/checkpoint:sharded.
#ifndef FABRIC_CHECKPOINT_SHARDED_DETAIL_H_
#define FABRIC_CHECKPOINT_SHARDED_DETAIL_H_

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fabric/checkpoint/piece_layout.h"

namespace fabric::sharded_detail {

using Dict = c10::impl::GenericDict;

inline constexpr char kPieceKey[] = "fabric_tensor_piece";
inline constexpr char kDescriptorKey[] = "fabric_sharded_tensor";
inline constexpr char kFormat[] = "fabric-sharded-checkpoint";
// One save's token in common.pt's top dict and in each shard (split_pieces' save_id).
inline constexpr char kSaveIdKey[] = "fabric_save_id";

// A dict with string keys holding `key` (a piece or a descriptor).
bool is_marked(const c10::IValue& v, const char* key);
// A dict key as it appears in a PATH ('/' and '%' escaped), "?" for other types.
std::string key_text(const c10::IValue& key);
// `v` with every leaf `replace` returns a value for replaced (dicts, lists and tuples rebuilt
// only where something inside them changed); nullopt when nothing changed. `at`: v's PATH.
using Replace = std::function<std::optional<c10::IValue>(const c10::IValue&, const std::string&)>;
std::optional<c10::IValue> transform(const c10::IValue& v, const std::string& at,
                                     const Replace& replace);
c10::impl::GenericList int_list(at::IntArrayRef values);
// A list of ints; throws fabric::Error(what) otherwise.
std::vector<int64_t> ints_of(const c10::IValue& v, const std::string& what);
torch::ScalarType dtype_named(const std::string& name, const std::string& what);
// Elements a dense tensor of `sizes` and `strides` spans in memory; -1 when not dense.
int64_t dense_extent(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides);
std::string read_text(const std::filesystem::path& path);
Dict layout_dict(const PieceLayout& layout);
// A descriptor's "layout", if it has one; throws fabric::Error "WHAT: malformed layout ...".
std::optional<PieceLayout> layout_of(const Dict& d, const std::string& what);

}  // namespace fabric::sharded_detail

#endif  // FABRIC_CHECKPOINT_SHARDED_DETAIL_H_
