// Tensor parallelism's slices in sharded checkpoints (fabric/checkpoint/sharded.h,
// piece_layout.h) without processes: pieces written as tp x dp ranks would, joined through their
// layout in C++ and in Python, and read at another tp size as runs of the stored order.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/types.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/piece_layout.h"
#include "fabric/checkpoint/sharded.h"
#include "tests/fabric/checkpoint/sharded_testing.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;
using Dict = c10::impl::GenericDict;

namespace {

using fabric::sharded_testing::join_error;
using fabric::sharded_testing::piece;
using fabric::sharded_testing::shards_of;

// Tensor parallelism's slices (a weight cut along `in`, q/k/v cut by heads in 3 blocks) written as
// tp 2 x dp 2 ranks would: each tp rank's slice one run in slices_layout's order, each dp rank a
// run of that. The pieces join into the whole tensors, in C++ and in Python from the files alone,
// and a layout that does not add up is an error naming the tensor.
TEST(ShardedSlicesTest, SlicesOfTensorParallelismJoinThroughTheirLayout) {
  const torch::Tensor row = torch::randn({3, 12}), qkv = torch::randn({12, 2});
  // Rank r's slice as fabric::nn::TensorParallelShard cuts it: its run of each of `parts` blocks.
  auto slice = [](const torch::Tensor& t, int64_t along, int64_t parts, int64_t r) {
    std::vector<torch::Tensor> runs;
    for (const auto& block : t.chunk(parts, along)) runs.push_back(block.chunk(2, along)[r]);
    return torch::cat(runs, along).contiguous();
  };
  const auto row_layout = fabric::slices_layout(row.sizes(), 1, 2, 2);
  const auto qkv_layout = fabric::slices_layout(qkv.sizes(), 0, 3, 2);
  ASSERT_TRUE(row_layout && qkv_layout);
  EXPECT_FALSE(fabric::slices_layout(row.sizes(), 0, 1, 2));  // rows: already runs
  EXPECT_FALSE(fabric::slices_layout(row.sizes(), 1, 2, 1));  // one rank
  for (int64_t r = 0; r < 2; ++r) {
    EXPECT_TRUE(fabric::to_layout_order(row, *row_layout)
                    .narrow(0, r * 18, 18)
                    .equal(slice(row, 1, 2, r).reshape(-1)));
    EXPECT_TRUE(fabric::to_layout_order(qkv, *qkv_layout)
                    .narrow(0, r * 12, 12)
                    .equal(slice(qkv, 0, 3, r).reshape(-1)));
  }
  std::vector<fabric::ShardedParts> parts;
  for (int64_t tp = 0; tp < 2; ++tp)
    for (int64_t dp = 0; dp < 2; ++dp) {
      Dict state = fabric::new_dict();
      for (const auto& [name, t, along, blocks, layout] :
           {std::make_tuple("row", row, 1, 2, row_layout),
            std::make_tuple("qkv", qkv, 0, 3, qkv_layout)}) {
        const torch::Tensor s = slice(t, along, blocks, tp).reshape(-1);
        const int64_t half = s.numel() / 2;
        state.insert(name, fabric::tensor_piece(t.sizes(), t.strides(), tp * s.numel() + dp * half,
                                                s.narrow(0, dp * half, half), layout));
      }
      Dict root = fabric::new_dict();
      root.insert("state", state);
      parts.push_back(fabric::split_pieces(root));
    }
  const auto joined = fabric::join_pieces(parts[0].common, shards_of(parts), "ckpt")
                          .toGenericDict()
                          .at("state")
                          .toGenericDict();
  EXPECT_TRUE(joined.at("row").toTensor().equal(row));
  EXPECT_TRUE(joined.at("qkv").toTensor().equal(qkv));

  // From the files alone: each piece into the flat memory, then the layout's view.
  std::string tmpl = (fs::path(::testing::TempDir()) / "layout_XXXXXX").string();
  const fs::path dir = mkdtemp(tmpl.data());
  std::vector<std::string> files = {fabric::kShardedCommon};
  fabric::save_archive(dir / fabric::kShardedCommon, parts[0].common);
  for (int64_t r = 0; r < 4; ++r) {
    files.push_back(fabric::shard_file_name(r, 4));
    fabric::save_archive(dir / files.back(), parts[r].shard);
  }
  fabric::write_manifest(dir, 4, files);
  fabric::verify_checkpoint(dir);
  EXPECT_TRUE(fabric::read_checkpoint(dir)
                  .toGenericDict()
                  .at("state")
                  .toGenericDict()
                  .at("row")
                  .toTensor()
                  .equal(row));
  // A reader asking for one rank's run of a tensor in a layout (tp rank 1, dp 0: elements 18 to
  // 27 in the layout's order) gets that piece, with the layout; the other tensor whole.
  fabric::ReadOptions own;
  own.rank = 2;
  own.world_size = 4;
  own.wanted =
      [](const std::string& path, at::IntArrayRef, at::IntArrayRef,
         const std::optional<fabric::PieceLayout>& layout) -> std::optional<fabric::PieceRange> {
    if (path != "state/row" || !layout) return std::nullopt;
    return fabric::PieceRange{18, 9, {}, std::nullopt};
  };
  const auto read = fabric::read_checkpoint(dir, own).toGenericDict().at("state").toGenericDict();
  const auto run = fabric::as_tensor_piece(read.at("row"));
  ASSERT_TRUE(run && run->layout);
  EXPECT_EQ(run->offset, 18);
  EXPECT_EQ(run->layout->permute, row_layout->permute);
  EXPECT_TRUE(run->values.equal(slice(row, 1, 2, 1).reshape(-1).narrow(0, 0, 9)));
  EXPECT_TRUE(read.at("qkv").toTensor().equal(qkv));
  const fs::path script = dir / "join.py";
  std::ofstream(script)
      << "import sys, os, math, torch\n"
         "d = sys.argv[1]\n"
         "desc = torch.load(os.path.join(d, 'common.pt'), weights_only=True)['state']['row']\n"
         "flat = torch.empty(math.prod(desc['shape']))\n"
         "for f in sorted(os.listdir(d)):\n"
         "    if f.startswith('shard-'):\n"
         "        p = torch.load(os.path.join(d, f), weights_only=True)['pieces']['state/row']\n"
         "        flat[p['offset']:p['offset'] + p['values'].numel()] = p['values']\n"
         "l = desc['layout']\n"
         "t = flat.view(l['shape']).permute(l['permute']).reshape(desc['shape'])\n"
         "print('%.6f' % t[1, 7].item())\n";
  const auto py = fabric::testing::run_command(fabric::testing::python_interpreter() + " " +
                                               script.string() + " " + dir.string());
  ASSERT_EQ(py.code, 0) << py.out;
  char value[32];
  std::snprintf(value, sizeof(value), "%.6f", row[1][7].item<float>());
  EXPECT_NE(py.out.find(value), std::string::npos) << py.out;

  // A reader cut another way (row over 3 ranks, qkv over 4; rank 0 of each) reads its slices out
  // of these tp 2 files as runs of their layouts (slice_runs): pieces, never the whole tensors,
  // and only the files that hold them (tp rank 0's two: the other two are damaged here, same
  // size, and never opened).
  auto cut = [](const torch::Tensor& t, int64_t along, int64_t parts, int64_t ranks, int64_t r) {
    std::vector<torch::Tensor> runs;
    for (const auto& block : t.chunk(parts, along)) runs.push_back(block.chunk(ranks, along)[r]);
    return torch::cat(runs, along).contiguous();
  };
  for (int64_t r = 2; r < 4; ++r) {
    const fs::path f = dir / fabric::shard_file_name(r, 4);
    const auto size = fs::file_size(f);
    std::ofstream(f, std::ios::binary | std::ios::trunc) << std::string(size, 'x');
  }
  fabric::ReadOptions other;
  other.world_size = 4;
  other.wanted =
      [](const std::string& path, at::IntArrayRef sizes, at::IntArrayRef,
         const std::optional<fabric::PieceLayout>& stored) -> std::optional<fabric::PieceRange> {
    const bool is_row = path == "state/row";
    const int64_t along = is_row ? 1 : 0, parts = is_row ? 2 : 3, ranks = is_row ? 3 : 4;
    const int64_t n = c10::multiply_integers(sizes) / ranks;
    auto runs = fabric::slice_runs(sizes, along, parts, ranks, 0, 0, n, stored);
    if (!runs) return std::nullopt;
    return fabric::PieceRange{0, n, *runs, fabric::slices_layout(sizes, along, parts, ranks)};
  };
  const auto mine = fabric::read_checkpoint(dir, other).toGenericDict().at("state").toGenericDict();
  const auto row_piece = fabric::as_tensor_piece(mine.at("row"));
  const auto qkv_piece = fabric::as_tensor_piece(mine.at("qkv"));
  ASSERT_TRUE(row_piece && qkv_piece);
  EXPECT_TRUE(row_piece->values.equal(cut(row, 1, 2, 3, 0).reshape(-1)));
  EXPECT_TRUE(qkv_piece->values.equal(cut(qkv, 0, 3, 4, 0).reshape(-1)));
  EXPECT_EQ(row_piece->layout, fabric::slices_layout(row.sizes(), 1, 2, 3));
  fs::remove_all(dir);

  // A layout whose permutation repeats a dimension.
  Dict bad = parts[0].common.toGenericDict();
  Dict state = bad.at("state").toGenericDict().copy();
  Dict descriptor = state.at("row").toGenericDict().copy();
  Dict layout = descriptor.at("layout").toGenericDict().copy();
  c10::impl::GenericList permute(c10::AnyType::get());
  for (int64_t d : {0, 0, 2, 3}) permute.push_back(d);
  layout.insert_or_assign("permute", permute);
  descriptor.insert_or_assign("layout", layout);
  state.insert_or_assign("row", descriptor);
  Dict root = fabric::new_dict();
  root.insert("state", state);
  EXPECT_EQ(join_error(root, shards_of(parts)),
            "ckpt: sharded tensor 'state/row': its layout does not describe a tensor of 36 "
            "elements");
}

}  // namespace
