#include "fabric/checkpoint/piece_layout.h"

#include <algorithm>
#include <string>

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

std::optional<std::vector<std::pair<int64_t, int64_t>>> slice_runs(
    at::IntArrayRef sizes, int64_t along, int64_t parts, int64_t ranks, int64_t rank, int64_t first,
    int64_t count, const std::optional<PieceLayout>& stored) {
  const auto n = static_cast<int64_t>(sizes.size());
  std::vector<std::pair<int64_t, int64_t>> out;
  if (count <= 0) return out;
  if (n == 0 || along < 0 || along >= n || parts < 1 || ranks < 1 ||
      sizes[along] % (parts * ranks) != 0)
    throw Error("slice_runs: tensor of " + std::to_string(n) + " dimensions cut along " +
                std::to_string(along) + " into " + std::to_string(parts) + " x " +
                std::to_string(ranks));
  // The tensor's row-major index L walks `view` (the stored memory's dimensions in the tensor's
  // order) row-major; view dimension i steps `step[i]` in the stored order.
  std::vector<int64_t> view, step;
  if (stored) {
    view = permuted_shape(*stored);
    const auto memory = c10::contiguous_strides(stored->shape);
    for (int64_t d : stored->permute) step.push_back(memory[d]);
  } else {
    view = sizes.vec();
    const auto strides = c10::contiguous_strides(sizes);
    step.assign(strides.begin(), strides.end());
  }
  if (view.empty() || step.back() != 1) return std::nullopt;
  const int64_t innermost = std::max<int64_t>(view.back(), 1);
  auto position = [&](int64_t index) {
    int64_t pos = 0;
    for (auto i = static_cast<int64_t>(view.size()) - 1; i >= 0; --i) {
      pos += (index % view[i]) * step[i];
      index /= view[i];
    }
    return pos;
  };
  // Elements [index, index + length) of the tensor's row-major order, as stored runs.
  auto emit = [&](int64_t index, int64_t length) {
    while (length > 0) {
      const int64_t segment = std::min(length, innermost - index % innermost);
      const int64_t pos = position(index);
      if (!out.empty() && out.back().first + out.back().second == pos)
        out.back().second += segment;
      else
        out.emplace_back(pos, segment);
      index += segment;
      length -= segment;
    }
  };
  std::vector<int64_t> slice = sizes.vec();
  slice[along] /= ranks;
  const int64_t run = sizes[along] / (parts * ranks), block = sizes[along] / parts;
  auto whole_along = [&](int64_t k) { return (k / run) * block + rank * run + k % run; };
  const auto whole_strides = c10::contiguous_strides(sizes);
  const int64_t line = std::max<int64_t>(slice.back(), 1);
  for (int64_t e = first; e < first + count;) {
    const int64_t within = e % line, length = std::min(line - within, first + count - e);
    int64_t start = 0, rest = e / line;  // the tensor's index of the slice line's first element
    for (int64_t i = n - 2; i >= 0; --i) {
      int64_t c = rest % slice[i];
      rest /= slice[i];
      if (i == along) c = whole_along(c);
      start += c * whole_strides[i];
    }
    if (along == n - 1) {  // the line crosses the cut: runs of `run` apart
      for (int64_t k = within; k < within + length;) {
        const int64_t segment = std::min(within + length - k, run - k % run);
        emit(start + whole_along(k), segment);
        k += segment;
      }
    } else {
      emit(start + within, length);
    }
    e += length;
  }
  return out;
}

}  // namespace fabric
