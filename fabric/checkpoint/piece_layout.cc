#include "fabric/checkpoint/piece_layout.h"

#include <algorithm>

#include "fabric/core/error.h"

namespace fabric {
namespace {

std::vector<int64_t> permuted_shape(const PieceLayout& layout) {
  std::vector<int64_t> out;
  for (int64_t d : layout.permute) out.push_back(layout.shape[d]);
  return out;
}

std::vector<int64_t> inverse(const std::vector<int64_t>& permute) {
  std::vector<int64_t> out(permute.size());
  for (size_t i = 0; i < permute.size(); ++i) out[permute[i]] = static_cast<int64_t>(i);
  return out;
}

}  // namespace

void check_layout(const PieceLayout& layout, int64_t numel, const std::string& what) {
  const size_t n = layout.shape.size();
  std::vector<bool> seen(n, false);
  bool ok = layout.permute.size() == n && n <= 64;
  int64_t count = 1;
  for (size_t i = 0; ok && i < n; ++i) {
    const int64_t d = layout.permute[i], size = layout.shape[i];
    ok = d >= 0 && d < static_cast<int64_t>(n) && !seen[d] && size >= 0 &&
         (size == 0 || count <= numel / std::max<int64_t>(size, 1));
    if (ok) seen[d] = true, count *= size;
  }
  if (!ok || count != numel)
    throw Error(what + ": its layout does not describe a tensor of " + std::to_string(numel) +
                " elements");
}

torch::Tensor to_layout_order(const torch::Tensor& whole, const PieceLayout& layout) {
  return whole.reshape(permuted_shape(layout)).permute(inverse(layout.permute)).reshape(-1);
}

torch::Tensor from_layout_order(const torch::Tensor& flat, const PieceLayout& layout,
                                at::IntArrayRef sizes) {
  return flat.reshape(layout.shape).permute(layout.permute).reshape(sizes).contiguous();
}

std::optional<PieceLayout> slices_layout(at::IntArrayRef sizes, int64_t along, int64_t parts,
                                         int64_t ranks) {
  // The tensor as [sizes before, parts, ranks, run, sizes after]; the memory as
  // [ranks, sizes before, parts, run, sizes after].
  const int64_t n = static_cast<int64_t>(sizes.size());
  PieceLayout layout;
  layout.shape.push_back(ranks);
  for (int64_t i = 0; i < along; ++i) layout.shape.push_back(sizes[i]);
  layout.shape.push_back(parts);
  layout.shape.push_back(sizes[along] / (parts * ranks));
  for (int64_t i = along + 1; i < n; ++i) layout.shape.push_back(sizes[i]);
  for (int64_t i = 0; i < along; ++i) layout.permute.push_back(i + 1);
  layout.permute.push_back(along + 1);  // parts
  layout.permute.push_back(0);          // ranks
  for (int64_t i = along + 2; i < n + 2; ++i) layout.permute.push_back(i);
  // Its own memory order when the memory's dimensions longer than 1 come in the tensor's order.
  int64_t last = -1;
  bool own = true;
  for (int64_t d : layout.permute) {
    if (layout.shape[d] == 1) continue;
    own = own && d > last;
    last = d;
  }
  if (own) return std::nullopt;
  return layout;
}

}  // namespace fabric
