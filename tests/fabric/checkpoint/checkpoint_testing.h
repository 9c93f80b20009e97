// What the checkpoint tests of one process share: a small model, a few training steps, the
// message of a fabric::Error, and a fixture with a temporary folder and the default config.
#ifndef TESTS_FABRIC_CHECKPOINT_CHECKPOINT_TESTING_H_
#define TESTS_FABRIC_CHECKPOINT_CHECKPOINT_TESTING_H_

#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "fabric/config/standard_keys.h"
#include "fabric/connector.h"
#include "fabric/core/error.h"

namespace fabric::checkpoint_testing {

inline const fabric::MachineFacts kCpu;  // one CPU process

inline torch::nn::Sequential make_model(int64_t hidden = 6) {
  return torch::nn::Sequential(torch::nn::Linear(4, hidden), torch::nn::Tanh(),
                               torch::nn::Linear(hidden, 2));
}

inline void train(torch::nn::Sequential& model, torch::optim::Optimizer& opt, int steps, int seed) {
  torch::manual_seed(seed);
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    torch::mse_loss(model->forward(torch::randn({8, 4})), torch::randn({8, 2})).backward();
    opt.step();
  }
}

inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const fabric::Error& e) {
    return e.what();
  }
  return "(no error)";
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::path(::testing::TempDir()) / "ckpt_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  fabric::Config config(const std::vector<std::string>& overrides = {}) {
    return fabric::Config::defaults(fabric::training_schema(), overrides);
  }
  std::filesystem::path dir_;
};

}  // namespace fabric::checkpoint_testing

#endif  // TESTS_FABRIC_CHECKPOINT_CHECKPOINT_TESTING_H_
