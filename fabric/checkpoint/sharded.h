// Sharded checkpoints (checkpoint.format: sharded, docs/checkpoints.md): every rank writes the part
// of the state it holds, in parallel, and nothing is gathered. The checkpoint is a folder named
// like a checkpoint file (step-00000120.ckpt/) holding
//   common.pt                  global rank 0: the checkpoint's dict (format.h) with every
//                              tensor the ranks split replaced by its descriptor
//                              {"fabric_sharded_tensor": PATH, "shape": [...], "strides": [...],
//                               "dtype": "Float"} and, for a tensor whose pieces are not runs
//                              of its memory order, "layout": {"shape": [...], "permute": [...]}
//   shard-RRRRR-of-NNNNN.pt    rank R: {"pieces": {PATH: {"offset": E, "values": 1-D tensor}}}
//   manifest.json              written last, by global rank 0 once every rank's file is complete:
//                              {"format": "fabric-sharded-checkpoint", "version": 2,
//                               "world_size": N, "files": {NAME: BYTES, ...}}
// A piece holds elements [E, E + values.numel()) of the whole tensor's memory, in the order its
// strides give (for contiguous strides: the flattened tensor), or in the order its layout gives
// (PieceLayout); the pieces of all ranks cover every element exactly once. Version 2 added the
// layout; version 1 folders read as before. PATH names the tensor's place in the dict: the keys
// from the root joined by '/' ('%' and '/' inside a key written %25 and %2F), e.g.
// "state/model/fc.weight". Every file is a torch.save archive (Python: torch.load(path,
// weights_only=True)). The pieces do not depend on the world size that wrote them: reading joins
// them into the whole dict, which loads at any world size and under any strategy. A folder without
// manifest.json is a save that did not finish and is never read.
#ifndef FABRIC_CHECKPOINT_SHARDED_H_
#define FABRIC_CHECKPOINT_SHARDED_H_

#include <ATen/core/ivalue.h>
#include <torch/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fabric/checkpoint/piece_layout.h"

namespace fabric {

inline constexpr char kShardedManifest[] = "manifest.json";
inline constexpr char kShardedCommon[] = "common.pt";

// "shard-00001-of-00004.pt".
std::string shard_file_name(int64_t rank, int64_t world_size);

// This rank's piece of a tensor split over the ranks: elements [offset, offset + values.numel())
// of a tensor of `sizes` and `strides` (dense), in memory order (or `layout`'s: then `strides`
// are contiguous); `values` may be empty (this rank holds none of it). It stands in place of the
// tensor in a checkpoint's dict (Strategy::local_module_state, local_optimizer_state) until
// split_pieces takes it out.
c10::IValue tensor_piece(at::IntArrayRef sizes, at::IntArrayRef strides, int64_t offset,
                         const torch::Tensor& values,
                         const std::optional<PieceLayout>& layout = std::nullopt);

// A checkpoint's dict holding pieces, split into what this rank writes.
struct ShardedParts {
  c10::IValue common;  // the dict, each piece replaced by its descriptor (rank 0 writes it)
  c10::IValue shard;   // {"pieces": {PATH: {"offset", "values"}}}: this rank's non-empty pieces
};
// `save_id` (non-empty): one save's token, written into both so that a reader refuses a folder
// whose files come from different saves.
ShardedParts split_pieces(const c10::IValue& contents, const std::string& save_id = "");

// The elements [offset, offset + count) of a split tensor's memory that one process needs.
// With `from`, they lie elsewhere in the stored order (a reader at another tp size than the
// writer): the piece's values are those runs {offset, count} of the stored order one after
// another (counts summing to `count`), and it is presented as [offset, offset + count) of
// `layout`'s order (the reader's own).
struct PieceRange {
  int64_t offset = 0;
  int64_t count = 0;
  std::vector<std::pair<int64_t, int64_t>> from;
  std::optional<PieceLayout> layout;
};
// For the split tensor at PATH (its descriptor's shape, strides and layout): the elements the
// reader needs as a piece (counted in the layout's order when there is one), or nullopt for the
// whole tensor.
using WantedPieces = std::function<std::optional<PieceRange>(
    const std::string& path, at::IntArrayRef sizes, at::IntArrayRef strides,
    const std::optional<PieceLayout>& layout)>;

// A piece (tensor_piece, or one read_checkpoint made for WantedPieces), or nullopt for anything
// else.
struct TensorPiece {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t offset = 0;
  torch::Tensor values;  // 1-D
  std::optional<PieceLayout> layout;
};
std::optional<TensorPiece> as_tensor_piece(const c10::IValue& value);

// PATH of the tensor at `keys` (from the root): the keys escaped and joined by '/'.
std::string sharded_path(const std::vector<std::string>& keys);

// The whole dict from the common dict and every rank's shard dict. Throws fabric::Error
// "SOURCE: ..." when an element is missing or held twice, a piece has no descriptor, or a dtype
// or size disagrees.
c10::IValue join_pieces(const c10::IValue& common, const std::vector<c10::IValue>& shards,
                        const std::string& source);

// Writes `dir`/manifest.json (crash-safe) listing `files` (names inside `dir`) with their sizes.
// Throws fabric::Error "cannot write ...".
void write_manifest(const std::filesystem::path& dir, int64_t world_size,
                    const std::vector<std::string>& files);

// Whether `path` is a folder holding manifest.json.
bool is_sharded_checkpoint(const std::filesystem::path& path);

// How read_checkpoint reads a sharded folder. `wanted` null: every split tensor whole (the
// joined dict). Otherwise each split tensor `wanted` names comes as a piece holding just those
// elements, so that a process reads and holds only its own part of the state; the reader at
// `rank` of `world_size` starts with the shard files most likely to hold them and stops reading
// once every piece is complete and no tensor is needed whole.
struct ReadOptions {
  WantedPieces wanted;
  int64_t rank = 0;
  int64_t world_size = 1;
  // Called with common.pt's dict before `wanted` is asked about any tensor (a pipeline stage's
  // reader learns the saved parameter names there: pipeline_state.h).
  std::function<void(const c10::IValue& common)> on_common;
};

// The dict of a checkpoint at `path`: a file (load_archive; `options` do not apply) or a sharded
// folder (the manifest read, every file checked against its size, each file read checked against
// its CRCs, the pieces joined). Throws fabric::Error naming the file at fault (a folder without
// manifest.json: "incomplete").
c10::IValue read_checkpoint(const std::filesystem::path& path, const ReadOptions& options = {});

// Checks every byte of the checkpoint at `path` as read_checkpoint would read it (each file's
// records against their CRCs, and for a folder every file's size and that the pieces cover every
// split tensor exactly once), streaming: no tensor is held in memory. Throws as read_checkpoint.
// Returns what was checked with tensors that have no memory (a folder's: common.pt's tree).
c10::IValue verify_checkpoint(const std::filesystem::path& path);

}  // namespace fabric

#endif  // FABRIC_CHECKPOINT_SHARDED_H_
