// CheckpointState::add with a name filter (trainable_only): one process saves and loads only what
// trains, the frozen tensors left as they are (a checkpoint of the whole module loads too, a
// trainable tensor missing is an error); and through a strategy that splits the module
// (ShardedState, here a fake one that keeps everything as pieces): the local pieces are filtered
// the same way, and its loader gets None for the frozen names, which it leaves alone.
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/checkpoint_state.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/checkpoint/sharded_state.h"
#include "fabric/checkpoint/state_dict.h"
#include "fabric/fabric.h"
#include "tests/fabric/checkpoint/checkpoint_testing.h"

namespace fs = std::filesystem;

namespace {

using namespace fabric::checkpoint_testing;

// make_model() with its first layer frozen (a base under an adapter).
torch::nn::Sequential frozen_first(int seed) {
  torch::manual_seed(seed);
  auto model = make_model();
  for (auto& p : model[0]->parameters()) p.set_requires_grad(false);
  return model;
}

std::set<std::string> keys_of(const c10::IValue& dict) {
  std::set<std::string> out;
  for (const auto& item : dict.toGenericDict()) out.insert(item.key().toStringRef());
  return out;
}

const std::set<std::string> kTrainable = {"2.weight", "2.bias"};

TEST_F(CheckpointTest, OnlyWhatTrainsIsSavedAndLoadedTheFrozenLeftAsTheyAre) {
  fabric::Fabric f(config(), kCpu);
  auto model = frozen_first(1);
  fabric::CheckpointState state;
  state.add("model", model, fabric::trainable_only(*model));
  const fs::path file = dir_ / "trainable.ckpt";
  f.save(file.string(), state);
  const auto saved = fabric::load_archive(file).toGenericDict().at("state").toGenericDict();
  EXPECT_EQ(keys_of(saved.at("model")), kTrainable);

  // Another model: its trainable layer takes the saved values, its frozen one stays its own.
  auto other = frozen_first(2);
  const auto frozen_before = other[0]->parameters()[0].clone();
  fabric::CheckpointState into;
  into.add("model", other, fabric::trainable_only(*other));
  f.load(file.string(), into);
  EXPECT_TRUE(torch::equal(other[2]->parameters()[0], model[2]->parameters()[0]));
  EXPECT_TRUE(torch::equal(other[2]->parameters()[1], model[2]->parameters()[1]));
  EXPECT_TRUE(torch::equal(other[0]->parameters()[0], frozen_before));

  // A checkpoint of the whole module loads into it too (the frozen tensors included).
  fabric::CheckpointState whole;
  whole.add("model", model);
  const fs::path all = dir_ / "whole.ckpt";
  f.save(all.string(), whole);
  f.load(all.string(), into);
  EXPECT_TRUE(torch::equal(other[0]->parameters()[0], model[0]->parameters()[0]));

  // A trainable tensor missing is an error, as without the filter (the frozen ones are not).
  auto wide = torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::Tanh(),
                                    torch::nn::Linear(6, 2), torch::nn::Linear(2, 2));
  for (auto& p : wide[0]->parameters()) p.set_requires_grad(false);
  fabric::CheckpointState more;
  more.add("model", wide, fabric::trainable_only(*wide));
  const std::string error = error_of([&] { f.load(file.string(), more); });
  EXPECT_NE(error.find("missing [3.weight, 3.bias]"), std::string::npos) << error;
}

// Every parameter split as one piece (offset 0) of itself; loading goes through
// prepare_load_state_dict's pieces as a strategy's does.
class WholePieces : public fabric::ShardedState {
 public:
  std::optional<c10::IValue> local_module_state(torch::nn::Module& module) override {
    c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
    for (const auto& [name, t] : fabric::state_dict(module))
      out.insert(name, fabric::tensor_piece(t.sizes(), t.strides(), 0, t.reshape(-1)));
    return out;
  }
  std::optional<std::function<void()>> prepare_local_module_state(
      torch::nn::Module& module, const c10::IValue& value, const std::string& source) override {
    std::map<std::string, fabric::PartialTarget> partial;
    for (const auto& p : module.named_parameters()) {
      torch::Tensor target = p.value();
      partial[p.key()] = [target](const c10::IValue& v) {
        const torch::Tensor from = fabric::as_tensor_piece(v)->values;
        return std::function<void()>([target, from] { target.view(-1).copy_(from); });
      };
    }
    return fabric::prepare_load_state_dict(module, value, source, partial);
  }
};

TEST(TrainableStateTest, AStrategysPiecesAreFilteredAndItsLoaderLeavesTheFrozenAlone) {
  WholePieces sharded;
  auto model = frozen_first(1);
  fabric::CheckpointState state;
  state.add("model", model, fabric::trainable_only(*model));
  const c10::IValue local = fabric::with_local_pieces(&sharded, state).entries()[0].save();
  EXPECT_EQ(keys_of(local), kTrainable);

  auto other = frozen_first(2);
  const auto frozen_before = other[0]->parameters()[0].clone();
  fabric::CheckpointState into;
  into.add("model", other, fabric::trainable_only(*other));
  auto whole = std::make_shared<std::vector<torch::nn::Module*>>();
  const auto loaders = fabric::with_local_loaders(&sharded, into, whole);
  loaders.entries()[0].prepare(local, "ckpt")();
  EXPECT_TRUE(whole->empty());  // loaded by the strategy, not gathered
  EXPECT_TRUE(torch::equal(other[2]->parameters()[0], model[2]->parameters()[0]));
  EXPECT_TRUE(torch::equal(other[0]->parameters()[0], frozen_before));

  // Without the filter the same pieces miss the frozen layer.
  fabric::CheckpointState plain;
  plain.add("model", other);
  const auto strict = fabric::with_local_loaders(&sharded, plain, whole);
  const std::string error = error_of([&] { strict.entries()[0].prepare(local, "ckpt"); });
  EXPECT_NE(error.find("ckpt: does not match the model: missing [0.weight, 0.bias]"),
            std::string::npos)
      << error;
}

}  // namespace
