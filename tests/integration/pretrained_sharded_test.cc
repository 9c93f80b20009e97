// Pretrained weights into a set-up model, each rank copying only its own elements
// (pretrained_sharded_helper): the tiny Hugging Face Llama-family folders of
// tests/fabric/hf/make_llamas.py (written again by pretrained_sharded_models.py), loaded through
// Fabric::load_weights(module, tensors, source) into a fabric::models::Llama built by an empty
// init and set up as one process, under ddp 2 (with
// ZeRO-1), fsdp 2 and model_parallel tp 2 (real processes over loopback), give
//   - exactly the folder's weights (gathered back with save_weights),
//   - transformers' float32 logits to 1e-5 (relative to the largest; gathered over tp where the
//     vocabulary is split),
//   - after one SGD step (lr 0.1) the weights reference - lr * gradient (transformers') to 1e-5:
//     the loaded pieces, forward, backward and the gradient synchronization of each strategy.
// While loading no rank allocates tensor memory beyond the model's (fsdp gathers no unit, tp
// keeps no copy of its slices). A whole model loaded before setup gives the same; a tensor of
// another shape is one error line naming the folder, the tensor and its whole shapes under every
// strategy.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

class PretrainedShardedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = (fs::path(::testing::TempDir()) / "pretrained_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    const char* python = std::getenv("PYTHON");
    const auto r = fabric::testing::run_command(std::string(python ? python : "python3") +
                                                " tests/integration/pretrained_sharded_models.py " +
                                                dir_.string());
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static fabric::testing::CommandResult run(const std::string& name, const std::string& args) {
    const std::string exe =
        fabric::testing::helper_binary("//tests/integration:pretrained_sharded_helper");
    const fs::path out = dir_ / "out";
    fs::remove_all(out);
    fs::create_directories(out);
    return fabric::testing::run_command(
        "cd '" + out.string() + "' && '" + exe +
        "' fabric.accelerator=cpu test.folder=" + (dir_ / name).string() +
        " test.reference=" + (dir_ / (name + ".ref.safetensors")).string() +
        " test.out=" + out.string() + " " + args + " 2>&1");
  }

  // Runs the helper on folder `name` with `args`; checks its lines.
  static void check(const std::string& name, const std::string& args) {
    SCOPED_TRACE(name + " " + args);
    const auto r = run(name, args);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(fabric::testing::value_after(r.out, "loaded_exact="), "1") << r.out;
    // Each rank copies into what it holds: no tensor memory beyond the model's while loading.
    const int world = args.find("fabric.devices=2") != std::string::npos ? 2 : 1;
    for (int rank = 0; rank < world; ++rank) {
      const std::string line = fabric::testing::value_after(
          r.out, "rank " + std::to_string(rank) + " load_extra_bytes=");
      ASSERT_FALSE(line.empty()) << "rank " << rank << " did not report:\n" << r.out;
      EXPECT_EQ(std::stoll(line), 0) << "rank " << rank << ": " << line;
    }
    for (const char* key : {"logits=", "stepped="}) {
      const std::string v = fabric::testing::value_after(r.out, key);
      ASSERT_FALSE(v.empty()) << key << " missing:\n" << r.out;
      EXPECT_LT(std::stod(v), 1e-5) << key << "\n" << r.out;
      std::cout << name << " " << args << ": " << key << v << "\n";
    }
  }

  static fs::path dir_;
};

fs::path PretrainedShardedTest::dir_;

const char* kSingle = "fabric.devices=1";
const char* kDdp = "fabric.devices=2 fabric.strategy=ddp fabric.ddp.shard_optimizer_state=true";
// fsdp units smaller than a block: parameters cut across the ranks at unaligned offsets.
const char* kFsdp = "fabric.devices=2 fabric.strategy=fsdp fabric.fsdp.min_unit_params=1000";
const char* kHsdp =
    "fabric.devices=2 fabric.strategy=model_parallel fabric.model_parallel.tensor_parallel_size=1 "
    "fabric.model_parallel.data_parallel_replicate_size=2";
const char* kTp =
    "fabric.devices=2 fabric.strategy=model_parallel fabric.model_parallel.tensor_parallel_size=2";

TEST_F(PretrainedShardedTest, LlamaUnderEachStrategy) {
  for (const char* args : {kSingle, kDdp, kFsdp, kHsdp, kTp}) check("llama", args);
}

TEST_F(PretrainedShardedTest, TiedQwen2AndBfloat16File) {
  for (const char* args : {kFsdp, kTp}) {
    check("qwen2", args);
    check("qwen2_bf16", args);
  }
}

TEST_F(PretrainedShardedTest, WholeModelLoadedBeforeSetup) {
  for (const char* args : {kSingle, kFsdp, kTp})
    check("llama", std::string(args) + " test.before_setup=true test.empty_init=false");
}

TEST_F(PretrainedShardedTest, MismatchesAreOneLineNamingTheSourceAndTensor) {
  const std::string folder = (dir_ / "llama").string();
  // A split tensor of the wrong shape is named with the model's whole shape, not a rank's slice.
  for (const char* args : {kSingle, kFsdp, kTp}) {
    const auto r = run("llama", std::string(args) + " test.cut=model.layers.1.mlp.up_proj.weight");
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(folder + ": does not match the model: shape of "
                                  "model.layers.1.mlp.up_proj.weight is [95, 64] in the file, "
                                  "[96, 64] in the model"),
              std::string::npos)
        << args << "\n"
        << r.out;
  }
  // An empty init's module has no memory before setup: refused, not copied into nothing.
  const auto r = run("llama", std::string(kSingle) + " test.before_setup=true");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(folder + ": the module was built by an empty init"), std::string::npos)
      << r.out;
}

}  // namespace
