// fabric/checkpoint/sharded.h without processes: dicts holding pieces of tensors (contiguous and
// not) split as ranks would write them and joined back, the errors of pieces that do not add up,
// and the folder read by read_checkpoint and by Python.
#include "fabric/checkpoint/sharded.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fabric/checkpoint/archive.h"
#include "fabric/core/error.h"
#include "tests/checkpoint_diff.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;
using Dict = c10::impl::GenericDict;

namespace {

// `t`'s memory elements [begin, end) as a piece.
c10::IValue piece(const torch::Tensor& t, int64_t begin, int64_t end) {
  const int64_t n = t.numel();
  torch::Tensor flat = t.as_strided({n}, {1}, t.storage_offset());
  begin = std::min(begin, n);
  end = std::min(end, n);
  return fabric::tensor_piece(t.sizes(), t.strides(), begin < end ? begin : 0,
                              begin < end ? flat.narrow(0, begin, end - begin)
                                          : torch::empty({0}, t.options()));
}

struct Model {
  torch::Tensor a = torch::randn({5, 3});
  torch::Tensor b = torch::randn({6, 4}, torch::kDouble).t();  // strides {1, 4}
  torch::Tensor c = torch::arange(7, torch::kLong);
  torch::Tensor replicated = torch::randn({2});

  // What rank `r` of `world` puts in its checkpoint dict: a third of every split tensor.
  c10::IValue dict(int64_t r, int64_t world, bool with_pieces) const {
    Dict state = fabric::new_dict();
    auto part = [&](const torch::Tensor& t) {
      const int64_t s = (t.numel() + world - 1) / world;
      return with_pieces ? piece(t, r * s, (r + 1) * s) : c10::IValue(t);
    };
    state.insert("a", part(a));
    c10::impl::GenericList list(c10::AnyType::get());
    list.push_back(part(b));
    list.push_back(std::string("text"));
    state.insert("list/with slash", list);
    Dict by_int(c10::IntType::get(), c10::AnyType::get());
    by_int.insert(int64_t{3}, part(c));
    state.insert("by_int", by_int);
    state.insert("replicated", replicated);
    Dict root = fabric::new_dict();
    root.insert("state", state);
    return root;
  }
};

std::vector<fabric::ShardedParts> split(const Model& m, int64_t world) {
  std::vector<fabric::ShardedParts> parts;
  for (int64_t r = 0; r < world; ++r) parts.push_back(fabric::split_pieces(m.dict(r, world, true)));
  return parts;
}

std::vector<c10::IValue> shards_of(const std::vector<fabric::ShardedParts>& parts) {
  std::vector<c10::IValue> out;
  for (const auto& p : parts) out.push_back(p.shard);
  return out;
}

std::string join_error(const c10::IValue& common, const std::vector<c10::IValue>& shards) {
  try {
    fabric::join_pieces(common, shards, "ckpt");
  } catch (const fabric::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ShardedTest, PiecesJoinIntoTheWholeTensorsForAnyLayoutAndWorldSize) {
  const Model m;
  const c10::IValue whole = m.dict(0, 1, false);
  for (int64_t world : {1, 2, 3, 5}) {
    SCOPED_TRACE(std::to_string(world) + " ranks");
    const auto parts = split(m, world);
    const c10::IValue joined = fabric::join_pieces(parts[0].common, shards_of(parts), "ckpt");
    EXPECT_EQ(fabric::testing::first_difference(whole, joined, ""), "");
    // The transposed tensor keeps its layout.
    const auto b = joined.toGenericDict().at("state").toGenericDict().at("list/with slash");
    EXPECT_EQ(b.toList().get(0).toTensor().strides(), m.b.strides());
  }
  // The comparison can fail.
  Model other;
  EXPECT_NE(fabric::testing::first_difference(whole, other.dict(0, 1, false), ""), "");
}

TEST(ShardedTest, PiecesThatDoNotAddUpAreErrorsNamingTheTensorAndFile) {
  const Model m;
  auto parts = split(m, 3);
  auto shards = shards_of(parts);
  // Rank 2's file missing its pieces (an empty shard in its place).
  auto missing = shards;
  missing[2] = fabric::split_pieces(fabric::new_dict()).shard;
  EXPECT_EQ(join_error(parts[0].common, missing),
            "ckpt: sharded tensor 'state/a': the shards hold 10 of its 15 elements");
  // Rank 1's file given twice: elements held twice.
  auto twice = shards;
  twice[2] = shards[1];
  EXPECT_EQ(join_error(parts[0].common, twice),
            "ckpt: sharded tensor 'state/a': shard-00002-of-00003.pt holds elements from 5, "
            "which another shard holds too");
  // A piece the common part does not describe (another model's file).
  Dict extra = fabric::new_dict();
  extra.insert("stray", piece(torch::zeros({4}), 0, 4));
  auto stray = shards;
  stray.push_back(fabric::split_pieces(extra).shard);
  const std::string e = join_error(parts[0].common, stray);
  EXPECT_NE(e.find("holds a piece of 'stray', which common.pt does not describe"),
            std::string::npos)
      << e;
  // Keys with '/' and '%' are escaped in paths.
  EXPECT_TRUE(shards[0].toGenericDict().at("pieces").toGenericDict().contains(
      "state/list%2Fwith slash/0"));
}

TEST(ShardedTest, AFolderIsReadWholeByReadCheckpointAndByPython) {
  std::string tmpl = (fs::path(::testing::TempDir()) / "sharded_XXXXXX").string();
  const fs::path dir = mkdtemp(tmpl.data());
  const Model m;
  const auto parts = split(m, 2);
  fabric::save_archive(dir / fabric::kShardedCommon, parts[0].common);
  for (int64_t r = 0; r < 2; ++r)
    fabric::save_archive(dir / fabric::shard_file_name(r, 2), parts[r].shard);
  EXPECT_FALSE(fabric::is_sharded_checkpoint(dir));
  try {
    fabric::read_checkpoint(dir);
    ADD_FAILURE() << "read a folder without a manifest";
  } catch (const fabric::Error& e) {
    EXPECT_EQ(std::string(e.what()), dir.string() + ": incomplete sharded checkpoint (no "
                                                     "manifest.json: its save did not finish)");
  }
  fabric::write_manifest(dir, 2,
                         {fabric::kShardedCommon, fabric::shard_file_name(0, 2),
                          fabric::shard_file_name(1, 2)});
  EXPECT_TRUE(fabric::is_sharded_checkpoint(dir));
  EXPECT_EQ(fabric::testing::first_difference(m.dict(0, 1, false), fabric::read_checkpoint(dir), ""),
            "");

  // Python joins the contiguous tensor from the files alone.
  const fs::path script = dir / "join.py";
  std::ofstream(script)
      << "import sys, os, torch\n"
         "d = sys.argv[1]\n"
         "common = torch.load(os.path.join(d, 'common.pt'), weights_only=True)\n"
         "desc = common['state']['a']\n"
         "flat = torch.empty(desc['shape'][0] * desc['shape'][1])\n"
         "for f in sorted(os.listdir(d)):\n"
         "    if f.startswith('shard-'):\n"
         "        p = torch.load(os.path.join(d, f), weights_only=True)['pieces']['state/a']\n"
         "        flat[p['offset']:p['offset'] + p['values'].numel()] = p['values']\n"
         "print(desc['fabric_sharded_tensor'], '%.6f' % flat.view(desc['shape']).double().sum())\n";
  const auto r = fabric::testing::run_command(fabric::testing::python_interpreter() + " " +
                                              script.string() + " " + dir.string());
  ASSERT_EQ(r.code, 0) << r.out;
  char sum[32];
  std::snprintf(sum, sizeof(sum), "%.6f", m.a.to(torch::kDouble).sum().item<double>());
  EXPECT_NE(r.out.find(std::string("state/a ") + sum), std::string::npos) << r.out;

  // A shard cut short: named, with both sizes.
  const fs::path shard = dir / fabric::shard_file_name(1, 2);
  const auto bytes = fs::file_size(shard);
  fs::resize_file(shard, bytes - 1);
  try {
    fabric::read_checkpoint(dir);
    ADD_FAILURE() << "read a damaged folder";
  } catch (const fabric::Error& e) {
    EXPECT_EQ(std::string(e.what()), shard.string() + ": " + std::to_string(bytes - 1) +
                                         " bytes, the manifest says " + std::to_string(bytes) +
                                         " (damaged or replaced)");
  }
  fs::remove_all(dir);
}

}  // namespace
