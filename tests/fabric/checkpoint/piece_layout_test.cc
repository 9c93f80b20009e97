// fabric/checkpoint/piece_layout.h: where a tensor-parallel rank's elements lie in the order a
// checkpoint written at another tp size stores them (slice_runs). Reading such a folder through
// them is sharded_test's SlicesOfTensorParallelismJoinThroughTheirLayout.
#include "fabric/checkpoint/piece_layout.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace {

// slice_runs against brute force: for tensors cut along each dimension, in 1 or 2 blocks, stored
// as 1 or 2 writers cut them and read as 1, 2 or 4 readers do, every rank's elements (and ranges
// of them) are at the places of the stored order that the runs name.
TEST(PieceLayoutTest, SliceRunsFindARanksElementsInAnotherCutsOrder) {
  const std::vector<int64_t> sizes = {4, 8, 8};
  const int64_t numel = 4 * 8 * 8;
  const torch::Tensor index = torch::arange(numel, torch::kLong).view(sizes);
  auto cut = [](const torch::Tensor& t, int64_t along, int64_t parts, int64_t ranks, int64_t r) {
    std::vector<torch::Tensor> runs;
    for (const auto& block : t.chunk(parts, along)) runs.push_back(block.chunk(ranks, along)[r]);
    return torch::cat(runs, along).contiguous().view(-1);
  };
  int checked = 0;
  for (int64_t along = 0; along < 3; ++along)
    for (int64_t parts : {1, 2})
      for (int64_t writers : {1, 2})
        for (int64_t readers : {1, 2, 4}) {
          if (sizes[along] % (parts * writers) != 0 || sizes[along] % (parts * readers) != 0)
            continue;
          const auto stored = fabric::slices_layout(sizes, along, parts, writers);
          const torch::Tensor order =
              stored ? fabric::to_layout_order(index, *stored) : index.view(-1);
          const torch::Tensor place = torch::empty_like(order);  // element -> stored place
          place.index_put_({order}, torch::arange(numel, torch::kLong));
          for (int64_t r = 0; r < readers; ++r) {
            const torch::Tensor mine = cut(index, along, parts, readers, r);
            for (const auto& [first, count] :
                 std::vector<std::pair<int64_t, int64_t>>{{0, mine.numel()}, {3, 11}}) {
              const auto runs =
                  fabric::slice_runs(sizes, along, parts, readers, r, first, count, stored);
              ASSERT_TRUE(runs);
              std::vector<int64_t> got;
              for (const auto& [offset, n] : *runs)
                for (int64_t i = 0; i < n; ++i) got.push_back(offset + i);
              const torch::Tensor want = place.index_select(0, mine.narrow(0, first, count));
              ASSERT_EQ(static_cast<int64_t>(got.size()), count);
              EXPECT_TRUE(torch::equal(torch::tensor(got), want))
                  << "along " << along << " parts " << parts << " writers " << writers
                  << " readers " << readers << " rank " << r << " first " << first;
              ++checked;
            }
          }
        }
  EXPECT_GT(checked, 40);
}

}  // namespace
