// fabric/checkpoint/sharded.h without processes: dicts holding pieces of tensors (contiguous and
// not) split as ranks would write them and joined back, the errors of pieces that do not add up,
// and the folder read by read_checkpoint and by Python.
#include "fabric/checkpoint/sharded.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/types.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fabric/checkpoint/archive.h"
#include "fabric/core/error.h"
#include "tests/checkpoint_diff.h"
#include "tests/fabric/checkpoint/sharded_testing.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;
using Dict = c10::impl::GenericDict;

namespace {

using fabric::sharded_testing::join_error;
using fabric::sharded_testing::piece;
using fabric::sharded_testing::shards_of;

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
  EXPECT_TRUE(
      shards[0].toGenericDict().at("pieces").toGenericDict().contains("state/list%2Fwith slash/0"));
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
    EXPECT_EQ(std::string(e.what()), dir.string() +
                                         ": incomplete sharded checkpoint (no "
                                         "manifest.json: its save did not finish)");
  }
  fabric::write_manifest(
      dir, 2,
      {fabric::kShardedCommon, fabric::shard_file_name(0, 2), fabric::shard_file_name(1, 2)});
  EXPECT_TRUE(fabric::is_sharded_checkpoint(dir));
  EXPECT_EQ(
      fabric::testing::first_difference(m.dict(0, 1, false), fabric::read_checkpoint(dir), ""), "");

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

  // A file the manifest lists that the folder lost: not the checkpoint that was saved.
  {
    const fs::path manifest = dir / "manifest.json";
    std::ifstream in(manifest);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t files = text.find("\"files\": {");
    ASSERT_NE(files, std::string::npos) << text;
    std::string ghost = text;
    ghost.insert(files + 10, "\"extra.pt\": 12, ");
    std::ofstream(manifest, std::ios::trunc) << ghost;
    try {
      fabric::verify_checkpoint(dir);
      ADD_FAILURE() << "verified a folder that lost a file";
    } catch (const fabric::Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind((dir / "extra.pt").string() + ": cannot open (", 0), 0u)
          << e.what();
    }
    std::ofstream(manifest, std::ios::trunc) << text;
  }
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
  // Manifests folder_fuzzer wrote (before: std::out_of_range, or a loop over 10^15 names).
  const fs::path manifest = dir / "manifest.json";
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {R"({"format": "fabric-sharded-checkpoint", "version": 1, "world_size": 2})",
            "no files list"},
           {R"({"format": "fabric-sharded-checkpoint", "version": 1, "world_size": )"
            R"(999999999999999, "files": {}})",
            "world_size 999999999999999 is out of range"},
           {R"({"format": "fabric-sharded-checkpoint", "version": 1, "world_size": )"
            R"(99999999999999999999, "files": {}})",
            "world_size 99999999999999999999 is out of range"}}) {
    std::ofstream(manifest, std::ios::trunc) << text;
    try {
      fabric::read_checkpoint(dir);
      ADD_FAILURE() << "read " << text;
    } catch (const fabric::Error& e) {
      EXPECT_EQ(std::string(e.what()), manifest.string() + ": " + why);
    }
  }
  fs::remove_all(dir);
}

// A folder written by `world` ranks (Model's pieces), with its manifest.
fs::path write_folder(const Model& m, int64_t world, const std::string& name) {
  std::string tmpl = (fs::path(::testing::TempDir()) / (name + "_XXXXXX")).string();
  const fs::path dir = mkdtemp(tmpl.data());
  const auto parts = split(m, world);
  std::vector<std::string> files = {fabric::kShardedCommon};
  fabric::save_archive(dir / fabric::kShardedCommon, parts[0].common);
  for (int64_t r = 0; r < world; ++r) {
    files.push_back(fabric::shard_file_name(r, world));
    fabric::save_archive(dir / files.back(), parts[r].shard);
  }
  fabric::write_manifest(dir, world, files);
  return dir;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const fabric::Error& e) {
    return e.what();
  }
  return "";
}

// Every file of a save carries its token (split_pieces' save_id): the joined dict is the same
// without it, and a shard or common.pt of another save (the same size, so the manifest passes)
// is refused by a read and by verify_checkpoint, naming the file.
TEST(ShardedTest, FilesOfAnotherSaveAreRefused) {
  const Model m;
  std::string tmpl = (fs::path(::testing::TempDir()) / "saves_XXXXXX").string();
  const fs::path dir = mkdtemp(tmpl.data());
  auto write = [&](const std::string& common_id, const std::string& shard1_id) {
    std::vector<std::string> files = {fabric::kShardedCommon};
    fabric::save_archive(dir / fabric::kShardedCommon,
                         fabric::split_pieces(m.dict(0, 2, true), common_id).common);
    for (int64_t r = 0; r < 2; ++r) {
      files.push_back(fabric::shard_file_name(r, 2));
      fabric::save_archive(
          dir / files.back(),
          fabric::split_pieces(m.dict(r, 2, true), r == 1 ? shard1_id : common_id).shard);
    }
    fabric::write_manifest(dir, 2, files);
  };
  write("1.aa", "1.aa");
  EXPECT_EQ(
      fabric::testing::first_difference(m.dict(0, 1, false), fabric::read_checkpoint(dir), ""), "");
  const std::string shard1 = (dir / fabric::shard_file_name(1, 2)).string();
  for (const auto& [common_id, shard1_id, why] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"1.aa", "2.bb", "(save 2.bb, common.pt's 1.aa)"},
           {"1.aa", "", "(save unmarked, common.pt's 1.aa)"}}) {
    write(common_id, shard1_id);
    const std::string expected = shard1 + ": written by another save than common.pt " + why +
                                 ": the folder mixes two checkpoints' files; resume from a "
                                 "complete one";
    EXPECT_EQ(error_of([&] { fabric::read_checkpoint(dir); }), expected);
    EXPECT_EQ(error_of([&] { fabric::verify_checkpoint(dir); }), expected);
  }
  fs::remove_all(dir);
}

// A reader of another world size asks for its own part of each split tensor (here: rank r of
// `world` keeps elements [r·S, (r+1)·S) of each, except the tensor at 'state/by_int/3', which it
// wants whole) and gets exactly those elements; at the same world size it reads only its own
// shard file (another one damaged in the middle does not stop it), while verify_checkpoint checks
// every byte of every file.
TEST(ShardedTest, AReaderGetsJustThePiecesItWantsFromShardsOfAnyWorldSize) {
  const Model m;
  const fs::path dir = write_folder(m, 3, "wanted");
  for (int64_t world : {1, 2, 3, 4}) {
    for (int64_t r = 0; r < world; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(world));
      fabric::ReadOptions options;
      options.rank = r;
      options.world_size = world;
      options.wanted =
          [&](const std::string& path, at::IntArrayRef sizes, at::IntArrayRef,
              const std::optional<fabric::PieceLayout>&) -> std::optional<fabric::PieceRange> {
        if (path == "state/by_int/3") return std::nullopt;
        int64_t n = 1;
        for (int64_t s : sizes) n *= s;
        const int64_t s = (n + world - 1) / world;
        const int64_t begin = std::min(n, r * s), end = std::min(n, (r + 1) * s);
        return fabric::PieceRange{begin, end - begin};
      };
      const c10::IValue read = fabric::read_checkpoint(dir, options);
      const Dict state = read.toGenericDict().at("state").toGenericDict();
      auto check = [&](const c10::IValue& v, const torch::Tensor& t) {
        const auto piece = fabric::as_tensor_piece(v);
        ASSERT_TRUE(piece.has_value());
        EXPECT_EQ(piece->sizes, t.sizes().vec());
        EXPECT_EQ(piece->strides, t.strides().vec());
        const int64_t n = t.numel(), s = (n + world - 1) / world;
        const int64_t begin = std::min(n, r * s), end = std::min(n, (r + 1) * s);
        EXPECT_EQ(piece->offset, begin);
        const torch::Tensor flat = t.as_strided({n}, {1}, 0);
        EXPECT_TRUE(torch::equal(piece->values, flat.narrow(0, begin, end - begin)));
      };
      check(state.at("a"), m.a);
      check(state.at("list/with slash").toList().get(0), m.b);
      EXPECT_TRUE(torch::equal(state.at("by_int").toGenericDict().at(int64_t{3}).toTensor(), m.c));
      EXPECT_TRUE(torch::equal(state.at("replicated").toTensor(), m.replicated));
    }
  }
  fabric::verify_checkpoint(dir);

  // Damage shard 1's values of 'a' (same size): rank 0 of 3 still reads its part from shard 0
  // alone; verify_checkpoint and a whole read name the damaged file.
  const fs::path shard = dir / fabric::shard_file_name(1, 3);
  {
    std::ifstream in(shard, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const torch::Tensor values = m.a.reshape(-1).narrow(0, 5, 5).contiguous();
    const size_t at =
        bytes.find(std::string(static_cast<const char*>(values.data_ptr()), 5 * sizeof(float)));
    ASSERT_NE(at, std::string::npos);
    bytes[at] = static_cast<char>(bytes[at] ^ 0x55);
    std::ofstream(shard, std::ios::binary) << bytes;
  }
  fabric::ReadOptions own;
  own.rank = 0;
  own.world_size = 3;
  own.wanted = [](const std::string&, at::IntArrayRef sizes, at::IntArrayRef,
                  const std::optional<fabric::PieceLayout>&) -> std::optional<fabric::PieceRange> {
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    return fabric::PieceRange{0, (n + 2) / 3};
  };
  EXPECT_EQ(error_of([&] { fabric::read_checkpoint(dir, own); }), "");
  const std::string verify = error_of([&] { fabric::verify_checkpoint(dir); });
  EXPECT_EQ(verify.rfind(shard.string() + ": ", 0), 0u) << verify;
  EXPECT_EQ(error_of([&] { fabric::read_checkpoint(dir); }), verify);
  fs::remove_all(dir);

  // Pieces that do not add up fail verification as they fail a whole read.
  Model other;
  const fs::path gap = write_folder(other, 3, "gap");
  fabric::save_archive(gap / fabric::shard_file_name(2, 3),
                       fabric::split_pieces(fabric::new_dict()).shard);
  fabric::write_manifest(gap, 3,
                         {fabric::kShardedCommon, fabric::shard_file_name(0, 3),
                          fabric::shard_file_name(1, 3), fabric::shard_file_name(2, 3)});
  EXPECT_EQ(error_of([&] { fabric::verify_checkpoint(gap); }),
            gap.string() + ": sharded tensor 'state/a': the shards hold 10 of its 15 elements");
  // ...and a reader wanting the missing elements is told which.
  own.rank = 2;
  own.wanted = [](const std::string& path, at::IntArrayRef, at::IntArrayRef,
                  const std::optional<fabric::PieceLayout>&) -> std::optional<fabric::PieceRange> {
    return path == "state/a" ? std::optional<fabric::PieceRange>({10, 5}) : std::nullopt;
  };
  EXPECT_EQ(
      error_of([&] { fabric::read_checkpoint(gap, own); }),
      gap.string() + ": sharded tensor 'state/a': the shards hold 0 of its 5 wanted elements");
  fs::remove_all(gap);
}

}  // namespace
