// The fixture of the end-to-end example tests (examples_test, training_features_test): runs
// examples/<binary> from a fresh working directory and reads what it wrote.
#ifndef TESTS_INTEGRATION_EXAMPLES_FIXTURE_H_
#define TESTS_INTEGRATION_EXAMPLES_FIXTURE_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/run_command.h"

namespace fabric::testing {

namespace fs = std::filesystem;

struct Result : fabric::testing::CommandResult {
  // The last line of the output, before the report of config keys nothing read (on stderr, after
  // the program's last line of stdout), which names keys a test's overrides left inert.
  std::string last_line() const {
    std::string s = out;
    for (;;) {
      while (!s.empty() && s.back() == '\n') s.pop_back();
      const std::string line = s.substr(s.rfind('\n') + 1);
      if (line.find("never read by this program") == std::string::npos || line.size() == s.size())
        return line;
      s.resize(s.size() - line.size());
    }
  }
};

class ExamplesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "examples_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs examples/<binary> with `args` from a fresh working directory.
  // `prefix` goes before the program (environment variables).
  Result run(const std::string& binary, const std::string& args, const std::string& prefix = "") {
    const std::string exe = (fs::current_path() / "examples" / binary).string();
    const std::string cmd = "cd '" + dir_.string() + "' && " + prefix +
                            " BUILD_WORKING_DIRECTORY='" + dir_.string() + "' '" + exe + "' " +
                            args;
    return Result{fabric::testing::run_command(cmd)};
  }

  nlohmann::json summary_of(const Result& r) {
    std::ifstream in(r.last_line());
    EXPECT_TRUE(in.good()) << "last line is not the summary path:\n" << r.out;
    return nlohmann::json::parse(in);
  }

  // The whole file ("" when it cannot be read).
  static std::string bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  // Runs `binary` with `args` to the end (run dir "whole") and again resumed from the
  // checkpoint of optimizer step `from` (run dir "resumed"); expects both to exit 0 after `steps`
  // optimizer steps, the second to say it resumed, and weights.pt to be bitwise the same. Returns
  // false (with the failure recorded) when a run failed, so the caller can stop.
  bool expect_resume_bitwise(const std::string& binary, const std::string& args, int from,
                             int steps) {
    Result whole = run(binary, args + " logging.run_dir=whole");
    EXPECT_EQ(whole.code, 0) << whole.out;
    if (whole.code != 0) return false;
    EXPECT_EQ(summary_of(whole)["steps"], steps);
    char name[32];
    std::snprintf(name, sizeof(name), "step-%08d.ckpt", from);
    const fs::path ckpt = dir_ / "whole" / "checkpoints" / name;
    EXPECT_TRUE(fs::exists(ckpt)) << whole.out;
    Result resumed =
        run(binary, args + " logging.run_dir=resumed checkpoint.resume=" + ckpt.string());
    EXPECT_EQ(resumed.code, 0) << resumed.out;
    if (resumed.code != 0) return false;
    // (A run that started over would end bitwise the same too.)
    EXPECT_EQ(summary_of(resumed)["resumed_from"], ckpt.string()) << resumed.out;
    const std::string a = bytes(dir_ / "whole" / "weights.pt");
    EXPECT_FALSE(a.empty()) << whole.out;
    EXPECT_TRUE(a == bytes(dir_ / "resumed" / "weights.pt")) << resumed.out;
    return !a.empty();
  }

  fs::path dir_;
};

// A tiny CIFAR-10 run: synthetic data, narrow model, 3 steps.
inline constexpr const char* kTinyCifar =
    " model.width=4 data.synthetic=true data.synthetic_train_size=256 data.synthetic_test_size=64"
    " data.batch_size=32 trainer.max_steps=3 logging.log_every_n_steps=1";

}  // namespace fabric::testing

#endif  // TESTS_INTEGRATION_EXAMPLES_FIXTURE_H_
