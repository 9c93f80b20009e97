// fabric::nn tensor parallelism in one process: the drop-in Linear and Embedding equal LibTorch's
// (same random numbers, same values, same forward), plan patterns, the errors parallelize() gives
// for a bad plan, the mesh's layout (tp innermost). LoRA adapters on split layers:
// tensor_parallel_lora_test.cc. The model splits run in real processes:
// tests/integration/tensor_parallel_test.cc.
#include "fabric/nn/tensor_parallel.h"

#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/utils.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/distributed/device_mesh.h"
#include "fabric/distributed/process_group.h"
#include "fabric/nn/parallel_rng.h"

namespace {

using fabric::nn::TensorParallelPlan;
using fabric::nn::TensorParallelStyle;

TEST(TensorParallelTest, LinearAndEmbeddingAreLibTorchsTwins) {
  for (bool bias : {true, false}) {
    torch::manual_seed(3);
    torch::nn::Linear a(torch::nn::LinearOptions(6, 5).bias(bias));
    torch::manual_seed(3);
    fabric::nn::Linear b(torch::nn::LinearOptions(6, 5).bias(bias));
    EXPECT_TRUE(torch::equal(a->weight, b->weight));
    EXPECT_EQ(a->bias.defined(), b->bias.defined());
    if (bias) {
      EXPECT_TRUE(torch::equal(a->bias, b->bias));
    }
    EXPECT_EQ(a->named_parameters().keys(), b->named_parameters().keys());
    const torch::Tensor x = torch::randn({2, 3, 6});
    EXPECT_TRUE(torch::allclose(a->forward(x), b->forward(x), 1e-6, 1e-6));
  }
  torch::manual_seed(4);
  torch::nn::Embedding a(10, 4);
  torch::manual_seed(4);
  fabric::nn::Embedding b(10, 4);
  EXPECT_TRUE(torch::equal(a->weight, b->weight));
  const torch::Tensor ids = torch::randint(0, 10, {2, 7}, torch::kLong);
  EXPECT_TRUE(torch::equal(a->forward(ids), b->forward(ids)));
}

TEST(TensorParallelTest, PatternsMatchWholeComponents) {
  using fabric::nn::plan_pattern_matches;
  EXPECT_TRUE(plan_pattern_matches("transformer.h.*.mlp.c_fc", "transformer.h.12.mlp.c_fc"));
  EXPECT_FALSE(plan_pattern_matches("transformer.h.*.mlp.c_fc", "transformer.h.1.mlp.c_fc.x"));
  EXPECT_FALSE(plan_pattern_matches("transformer.h.*.mlp.c_fc", "transformer.h.mlp.c_fc"));
  EXPECT_FALSE(plan_pattern_matches("transformer.h.*", "transformer.h1.x"));
  EXPECT_TRUE(plan_pattern_matches("*", "fc"));
  EXPECT_FALSE(plan_pattern_matches("fc", "fc2"));
}

struct Net : torch::nn::Module {
  Net() {
    fc = register_module("fc", fabric::nn::Linear(8, 6));
    plain = register_module("plain", torch::nn::Linear(8, 6));
    emb = register_module("emb", fabric::nn::Embedding(10, 8));
  }
  fabric::nn::Linear fc{nullptr};
  torch::nn::Linear plain{nullptr};
  fabric::nn::Embedding emb{nullptr};
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const fabric::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TensorParallelTest, ABadPlanNamesTheRuleTheModuleAndTheFix) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto group = fabric::distributed::make_process_group(store, {0, 1});
  Net net;
  const torch::Tensor before = net.fc->weight.clone();
  EXPECT_EQ(error_of([&] {
              fabric::nn::parallelize(net,
                                      {{{"fc", TensorParallelStyle::column()},
                                        {"blocks.*.fc", TensorParallelStyle::row()}}},
                                      group);
            }),
            "tensor parallel plan rule 'blocks.*.fc' (row) matches no module of the model; its "
            "Linear layers, closest first: 'fc', 'plain'; point the rule at one, e.g. {\"fc\", "
            "TensorParallelStyle::row()} ('*' matches one name component)");
  EXPECT_EQ(error_of([&] {
              fabric::nn::parallelize(net, {{{"plain", TensorParallelStyle::row()}}}, group);
            }),
            "tensor parallel plan rule 'plain' (row) on plain: the module is a torch::nn::Linear, "
            "which no plan can split; build it as fabric::nn::Linear, its drop-in (same options, "
            "parameter names and initialization), e.g. register_module(\"plain\", "
            "fabric::nn::Linear(8, 6))");
  EXPECT_EQ(error_of([&] {
              fabric::nn::parallelize(net, {{{"fc", TensorParallelStyle::vocab()}}}, group);
            }),
            "tensor parallel plan rule 'fc' (vocab) on fc: the module is a Linear, and vocab "
            "splits an Embedding: give it column or row (TensorParallelStyle::vocab() is for "
            "fabric::nn::Embedding)");
  EXPECT_EQ(error_of([&] {
              fabric::nn::parallelize(net, {{{"fc", TensorParallelStyle::column(4)}}}, group);
            }),
            "tensor parallel plan rule 'fc' (column(4)) on fc: its out_features 6 is not divisible "
            "by 4 parts x tp 1: make it a multiple of 4");
  EXPECT_EQ(error_of([&] {
              fabric::nn::parallelize(
                  net, {{{"fc", TensorParallelStyle::column().in_units(4, "heads")}}}, group);
            }),
            "tensor parallel plan rule 'fc' (column) on fc: its out_features 6 is not a whole "
            "number of heads of 4 elements: a slice would cut one apart");
  EXPECT_TRUE(torch::equal(net.fc->weight, before));  // an error leaves the model whole
  // A group of one: the plan applies and changes nothing.
  EXPECT_EQ(fabric::nn::parallelize(net, {{{"fc", TensorParallelStyle::column()}}}, group),
            std::vector<std::string>{"fc"});
  EXPECT_TRUE(torch::equal(net.fc->weight, before));
  EXPECT_FALSE(net.fc->parallel().has_value());
}

// A user's nanoGPT-style model, its layers named its own way: a plan written for other names
// gets them back as patterns, closest first, with a rule to copy.
struct Attention : torch::nn::Module {
  Attention() {
    qkv = register_module("qkv", fabric::nn::Linear(8, 24));
    proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(8, 8).bias(false)));
  }
  fabric::nn::Linear qkv{nullptr};
  torch::nn::Linear proj{nullptr};
};
struct Block : torch::nn::Module {
  Block() {
    attn = register_module("attn", std::make_shared<Attention>());
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
  }
  std::shared_ptr<Attention> attn;
  torch::nn::LayerNorm ln{nullptr};
};
struct UserModel : torch::nn::Module {
  UserModel() {
    wte = register_module("wte", torch::nn::Embedding(16, 8));
    torch::nn::ModuleList list;
    for (int i = 0; i < 2; ++i) list->push_back(std::make_shared<Block>());
    blocks = register_module("blocks", list);
  }
  torch::nn::Embedding wte{nullptr};
  torch::nn::ModuleList blocks{nullptr};
};

TEST(TensorParallelTest, PlanErrorsOfAUsersModelNameItsOwnLayers) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto group = fabric::distributed::make_process_group(store, {0, 1});
  UserModel model;
  auto parallelize = [&](const std::string& rule, const TensorParallelStyle& style) {
    return error_of([&] { fabric::nn::parallelize(model, {{{rule, style}}}, group); });
  };
  EXPECT_EQ(parallelize("blocks.*.attn.c_attn", TensorParallelStyle::column(3)),
            "tensor parallel plan rule 'blocks.*.attn.c_attn' (column(3)) matches no module of "
            "the model; its Linear layers, closest first: 'blocks.*.attn.qkv', "
            "'blocks.*.attn.proj'; point the rule at one, e.g. {\"blocks.*.attn.qkv\", "
            "TensorParallelStyle::column(3)} ('*' matches one name component)");
  EXPECT_EQ(parallelize("transformer.wte", TensorParallelStyle::vocab()),
            "tensor parallel plan rule 'transformer.wte' (vocab) matches no module of the model; "
            "its Embedding layers, closest first: 'wte'; point the rule at one, e.g. {\"wte\", "
            "TensorParallelStyle::vocab()} ('*' matches one name component)");
  // A rule on the attention module itself, not on its layers.
  EXPECT_EQ(parallelize("blocks.*.attn", TensorParallelStyle::column()),
            "tensor parallel plan rule 'blocks.*.attn' (column) on blocks.0.attn: the module is a "
            "(anonymous namespace)::Attention holding Linear layers 'qkv', 'proj'; a rule names "
            "the layer itself, e.g. {\"blocks.*.attn.qkv\", TensorParallelStyle::column()}");
  EXPECT_EQ(parallelize("blocks.*.attn.proj", TensorParallelStyle::row()),
            "tensor parallel plan rule 'blocks.*.attn.proj' (row) on blocks.0.attn.proj: the "
            "module is a torch::nn::Linear, which no plan can split; build it as "
            "fabric::nn::Linear, its drop-in (same options, parameter names and initialization), "
            "e.g. register_module(\"proj\", fabric::nn::Linear(torch::nn::LinearOptions(8, "
            "8).bias(false)))");
  EXPECT_EQ(parallelize("wte", TensorParallelStyle::vocab()),
            "tensor parallel plan rule 'wte' (vocab) on wte: the module is a torch::nn::Embedding, "
            "which no plan can split; build it as fabric::nn::Embedding, its drop-in (same "
            "options, parameter names and initialization), e.g. register_module(\"wte\", "
            "fabric::nn::Embedding(16, 8))");
  EXPECT_EQ(parallelize("blocks.*.ln", TensorParallelStyle::row()),
            "tensor parallel plan rule 'blocks.*.ln' (row) on blocks.0.ln: the module is a "
            "torch::nn::LayerNormImpl, not a fabric::nn::Linear; a plan splits fabric::nn::Linear "
            "(column, row) and fabric::nn::Embedding (vocab) layers only; the model's Linear "
            "layers, closest first: 'blocks.*.attn.qkv', 'blocks.*.attn.proj'");
}

// Attention reshapes a split qkv layer's output with the heads this rank holds.
TEST(TensorParallelTest, LocalHeadsAreThisRanksShareOrANamedError) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto group = fabric::distributed::make_process_group(store, {0, 1});
  fabric::nn::Linear qkv(8, 24);
  EXPECT_EQ(fabric::nn::local_heads(qkv, 6), 6);  // whole (before setup, or tp 1)
  // As parallelize() leaves rank 0 of tp 2, then of tp 4.
  fabric::nn::TensorParallelShard shard(group, TensorParallelStyle::column(3), 0, 2, 0, {24, 8});
  shard.module_name = "blocks.0.attn.qkv";
  qkv->set_parallel(shard);
  EXPECT_EQ(fabric::nn::local_heads(qkv, 4), 2);
  fabric::nn::Linear wide(8, 24);
  shard.size = 4;
  wide->set_parallel(shard);
  EXPECT_EQ(error_of([&] { fabric::nn::local_heads(wide, 6); }),
            "fabric::nn::Linear 'blocks.0.attn.qkv' (column(3), tp 4) holds n_head / tp heads "
            "per rank, but 6 heads do not divide by tp 4: make n_head a multiple of "
            "fabric.model_parallel.tensor_parallel_size (.in_units(head_size, \"attention "
            "heads\") on the plan rule refuses such a tp at setup); then reshape with -1 or the "
            "local head count, never n_head");
  EXPECT_EQ(error_of([&] { fabric::nn::local_heads(qkv, 0); }),
            "fabric::nn::local_heads: n_head must be at least 1 (got 0)");
}

// fabric.model_parallel.sequence_parallel on a model that never cuts its activations: the first
// split layer says so (before any collective), instead of LibTorch's shape error later.
TEST(TensorParallelTest, SequenceParallelWithoutEnterNamesTheLayerAndTheFix) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto group = fabric::distributed::make_process_group(store, {0, 1});
  fabric::nn::Linear fc(8, 8);
  fabric::nn::TensorParallelShard shard(group, TensorParallelStyle::column(), 0, 2, 0, {8, 8});
  shard.module_name = "blocks.0.mlp.fc";
  shard.sequence_parallel = true;
  fc->set_parallel(shard);
  const torch::Tensor x = torch::randn({2, 4, 8});
  EXPECT_EQ(error_of([&] { fc(x); }),
            "fabric::nn::Linear 'blocks.0.mlp.fc' (column, tp 2) runs under sequence "
            "parallelism, but the model never cut its activations along the sequence: call x = "
            "fabric::nn::enter_sequence_parallel(x, layer->parallel()) after the embeddings and "
            "leave_sequence_parallel before the head (docs/tensor_parallel.md), or set "
            "fabric.model_parallel.sequence_parallel: false");
  // The group here has one rank: enter keeps the 4 positions, and records that it cut 4.
  fabric::nn::enter_sequence_parallel(x, fc->parallel());
  EXPECT_EQ(error_of([&] { fc(x); }),
            "fabric::nn::Linear 'blocks.0.mlp.fc' (column, tp 2) runs under sequence parallelism "
            "and takes this rank's 2 of 4 positions, [B, T / tp, ...], but its input is Float "
            "[2, 4, 8]: give the split layers the activations between enter_sequence_parallel "
            "and leave_sequence_parallel, or set fabric.model_parallel.sequence_parallel: false");
  EXPECT_NE(error_of([&] {
              fc(x.view({8, 8}));
            }).find("but its input is Float [8, 8]"),
            std::string::npos);
  EXPECT_EQ(fc(x.narrow(1, 0, 2)).sizes(), (std::vector<int64_t>{2, 2, 4}));  // a rank's cut
}

TEST(TensorParallelTest, ShardSlicesEveryBlockAndGathersBack) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto group = fabric::distributed::make_process_group(store, {0, 1});
  // Rank 1 of 2 with three blocks of 4 rows: rows 2-3, 6-7, 10-11.
  fabric::nn::TensorParallelShard shard(group, TensorParallelStyle::column(3), 1, 2, 0, {12, 2});
  const torch::Tensor whole = torch::arange(24, torch::kFloat).view({12, 2});
  const torch::Tensor piece = shard.slice(whole, 0);
  EXPECT_TRUE(
      torch::equal(piece.select(1, 0), torch::tensor({4.0f, 6.0f, 12.0f, 14.0f, 20.0f, 22.0f})));
}

TEST(TensorParallelTest, MeshLaysTensorParallelInnermost) {
  using fabric::distributed::DeviceMesh;
  // dp_replicate=2 x dp_shard=2 x tp=2: rank 5 = (1, 0, 1).
  DeviceMesh mesh(5, {{"dp_replicate", 2}, {"dp_shard", 2}, {"tp", 2}},
                  {{"dp", {"dp_replicate", "dp_shard"}}});
  EXPECT_EQ(mesh.world_size(), 8);
  EXPECT_EQ(mesh.coordinate("dp_replicate"), 1);
  EXPECT_EQ(mesh.coordinate("dp_shard"), 0);
  EXPECT_EQ(mesh.coordinate("tp"), 1);
  EXPECT_EQ(mesh.coordinate("dp"), 2);
  EXPECT_EQ(mesh.size("dp"), 4);
  EXPECT_EQ(mesh.ranks("tp"), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(mesh.ranks("dp_shard"), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(mesh.ranks("dp"), (std::vector<int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(mesh.rank_at({0, 1, 1}), 3);
  EXPECT_EQ(mesh.describe(), "dp_replicate=2 x dp_shard=2 x tp=2");
  EXPECT_EQ(error_of([&] { mesh.size("pp"); }),
            "DeviceMesh: 'pp' is not a dimension of this mesh (dp_replicate, dp_shard, tp, dp)");
  EXPECT_EQ(error_of([&] { mesh.group("tp"); }),
            "DeviceMesh::group('tp'): this mesh was built without process groups");
  auto store = c10::make_intrusive<c10d::HashStore>();
  EXPECT_EQ(error_of([&] {
              DeviceMesh(store, {0, 3}, {{"dp", 2}, {"tp", 2}});
            }),
            "DeviceMesh: dp=2 x tp=2 holds 4 ranks, but the job has 3; make the sizes' product the "
            "world size");
}

// Where tp ranks hold different pieces (heads; positions under sequence parallelism) their dropout
// masks must differ, while the default generator stays in step on every rank (whole activations
// keep equal masks) and a recompute from the same state redraws the same numbers.
TEST(TensorParallelTest, RankRandomScopeGivesEachRankItsOwnStreamInStep) {
  auto scoped = [](uint64_t seed, int64_t rank) {
    torch::manual_seed(seed);
    torch::Tensor inside;
    {
      const fabric::nn::RankRandomScope own(torch::kCPU, rank);
      inside = torch::rand({1000});
    }
    return std::make_pair(inside, torch::rand({16}));  // the default generator after it
  };
  const auto [rank0, after0] = scoped(7, 0);
  const auto [rank1, after1] = scoped(7, 1);
  EXPECT_FALSE(torch::equal(rank0, rank1)) << "two ranks drew the same numbers";
  EXPECT_TRUE(torch::equal(after0, after1)) << "the ranks' default generators left step";
  EXPECT_TRUE(torch::equal(scoped(7, 0).first, rank0)) << "a recompute would draw other masks";
  EXPECT_FALSE(torch::equal(scoped(8, 0).first, rank0));
  torch::manual_seed(7);
  const torch::Tensor plain = torch::rand({1000});
  EXPECT_FALSE(torch::equal(plain, rank0));
  // Successive scopes (layer after layer) draw different numbers.
  torch::manual_seed(7);
  torch::Tensor first, second;
  {
    const fabric::nn::RankRandomScope own(torch::kCPU, 0);
    first = torch::rand({1000});
  }
  {
    const fabric::nn::RankRandomScope own(torch::kCPU, 0);
    second = torch::rand({1000});
  }
  EXPECT_TRUE(torch::equal(first, rank0));
  EXPECT_FALSE(torch::equal(first, second));
}

}  // namespace
