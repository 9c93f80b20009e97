// The command-line tools with bad files: //tools:ckpt, //tools:prepare_text and
// //tools:estimate_memory never write over their input or a checkpoint, never wait on a FIFO,
// and end bad input with one line (issue 67: each case here once lost data, hung or printed a
// trace).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/types.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/safetensors.h"
#include "fabric/checkpoint/state_dict.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace fabric::testing {
namespace {

class FileToolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  // `tool` (a //tools target) with `args`, in dir_; a tool that waits more than 60 s fails.
  CommandResult tool(const std::string& name, const std::string& args) {
    return run_command("cd '" + dir_.string() + "' && timeout 60 '" +
                       fs::absolute(helper_binary("//tools:" + name)).string() + "' " + args);
  }
  static std::string bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // A checkpoint as Fabric::save lays it out: {"fabric": {...}, "state": {"model": {...},
  // "step": 3}}.
  // `config`: the run's recorded config ("" none); `saved_unix_time` >= 0: that field too.
  fs::path write_checkpoint(const std::string& name, const torch::Tensor& w,
                            const std::string& config = "", int64_t saved_unix_time = -1) {
    c10::impl::GenericDict model(c10::StringType::get(), c10::AnyType::get());
    model.insert("fc.weight", w);
    c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
    state.insert("model", model);
    state.insert("step", int64_t{3});
    c10::impl::GenericDict meta(c10::StringType::get(), c10::AnyType::get());
    meta.insert("format_version", int64_t{1});
    if (!config.empty()) meta.insert("config", config);
    if (saved_unix_time >= 0) meta.insert("saved_unix_time", saved_unix_time);
    c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
    top.insert("fabric", meta);
    top.insert("state", state);
    const fs::path p = dir_ / name;
    save_archive(p, top);
    return p;
  }
  fs::path dir_;
};

TEST_F(FileToolsTest, CkptConsolidateNeverWritesOverACheckpoint) {
  const fs::path ckpt = write_checkpoint("step-3.ckpt", torch::arange(6.0).reshape({2, 3}));
  const std::string before = bytes(ckpt);
  // Over itself, over another checkpoint's name, into a checkpoint folder, onto `latest`.
  fs::create_directories(dir_ / "sharded.ckpt");
  std::ofstream(dir_ / "latest") << "step-3.ckpt\n";
  for (const auto& [out, why] : std::vector<std::pair<std::string, std::string>>{
           {"step-3.ckpt", ": is the input " + ckpt.string() + " (the checkpoint read)"},
           {"other.ckpt", ": is a checkpoint's name (.ckpt)"},
           {"sharded.ckpt/w.pt", ": lies inside the checkpoint folder "},
           {"latest", ": is the marker naming the newest checkpoint of "}}) {
    CommandResult r = tool("ckpt", "consolidate step-3.ckpt " + out);
    EXPECT_EQ(r.code, 2) << out << ": " << r.out;
    EXPECT_NE(r.out.find("ckpt: " + (dir_ / out).string() + why), std::string::npos) << r.out;
  }
  // Never over a FIFO or device (renaming over /dev/null replaced the device node), nor over an
  // existing file that is not a weights file (a token folder's train.bin).
  ASSERT_EQ(::mkfifo((dir_ / "pipe").c_str(), 0600), 0);
  std::ofstream(dir_ / "train.bin") << "tokens";
  for (const auto& [out, why] : std::vector<std::pair<std::string, std::string>>{
           {"pipe", ": is a FIFO (named pipe), not a file; choose another OUT"},
           {"train.bin", ": is an existing file that is not a weights file"}}) {
    CommandResult r = tool("ckpt", "consolidate step-3.ckpt " + out);
    EXPECT_EQ(r.code, 2) << out << ": " << r.out;
    EXPECT_NE(r.out.find("ckpt: " + (dir_ / out).string() + why), std::string::npos) << r.out;
  }
  EXPECT_EQ(bytes(dir_ / "train.bin"), "tokens");
  EXPECT_EQ(fs::status(dir_ / "pipe").type(), fs::file_type::fifo);
  EXPECT_EQ(bytes(ckpt), before) << "the checkpoint was changed";
  EXPECT_EQ(bytes(dir_ / "latest"), "step-3.ckpt\n");

  // Allowed: a new weights file; it then verifies (safetensors too) and diffs against the
  // checkpoint's model entry as equal.
  CommandResult ok = tool("ckpt", "consolidate step-3.ckpt w.safetensors");
  ASSERT_EQ(ok.code, 0) << ok.out;
  CommandResult again = tool("ckpt", "consolidate step-3.ckpt w.safetensors");
  ASSERT_EQ(again.code, 0) << "an earlier weights file is replaced: " << again.out;
  CommandResult verify = tool("ckpt", "verify w.safetensors");
  EXPECT_EQ(verify.code, 0) << verify.out;
  EXPECT_NE(verify.out.find("a safetensors file, 1 tensors; its header and every byte range "
                            "checked, OK"),
            std::string::npos)
      << verify.out;
  CommandResult diff = tool("ckpt", "diff step-3.ckpt w.safetensors");
  EXPECT_EQ(diff.code, 0) << diff.out;
  EXPECT_NE(diff.out.find("comparing the weights file " + (dir_ / "w.safetensors").string() +
                          " with entry 'model' of " + ckpt.string()),
            std::string::npos)
      << diff.out;
  EXPECT_NE(diff.out.find("0 of 1 entries differ; largest tensor difference 0"), std::string::npos)
      << diff.out;

  // Never into what the run read (its recorded config's model.pretrained folder): the run's own
  // base weights were replaced by its checkpoint's (exit 0).
  fs::create_directories(dir_ / "base");
  fabric::save_safetensors(dir_ / "base" / "model.safetensors", {{"w", torch::ones({2})}});
  const std::string base_before = bytes(dir_ / "base" / "model.safetensors");
  // A time gmtime cannot express (inspect segfaulted on it): the number alone.
  write_checkpoint("tuned.ckpt", torch::ones({2, 2}),
                   "model:\n  pretrained: " + (dir_ / "base").string() + "\n", int64_t{1} << 62);
  // A fine-tuning run's checkpoint: ckpt hf says where its folder comes from.
  write_checkpoint("lora.ckpt", torch::ones({2, 2}), "finetune:\n  method: lora\n");
  CommandResult lora = tool("ckpt", "hf lora.ckpt lora_hf");
  EXPECT_NE(lora.code, 0) << lora.out;
  EXPECT_NE(lora.out.find("lora.ckpt: a checkpoint of examples:finetune, which ckpt hf does not "
                          "convert"),
            std::string::npos)
      << lora.out;
  CommandResult into = tool("ckpt", "consolidate tuned.ckpt base/model.safetensors");
  EXPECT_EQ(into.code, 2) << into.out;
  EXPECT_NE(into.out.find("base/model.safetensors: lies inside the input folder " +
                          (dir_ / "base").string() + " (the run's model.pretrained)"),
            std::string::npos)
      << into.out;
  EXPECT_EQ(bytes(dir_ / "base" / "model.safetensors"), base_before);
  // diff of a file with NaN against itself: nothing differs; int64 extremes do not wrap.
  fabric::save_safetensors(
      dir_ / "nan.safetensors",
      {{"w", torch::tensor({1.0, std::nan(""), static_cast<double>(INFINITY)})}});
  CommandResult self = tool("ckpt", "diff nan.safetensors nan.safetensors");
  EXPECT_NE(self.out.find("0 of 1 entries differ; largest tensor difference 0"), std::string::npos)
      << self.out;
  fabric::save_safetensors(dir_ / "max.safetensors",
                           {{"i", torch::tensor({std::numeric_limits<int64_t>::max()})}});
  fabric::save_safetensors(dir_ / "min.safetensors",
                           {{"i", torch::tensor({std::numeric_limits<int64_t>::min()})}});
  CommandResult extremes = tool("ckpt", "diff max.safetensors min.safetensors");
  EXPECT_NE(extremes.out.find("i  max |a - b| 1.84467e+19"), std::string::npos) << extremes.out;
  CommandResult inspect = tool("ckpt", "inspect tuned.ckpt");
  EXPECT_EQ(inspect.code, 0) << inspect.out;
  EXPECT_NE(inspect.out.find("saved_unix_time: 4611686018427387904\n"), std::string::npos)
      << inspect.out;
}

// Weights in every shape the tools meet: a .pt holding a bare tensor or a list (inspect printed
// "None", diff "0 of 1 entries differ"), a weights file consolidated without --entry (it needed
// --entry=weights), a Hugging Face folder (inspect said "incomplete sharded checkpoint"); and a
// flag the command does not read is refused, not ignored.
TEST_F(FileToolsTest, CkptReadsBareTensorsListsAndHuggingFaceFolders) {
  save_archive(dir_ / "bare.pt", torch::arange(6.0).reshape({2, 3}));
  save_archive(dir_ / "other.pt", torch::arange(6.0).reshape({2, 3}) * 2);
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(torch::ones({4}));
  list.push_back(torch::zeros({1}, torch::kInt64));
  save_archive(dir_ / "list.pt", list);
  CommandResult bare = tool("ckpt", "inspect bare.pt");
  EXPECT_EQ(bare.code, 0) << bare.out;
  EXPECT_NE(bare.out.find("weights  Float [2, 3]\nstate: 1 tensors, 6 elements"), std::string::npos)
      << bare.out;
  CommandResult listed = tool("ckpt", "inspect list.pt");
  EXPECT_NE(listed.out.find("weights.0  Float [4]\nweights.1  Long [1]\n"), std::string::npos)
      << listed.out;
  CommandResult differ = tool("ckpt", "diff bare.pt other.pt");
  EXPECT_NE(differ.out.find("1 of 1 entries differ; largest tensor difference 5 (weights)"),
            std::string::npos)
      << differ.out;

  // A Hugging Face folder: its weights (shards joined) for inspect, verify, diff, consolidate.
  fs::create_directories(dir_ / "hf");
  std::ofstream(dir_ / "hf" / "config.json") << "{\"model_type\": \"gpt2\"}\n";
  fabric::save_safetensors(dir_ / "hf" / "model.safetensors",
                           {{"lm_head.weight", torch::ones({3, 2})}});
  CommandResult hf = tool("ckpt", "inspect hf");
  EXPECT_EQ(hf.code, 0) << hf.out;
  EXPECT_NE(hf.out.find("weights.lm_head.weight  Float [3, 2]"), std::string::npos) << hf.out;
  CommandResult verify = tool("ckpt", "verify hf");
  EXPECT_EQ(verify.code, 0) << verify.out;
  EXPECT_NE(verify.out.find("a Hugging Face folder, 1 safetensors file(s), 1 tensors"),
            std::string::npos)
      << verify.out;
  CommandResult same = tool("ckpt", "diff hf hf/model.safetensors");
  EXPECT_NE(same.out.find("0 of 1 entries differ"), std::string::npos) << same.out;
  CommandResult joined = tool("ckpt", "consolidate hf joined.pt");
  EXPECT_EQ(joined.code, 0) << joined.out;
  CommandResult weights = tool("ckpt", "consolidate bare.pt bare.safetensors");
  EXPECT_EQ(weights.code, 1) << weights.out;  // a bare tensor is no state dict
  EXPECT_NE(weights.out.find("bare.pt (entry weights)"), std::string::npos) << weights.out;

  for (const auto& [command, why] : std::vector<std::pair<std::string, std::string>>{
           {"inspect bare.pt --entry=model",
            "--entry does not apply to inspect (it takes no "
            "flags)"},
           {"diff bare.pt other.pt --config=a.yaml", "--config does not apply to diff"},
           {"consolidate hf x.pt --max-shard-bytes=9",
            "--max-shard-bytes does not apply to "
            "consolidate"},
           {"frobnicate bare.pt", "unknown command 'frobnicate'"}}) {
    CommandResult r = tool("ckpt", command);
    EXPECT_EQ(r.code, 2) << command << ": " << r.out;
    EXPECT_NE(r.out.find("ckpt: " + why), std::string::npos) << command << ": " << r.out;
  }
  EXPECT_FALSE(fs::exists(dir_ / "x.pt"));
}

TEST_F(FileToolsTest, CkptRefusesAFifoAndAnOverflowingSafetensorsHeaderInOneLine) {
  const fs::path fifo = dir_ / "pipe.pt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string command : {"inspect pipe.pt", "verify pipe.pt", "diff pipe.pt pipe.pt",
                                    "consolidate pipe.pt out.pt"}) {
    CommandResult r = tool("ckpt", command);
    EXPECT_EQ(r.code, 1) << command << ": " << r.out;  // 124: it waited on the FIFO
    EXPECT_NE(r.out.find(fifo.string() + ": cannot open (a FIFO (named pipe), not a regular file)"),
              std::string::npos)
        << command << ": " << r.out;
  }
  // A header whose shape's byte size overflows 64 bits, claiming 0 bytes.
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})";
  std::string file(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  std::ofstream(dir_ / "big.safetensors", std::ios::binary) << file + header;
  for (const std::string command :
       {"diff big.safetensors big.safetensors",
        "consolidate big.safetensors big2.safetensors --entry=weights", "verify big.safetensors"}) {
    CommandResult r = tool("ckpt", command);
    EXPECT_EQ(r.code, 1) << command << ": " << r.out;
    EXPECT_NE(r.out.find("is too large: its size overflows 64 bits"), std::string::npos)
        << command << ": " << r.out;
    EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << command << ": " << r.out;
  }
  EXPECT_FALSE(fs::exists(dir_ / "big2.safetensors"));
}

TEST_F(FileToolsTest, PrepareTextNeverWritesIntoItsInput) {
  fs::create_directories(dir_ / "corpus");
  std::ofstream(dir_ / "corpus" / "a.txt") << std::string(400, 'a');
  // nanoGPT's layout: the text and the token files side by side is fine.
  CommandResult first = tool("prepare_text", "--input=corpus/a.txt --output=corpus");
  ASSERT_EQ(first.code, 0) << first.out;
  // Then the folder as input with the output inside it: the second run would tokenize
  // train.bin and val.bin as text (validation leaking into training).
  const std::string train = bytes(dir_ / "corpus" / "train.bin");
  for (const std::string out : {"corpus", "corpus/tokens"}) {
    CommandResult again = tool("prepare_text", "--input=corpus --output=" + out);
    EXPECT_EQ(again.code, 2) << again.out;
    EXPECT_NE(again.out.find(" the input folder " + (dir_ / "corpus").string() +
                             " (--input), whose every file is read"),
              std::string::npos)
        << again.out;
  }
  CommandResult over = tool("prepare_text", "--input=corpus/train.bin --output=corpus");
  EXPECT_EQ(over.code, 2) << over.out;
  EXPECT_NE(over.out.find((dir_ / "corpus" / "train.bin").string() + ": is the input "),
            std::string::npos)
      << over.out;
  EXPECT_EQ(bytes(dir_ / "corpus" / "train.bin"), train);
  // A FIFO as the vocabulary or an input is refused at once (it hung).
  ASSERT_EQ(::mkfifo((dir_ / "vocab.json").c_str(), 0600), 0);
  std::ofstream(dir_ / "merges.txt") << "#version: 0.2\n";
  CommandResult fifo = tool(
      "prepare_text", "--input=corpus/a.txt --output=out --vocab=vocab.json --merges=merges.txt");
  EXPECT_EQ(fifo.code, 2) << fifo.out;
  EXPECT_NE(fifo.out.find((dir_ / "vocab.json").string() +
                          ": cannot open (a FIFO (named pipe), not a regular file)"),
            std::string::npos)
      << fifo.out;
  CommandResult input = tool("prepare_text", "--input=vocab.json --output=out");
  EXPECT_EQ(input.code, 2) << input.out;
  EXPECT_NE(input.out.find("a FIFO (named pipe), not a regular file"), std::string::npos)
      << input.out;
  EXPECT_FALSE(fs::exists(dir_ / "corpus" / "tokens"));
  // A file given twice (alone and in its folder) would be counted twice and could be the
  // validation split of itself; a fraction with trailing junk or one leaving val.bin empty.
  std::ofstream(dir_ / "b.txt") << std::string(400, 'b');
  for (const auto& [args, why] : std::vector<std::pair<std::string, std::string>>{
           {"--input=corpus/a.txt --input=corpus --output=twice",
            "a.txt: read twice (--input " + (dir_ / "corpus" / "a.txt").string() + " and --input " +
                (dir_ / "corpus").string() + "); give each file once"},
           {"--input=b.txt --output=junk --val_fraction=0.5abc",
            "--val_fraction: '0.5abc' is not a number"},
           {"--input=b.txt --output=tiny --val_fraction=0.001",
            "tokens leaves 0 for val.bin (at least 2); raise --val_fraction"}}) {
    CommandResult r = tool("prepare_text", args);
    EXPECT_NE(r.code, 0) << args << ": " << r.out;
    EXPECT_NE(r.out.find(why), std::string::npos) << args << ": " << r.out;
  }
  EXPECT_FALSE(fs::exists(dir_ / "twice" / "train.bin"));
  // A second name for a file inside one folder (Ubuntu's python3.12 has a symlink beside its
  // _sysconfigdata; the default GPT corpus failed there) is the same file: read once.
  fs::create_directories(dir_ / "linked");
  std::ofstream(dir_ / "linked" / "x.txt") << std::string(400, 'x');
  fs::create_symlink("x.txt", dir_ / "linked" / "y.txt");
  CommandResult linked = tool("prepare_text", "--input=linked --output=linked_tokens");
  ASSERT_EQ(linked.code, 0) << linked.out;
  EXPECT_EQ(bytes(dir_ / "linked_tokens" / "train.bin").size() +
                bytes(dir_ / "linked_tokens" / "val.bin").size(),
            400 * sizeof(uint16_t))
      << linked.out;
  // A rerun killed while writing leaves no meta.json (the folder is refused, not a mix of two
  // runs' files), and the next run removes the killed one's temporary file.
  ASSERT_EQ(tool("prepare_text", "--input=b.txt --output=rerun").code, 0);
  std::ofstream(dir_ / "c.txt") << std::string(2000, 'c');
  const CommandResult killed =
      run_command("cd '" + dir_.string() + "' && FABRIC_TEST_KILL_AFTER_BYTES=1000 '" +
                  fs::absolute(helper_binary("//tools:prepare_text")).string() +
                  "' --input=c.txt --output=rerun");
  EXPECT_NE(killed.code, 0) << killed.out;
  EXPECT_FALSE(fs::exists(dir_ / "rerun" / "meta.json"));
  auto temporaries = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir_ / "rerun"))
      n += e.path().filename().string().find(".tmp.") != std::string::npos;
    return n;
  };
  EXPECT_EQ(temporaries(), 1);
  ASSERT_EQ(tool("prepare_text", "--input=c.txt --output=rerun").code, 0);
  EXPECT_TRUE(fs::exists(dir_ / "rerun" / "meta.json"));
  EXPECT_EQ(temporaries(), 0);
}

TEST_F(FileToolsTest, EstimateMemoryHelpAndSizesThatOverflow) {
  CommandResult help = tool("estimate_memory", "--help");
  EXPECT_EQ(help.code, 0) << help.out;
  EXPECT_NE(help.out.find("usage: estimate_memory --config=FILE"), std::string::npos) << help.out;
  CommandResult huge =
      tool("estimate_memory", "--config=fashion_mnist.yaml data.batch_size=1000000000000000000");
  EXPECT_EQ(huge.code, 2) << huge.out;
  EXPECT_NE(huge.out.find("the estimate overflows 64-bit byte counts"), std::string::npos)
      << huge.out;
  EXPECT_EQ(huge.out.find("MiB per process"), std::string::npos) << huge.out;
  // A bad value in a gpt config: its own error, not cifar10's "unknown key" (auto mode).
  CommandResult value = tool("estimate_memory", "--config=gpt_tiny.yaml data.batch_size=-5");
  EXPECT_EQ(value.code, 2) << value.out;
  EXPECT_NE(value.out.find("data.batch_size"), std::string::npos) << value.out;
  EXPECT_NE(value.out.find("(read as gpt's config)"), std::string::npos) << value.out;
  EXPECT_EQ(value.out.find("unknown key"), std::string::npos) << value.out;
}

}  // namespace
}  // namespace fabric::testing
