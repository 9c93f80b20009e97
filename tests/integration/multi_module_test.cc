// More than one module set up under ddp (tests/integration/multi_module_helper.cc), each with
// f.setup as Lightning Fabric's users write it: a GAN (a discriminator step on a detached fake, a
// generator step through both) and a student beside a frozen teacher end 2 processes with the
// weights one process reaches on the whole batch (SGD, 6 steps); a loss that reaches a module in
// part stops with one line naming a parameter it missed, and runs with find_unused_parameters; a
// whole model under pipeline parallelism is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/run_command.h"

namespace {

fabric::testing::CommandResult run(const std::string& args) {
  const std::string exe = fabric::testing::helper_binary("//tests/integration:multi_module_helper");
  // A collective one rank skips would hang: the timeout turns that into a failure.
  return fabric::testing::run_command("timeout 120 '" + exe + "' fabric.accelerator=cpu " + args);
}

// "param NAME v1 v2 ..." lines: name → values.
std::map<std::string, std::vector<double>> params(const std::string& out) {
  std::map<std::string, std::vector<double>> found;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("param ", 0) != 0) continue;
    std::istringstream words(line.substr(6));
    std::string name;
    words >> name;
    for (double v; words >> v;) found[name].push_back(v);
  }
  return found;
}

double largest_difference(const std::map<std::string, std::vector<double>>& a,
                          const std::map<std::string, std::vector<double>>& b) {
  double most = 0;
  for (const auto& [name, values] : a) {
    const auto it = b.find(name);
    if (it == b.end() || it->second.size() != values.size()) return INFINITY;
    for (size_t i = 0; i < values.size(); ++i)
      most = std::max(most, std::abs(values[i] - it->second[i]));
  }
  return a.size() == b.size() ? most : INFINITY;
}

TEST(MultiModuleTest, GanAndFrozenTeacherUnderDdpMatchOneProcess) {
  for (const std::string mode : {"gan", "distill"}) {
    SCOPED_TRACE(mode);
    auto one = run("fabric.devices=1 test.mode=" + mode);
    ASSERT_EQ(one.code, 0) << one.out;
    auto two = run("fabric.devices=2 fabric.strategy=ddp test.mode=" + mode);
    ASSERT_EQ(two.code, 0) << two.out;
    auto untrained = run("fabric.devices=1 test.steps=0 test.mode=" + mode);
    ASSERT_EQ(untrained.code, 0) << untrained.out;
    const auto single = params(one.out), ddp = params(two.out);
    ASSERT_EQ(single.size(), mode == "gan" ? 8u : 8u) << one.out;
    EXPECT_LT(largest_difference(single, ddp), 1e-5) << one.out << two.out;
    // The steps moved every trained module (so the parity above compares trained weights).
    const auto start = params(untrained.out);
    for (const std::string trained :
         {"generator.fc1.weight", "discriminator.fc2.weight", "student.fc1.weight"}) {
      if (!single.count(trained)) continue;
      double moved = 0;
      for (size_t i = 0; i < single.at(trained).size(); ++i)
        moved = std::max(moved, std::abs(single.at(trained)[i] - start.at(trained)[i]));
      EXPECT_GT(moved, 1e-3) << trained;
    }
    if (mode == "distill") {  // the teacher is frozen: as built
      EXPECT_EQ(ddp.at("teacher.fc1.weight"), start.at("teacher.fc1.weight"));
    }
  }
}

TEST(MultiModuleTest, ALossReachingAModuleInPartNeedsFindUnusedParameters) {
  auto partial = run("fabric.devices=2 fabric.strategy=ddp test.mode=partial");
  EXPECT_EQ(partial.code, 1) << partial.out;
  EXPECT_NE(partial.out.find("ddp: this backward reaches 4 of the 6 parameters of the module set "
                             "up second (not 'b.weight'): set "
                             "fabric.ddp.find_unused_parameters: true, or freeze the parameters "
                             "the loss does not use"),
            std::string::npos)
      << partial.out;
  auto one = run("fabric.devices=1 test.mode=partial");
  ASSERT_EQ(one.code, 0) << one.out;
  auto unused =
      run("fabric.devices=2 fabric.strategy=ddp fabric.ddp.find_unused_parameters=true "
          "test.mode=partial");
  ASSERT_EQ(unused.code, 0) << unused.out;
  EXPECT_LT(largest_difference(params(one.out), params(unused.out)), 1e-5) << one.out << unused.out;
}

// A module only some ranks' losses reach (a data-dependent branch) is prepared on every rank, so
// the ranks run the same collectives (with find_unused_parameters; without it, every rank stops
// with the same error); a module set up frozen and unfrozen later, and a parameter two set-up
// modules share, are refused.
TEST(MultiModuleTest, RanksAgreeOnTheModulesABackwardSynchronizes) {
  auto sometimes =
      run("fabric.devices=2 fabric.strategy=ddp fabric.ddp.find_unused_parameters=true "
          "test.mode=sometimes");
  EXPECT_EQ(sometimes.code, 0) << sometimes.out;
  EXPECT_FALSE(params(sometimes.out).empty()) << sometimes.out;
  auto refused = run("fabric.devices=2 fabric.strategy=ddp test.mode=sometimes");
  EXPECT_EQ(refused.code, 1) << refused.out;
  EXPECT_NE(refused.out.find("ddp: this backward reaches 0 of the 4 parameters of the module set "
                             "up second"),
            std::string::npos)
      << refused.out;
  auto unfrozen = run("fabric.devices=2 fabric.strategy=ddp test.mode=unfreeze");
  EXPECT_EQ(unfrozen.code, 1) << unfrozen.out;
  EXPECT_NE(unfrozen.out.find("ddp: the module set up first's 'fc1.weight' requires a gradient "
                              "now, but its module was set up frozen"),
            std::string::npos)
      << unfrozen.out;
  auto shared = run("fabric.devices=2 fabric.strategy=ddp test.mode=shared");
  EXPECT_EQ(shared.code, 1) << shared.out;
  EXPECT_NE(shared.out.find("ddp: the module set up second shares its parameter 'weight' with a "
                            "module set up before it"),
            std::string::npos)
      << shared.out;
}

// A whole model under pipeline parallelism would be trained whole by every pipeline rank, on the
// same data: refused at setup.
TEST(MultiModuleTest, AWholeModelUnderPipelineParallelismIsRefused) {
  auto whole =
      run("fabric.devices=2 fabric.strategy=model_parallel "
          "fabric.model_parallel.pipeline_parallel_size=2 test.mode=distill");
  EXPECT_EQ(whole.code, 1) << whole.out;
  EXPECT_NE(whole.out.find("fabric.model_parallel.pipeline_parallel_size: 2, but the module "),
            std::string::npos)
      << whole.out;
  EXPECT_NE(whole.out.find("is a whole model, not a model's pipeline stages"), std::string::npos)
      << whole.out;
}

}  // namespace
