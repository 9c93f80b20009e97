// fabric/checkpoint/pipeline_state.h: two pipeline stages' states (a tied embedding in both, an
// optimizer of each stage's own parameters) joined into the whole model's, written as each stage's
// pieces, and fitted back onto a stage by name.
#include "fabric/checkpoint/pipeline_state.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <string>
#include <vector>

#include "fabric/checkpoint/sharded.h"
#include "fabric/core/error.h"

namespace fabric {
namespace {

using Dict = c10::impl::GenericDict;
using List = c10::impl::GenericList;

// {"model": {NAME: tensor}, "optimizer": SGD's layout over `names` (one group), "step": 4}, the
// tensors of parameter NAME filled with `value(NAME)`.
c10::IValue stage_state(const std::vector<std::string>& names) {
  auto value = [](const std::string& name) {
    return torch::full({2, 3}, static_cast<float>(name.size() + name.back()));
  };
  Dict model(c10::StringType::get(), c10::AnyType::get());
  Dict state(c10::IntType::get(), c10::AnyType::get());
  List ids(c10::AnyType::get());
  for (size_t i = 0; i < names.size(); ++i) {
    model.insert(names[i], value(names[i]));
    Dict s(c10::StringType::get(), c10::AnyType::get());
    s.insert("momentum_buffer", value(names[i]) * 10);
    state.insert(static_cast<int64_t>(i), s);
    ids.push_back(static_cast<int64_t>(i));
  }
  Dict group(c10::StringType::get(), c10::AnyType::get());
  group.insert("lr", 0.1);
  group.insert("params", ids);
  List groups(c10::AnyType::get());
  groups.push_back(group);
  Dict optimizer(c10::StringType::get(), c10::AnyType::get());
  optimizer.insert("type", std::string("SGD"));
  optimizer.insert("state", state);
  optimizer.insert("param_groups", groups);
  Dict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("model", model);
  out.insert("optimizer", with_parameter_names(optimizer, {names}));
  out.insert("step", static_cast<int64_t>(4));
  return out;
}

std::vector<int64_t> params_of(const c10::IValue& optimizer) {
  std::vector<int64_t> out;
  const List ids = optimizer.toGenericDict()
                       .at("param_groups")
                       .toList()
                       .get(0)
                       .toGenericDict()
                       .at("params")
                       .toList();
  for (size_t i = 0; i < ids.size(); ++i) out.push_back(ids.get(i).toInt());
  return out;
}

TEST(PipelineStateTest, StagesJoinIntoTheWholeModelsStateAndLoadBackByName) {
  // Stage 0: the embedding and block 0; stage 1: block 1 and the tied embedding.
  const std::vector<c10::IValue> stages{stage_state({"wte", "h0"}), stage_state({"h1", "wte"})};
  const PipelineJoin join({pipeline_skeleton(stages[0]), pipeline_skeleton(stages[1])},
                          {"optimizer"});
  const c10::IValue first = join.renumber(stages[0], 0), second = join.renumber(stages[1], 1);
  // Joined: wte, h0, h1 (the tied embedding once, the first stage's).
  EXPECT_EQ(params_of(first.toGenericDict().at("optimizer")), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(params_of(second.toGenericDict().at("optimizer")), (std::vector<int64_t>{0, 1, 2}));
  const Dict second_state =
      second.toGenericDict().at("optimizer").toGenericDict().at("state").toGenericDict();
  ASSERT_EQ(second_state.size(), 1u);  // h1's; wte's is the first stage's to write
  EXPECT_TRUE(second_state.contains(2));

  const c10::IValue whole = merge_first(first, second);
  const Dict model = whole.toGenericDict().at("model").toGenericDict();
  EXPECT_EQ(model.size(), 3u);
  const Dict optimizer = whole.toGenericDict().at("optimizer").toGenericDict();
  EXPECT_EQ(optimizer.at("state").toGenericDict().size(), 3u);
  const List names = optimizer.at(kParamNamesKey).toList();
  ASSERT_EQ(names.size(), 3u);
  EXPECT_EQ(names.get(2).toStringRef(), "h1");

  // A sharded checkpoint: the second stage writes h1 whole and nothing of wte.
  const Dict pieces = join.own_pieces(second, 1, /*writes=*/true).toGenericDict();
  const auto wte = as_tensor_piece(pieces.at("model").toGenericDict().at("wte"));
  const auto h1 = as_tensor_piece(pieces.at("model").toGenericDict().at("h1"));
  ASSERT_TRUE(wte && h1);
  EXPECT_EQ(wte->values.numel(), 0);
  EXPECT_EQ(h1->values.numel(), 6);
  EXPECT_EQ(
      as_tensor_piece(
          join.own_pieces(second, 1, false).toGenericDict().at("model").toGenericDict().at("h1"))
          ->values.numel(),
      0);  // another rank of the stage writes it
  // The first stage's rank 0: every stage's descriptors.
  EXPECT_TRUE(as_tensor_piece(
      join.join_skeletons(first).toGenericDict().at("model").toGenericDict().at("h1")));

  // Loading onto a stage holding h1 and wte (in that order): its names, its indices.
  Dict contents(c10::StringType::get(), c10::AnyType::get());
  Dict with_other(whole.toGenericDict().copy());
  with_other.insert("ema.h0", torch::zeros({2, 3}));  // the other stage's entry
  contents.insert("state", with_other);
  PipelineLocal local;
  local.optimizers["optimizer"] = {{"h1", "wte"}};
  local.modules["model"] = {"h1", "wte"};
  local.entries = {"model", "optimizer", "step"};
  local.stage_only = true;
  const Dict fitted =
      pipeline_localize(contents, local, "ckpt").toGenericDict().at("state").toGenericDict();
  EXPECT_FALSE(fitted.contains("ema.h0"));
  EXPECT_EQ(fitted.at("model").toGenericDict().size(), 2u);
  const Dict o = fitted.at("optimizer").toGenericDict();
  EXPECT_FALSE(o.contains(kParamNamesKey));
  EXPECT_EQ(params_of(o), (std::vector<int64_t>{0, 1}));
  const Dict s = o.at("state").toGenericDict();
  EXPECT_TRUE(torch::equal(s.at(0).toGenericDict().at("momentum_buffer").toTensor(),
                           stages[1]
                               .toGenericDict()
                               .at("optimizer")
                               .toGenericDict()
                               .at("state")
                               .toGenericDict()
                               .at(0)
                               .toGenericDict()
                               .at("momentum_buffer")
                               .toTensor()));  // h1's
  EXPECT_TRUE(torch::equal(s.at(1).toGenericDict().at("momentum_buffer").toTensor(),
                           stages[0]
                               .toGenericDict()
                               .at("optimizer")
                               .toGenericDict()
                               .at("state")
                               .toGenericDict()
                               .at(0)
                               .toGenericDict()
                               .at("momentum_buffer")
                               .toTensor()));  // wte's, the first stage's

  // A parameter the checkpoint does not name: one line saying which.
  local.optimizers["optimizer"] = {{"h1", "h2"}};
  try {
    pipeline_localize(contents, local, "ckpt");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt: does not match the optimizer 'optimizer': "
                                         "parameter 'h2' is not in the checkpoint"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace fabric
