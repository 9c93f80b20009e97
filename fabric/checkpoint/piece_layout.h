// fabric::PieceLayout: the order in which the pieces of a split tensor index its elements, when
// that is not the tensor's own memory order (sharded.h; tensor parallelism's slices).
#ifndef FABRIC_CHECKPOINT_PIECE_LAYOUT_H_
#define FABRIC_CHECKPOINT_PIECE_LAYOUT_H_

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fabric {

// Where the elements of a split tensor lie in the memory its pieces index when that is not the
// order of its strides: the memory is a contiguous tensor of `shape` which, permuted by `permute`
// (dimension i of the view is dimension permute[i] of the memory) and reshaped, is the tensor.
// Tensor parallelism cuts a weight [out, in] along `in` into tp slices; as memory
// [tp, out, in / tp] (permute {1, 0, 2}) each rank's slice is one run, and fsdp's run of that
// slice a run inside it.
struct PieceLayout {
  std::vector<int64_t> shape;
  std::vector<int64_t> permute;
  bool operator==(const PieceLayout& other) const {
    return shape == other.shape && permute == other.permute;
  }
};
// The elements of `whole` in `layout`'s memory order (1-D).
torch::Tensor to_layout_order(const torch::Tensor& whole, const PieceLayout& layout);
// The contiguous tensor of `sizes` whose elements in `layout`'s memory order are `flat`.
torch::Tensor from_layout_order(const torch::Tensor& flat, const PieceLayout& layout,
                                at::IntArrayRef sizes);
// The layout in which the `ranks` slices of a tensor of `sizes` lie one after another in rank
// order, each slice in its own memory order: the tensor cut along `along` into `parts` equal
// blocks and each block into `ranks` equal runs, rank r's slice being its run of every block
// (tensor parallelism's cut, fabric::nn::TensorParallelShard). nullopt where that is the tensor's
// own memory order (a cut along the first dimension in one block, or one rank).
std::optional<PieceLayout> slices_layout(at::IntArrayRef sizes, int64_t along, int64_t parts,
                                         int64_t ranks);
// Where rank `rank`'s slice of a tensor of `sizes` cut as slices_layout cuts it (along `along`,
// `parts` blocks, `ranks` ranks) lies in `stored`'s order (nullopt: the tensor's own row-major
// order): runs {offset, count} of that order holding the slice's elements [first, first + count)
// (row-major over the slice's sizes), one after another in the slice's order, adjacent runs
// merged. A reader at one tp size reads its slice out of a checkpoint written at another with
// them. nullopt when the stored order's innermost dimension is not the tensor's (no such layout
// is written).
std::optional<std::vector<std::pair<int64_t, int64_t>>> slice_runs(
    at::IntArrayRef sizes, int64_t along, int64_t parts, int64_t ranks, int64_t rank, int64_t first,
    int64_t count, const std::optional<PieceLayout>& stored);
// Throws fabric::Error "WHAT: ..." unless `layout` describes a tensor of `numel` elements.
void check_layout(const PieceLayout& layout, int64_t numel, const std::string& what);

}  // namespace fabric

#endif  // FABRIC_CHECKPOINT_PIECE_LAYOUT_H_
