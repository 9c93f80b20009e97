// search: optuna end to end (//tools:sweep with tests/tools/fake_trainer and the real Optuna
// through tools/sweep/optuna_bridge.py): every trial's result is told to the study, a re-run with
// more trials continues the same study without repeating a trial, and a bad sampler is one line.
#include <sys/wait.h>

#include <map>
#include <set>

#include "tests/tools/sweep_testing.h"

namespace {

using fabric::testing::lines;
using fabric::testing::read;
using fabric::testing::SweepTest;
namespace fs = std::filesystem;

// The study's trials as "number state value lr" lines (Optuna itself reads the storage).
std::string study_trials(const std::string& db) {
  const char* python = std::getenv("PYTHON");
  const auto r = fabric::testing::run_command(
      std::string("'") + (python ? python : "python3") +
      "' -c \"import optuna\n"
      "optuna.logging.set_verbosity(optuna.logging.WARNING)\n"
      "s = optuna.load_study(study_name='s', storage='sqlite:///" +
      db +
      "')\n"
      "for t in s.trials: print(t.number, t.state.name, repr(t.value), "
      "t.params['optimizer.lr'])\"");
  return r.code == 0 ? r.out : "error: " + r.out;
}

bool optuna_importable() {
  const char* python = std::getenv("PYTHON");
  return fabric::testing::run_command(std::string("'") + (python ? python : "python3") +
                                      "' -c 'import optuna'")
             .code == 0;
}

constexpr const char* kOptuna =
    "search: optuna\nspace: {optimizer.lr: {uniform: [0.05, 0.35]}}\nmetric: fake_metric\n"
    "mode: max\n";

TEST_F(SweepTest, OptunaTellsEveryResultAndARerunContinuesTheStudy) {
  if (!optuna_importable()) GTEST_SKIP() << "optuna is not installed (tools/setup.sh installs it)";
  write_sweep(std::string(kOptuna) + "trials: 3\n");
  auto r = sweep();
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Optuna TPESampler study s in sqlite:///"), std::string::npos) << r.out;
  ASSERT_EQ(invocations().size(), 3u) << r.out;
  const std::string db = (dir_ / "out" / "optuna.db").string();
  auto trials = lines(study_trials(db));
  ASSERT_EQ(trials.size(), 3u) << study_trials(db);
  // Each trial is COMPLETE with the metric its run wrote, for the lr Optuna chose (the run got it
  // with four significant digits).
  const auto st = state()["runs"];
  for (const auto& line : trials) {
    std::istringstream in(line);
    int number = -1;
    std::string state_name;
    double value = 0, lr = 0;
    in >> number >> state_name >> value >> lr;
    EXPECT_EQ(state_name, "COMPLETE") << line;
    bool found = false;
    for (const auto& [id, run] : st.items()) {
      if (run["trial"] != number) continue;
      found = true;
      EXPECT_EQ(id.rfind("t" + std::to_string(number) + "_lr=", 0), 0u) << id;
      EXPECT_EQ(run["summary"]["fake_metric"].get<double>(), value) << line;
      const double used = std::stod(run["values"][0][1].get<std::string>());
      EXPECT_NEAR(used, lr, 5e-4 * lr) << line;
      EXPECT_NEAR(value, fabric::testing::fake_metric(used, 42), 1e-12) << line;
    }
    EXPECT_TRUE(found) << line << "\n" << st.dump(1);
  }

  // More trials on the same directory: the study goes on from 3; nothing is run twice.
  write_sweep(std::string(kOptuna) + "trials: 5\n");
  r = sweep();
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("5 runs (3 done earlier)"), std::string::npos) << r.out;
  EXPECT_EQ(invocations().size(), 5u) << r.out;
  trials = lines(study_trials(db));
  ASSERT_EQ(trials.size(), 5u) << study_trials(db);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(trials[i].rfind(std::to_string(i) + " COMPLETE ", 0), 0u);
  EXPECT_EQ(lines(read(dir_ / "out" / "results.csv")).size(), 6u);
}

// pruner: under search: optuna is Optuna's own: the runs' metrics.csv reports become the trials'
// intermediate values and its MedianPruner stops the trials below the median of the finished
// ones; they are PRUNED in the study and pruned in the sweep, which exits 0.
TEST_F(SweepTest, OptunasMedianPrunerStopsTrialsBelowTheMedian) {
  if (!optuna_importable()) GTEST_SKIP() << "optuna is not installed (tools/setup.sh installs it)";
  write_sweep(std::string(kOptuna) +
              "trials: 5\nsampler: RandomSampler\nrandom_seed: 3\n"
              "pruner: {type: median, metric: fake/score, min_steps: 3, min_runs: 2}\n");
  const fs::path steps = dir_ / "steps";
  const auto r = fabric::testing::run_command(
      command("FAKE_STEPS=24 FAKE_STEP_MS=300 FAKE_STEPS_LOG='" + steps.string() + "'"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto trials = lines(study_trials((dir_ / "out" / "optuna.db").string()));
  ASSERT_EQ(trials.size(), 5u) << r.out;
  int pruned = 0, trained = 0;
  for (const auto& t : trials) pruned += t.find(" PRUNED ") != std::string::npos;
  for (const auto& line : lines(read(steps))) {
    std::istringstream in(line);
    double lr = 0;
    int from = 0, to = 0;
    in >> lr >> from >> to;
    trained += to - from;
  }
  EXPECT_EQ(pruned, 2) << r.out;
  EXPECT_LT(trained, 5 * 24) << r.out;
  EXPECT_NE(r.out.find("Optuna's MedianPruner stopped it at step "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(std::to_string(5 - pruned) + " done, " + std::to_string(pruned) +
                       " pruned, 0 failed"),
            std::string::npos)
      << r.out;
  // The two first trials (Optuna's startup trials) finish. With random_seed 3 the sampler draws
  // lr 0.2152, 0.3401, 0.1166, 0.3179, 0.07289: the third is above the median of the first two
  // (0.972 against 0.943) and finishes, the last two are below it and are pruned.
  EXPECT_EQ(trials[0].rfind("0 COMPLETE ", 0), 0u) << trials[0];
  EXPECT_EQ(trials[1].rfind("1 COMPLETE ", 0), 0u) << trials[1];
  EXPECT_EQ(trials[2].rfind("2 COMPLETE ", 0), 0u) << trials[2];
  EXPECT_EQ(trials[3].rfind("3 PRUNED ", 0), 0u) << trials[3];
  EXPECT_EQ(trials[4].rfind("4 PRUNED ", 0), 0u) << trials[4];
}

// storage: one database for several sweeps (machines, array jobs): two sweeps with their own
// directories run at the same time against one SQLite study; every trial number is drawn once,
// each sweep runs its own `trials`, and the study holds every result, told by the sweep that ran
// it.
TEST_F(SweepTest, TwoSweepsSharingAStorageDrawFromOneStudy) {
  if (!optuna_importable()) GTEST_SKIP() << "optuna is not installed (tools/setup.sh installs it)";
  const std::string db = (dir_ / "shared.db").string();
  write_sweep(std::string(kOptuna) + "trials: 4\nstorage: sqlite:///" + db + "\n");
  const pid_t first = start_in_background(command("FAKE_STEP_MS=50", "", "a"));
  const auto second = fabric::testing::run_command(command("FAKE_STEP_MS=50", "", "b"));
  int status = 0;
  ASSERT_EQ(waitpid(first, &status, 0), first);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read(dir_ / "first.out");
  ASSERT_EQ(second.code, 0) << second.out;
  const auto trials = lines(study_trials(db));
  ASSERT_EQ(trials.size(), 8u) << study_trials(db);
  std::map<int, double> told;  // trial number → value in the study
  for (const auto& line : trials) {
    std::istringstream in(line);
    int number = -1;
    std::string state_name;
    double value = 0;
    in >> number >> state_name >> value;
    EXPECT_EQ(state_name, "COMPLETE") << line;
    told[number] = value;
  }
  std::set<int> ran;
  for (const char* sweep_dir : {"a", "b"}) {
    const auto st = nlohmann::json::parse(read(dir_ / sweep_dir / "sweep_state.json"))["runs"];
    EXPECT_EQ(st.size(), 4u) << sweep_dir << ": " << st.dump(1);
    for (const auto& [id, run] : st.items()) {
      const int number = run["trial"].get<int>();
      EXPECT_TRUE(ran.insert(number).second) << "trial " << number << " ran twice";
      ASSERT_EQ(told.count(number), 1u) << id;
      EXPECT_EQ(run["summary"]["fake_metric"].get<double>(), told[number]) << id;
    }
  }
  EXPECT_EQ(ran.size(), 8u);
  EXPECT_EQ(*ran.begin(), 0);
  EXPECT_EQ(*ran.rbegin(), 7);
}

TEST_F(SweepTest, OptunaWithAnUnknownSamplerIsOneLine) {
  if (!optuna_importable()) GTEST_SKIP() << "optuna is not installed (tools/setup.sh installs it)";
  write_sweep(std::string(kOptuna) + "trials: 2\nsampler: TPE\n");
  const auto r = sweep();
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.out.rfind("s.yaml:2:9: search: optuna: sampler: 'TPE' is not one of Optuna's "
                        "samplers (BruteForceSampler, ",
                        0),
            0u)
      << r.out;
  EXPECT_EQ(lines(r.out).size(), 1u) << r.out;
  EXPECT_TRUE(invocations().empty());
}

// Both ends of a range are checked before any trial: [0.5, 1.5] for trainer.ema_decay (< 1) passed
// on its low end alone and failed trials later.
TEST_F(SweepTest, OptunaChecksTheHighEndOfARangeBeforeAnyTrial) {
  if (!optuna_importable()) GTEST_SKIP() << "optuna is not installed (tools/setup.sh installs it)";
  write_sweep(
      "search: optuna\nspace: {trainer.ema_decay: {uniform: [0.5, 1.5]}}\nmetric: fake_metric\n"
      "mode: max\ntrials: 2\n");
  const auto r = sweep();
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("trainer.ema_decay: 1.5 is out of range"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "out" / "runs" / "t0_ema_decay=0.5")) << r.out;
}

// --rerun_changed cannot give a finished trial a second result: refused under optuna.
TEST_F(SweepTest, OptunaRefusesToRerunAChangedFinishedTrial) {
  if (!optuna_importable()) GTEST_SKIP() << "optuna is not installed (tools/setup.sh installs it)";
  write_sweep(std::string(kOptuna) + "trials: 1\noverrides: {trainer.max_steps: 10}\n");
  auto r = sweep();
  ASSERT_EQ(r.code, 0) << r.out;
  write_sweep(std::string(kOptuna) + "trials: 1\noverrides: {trainer.max_steps: 20}\n");
  r = sweep("", "--rerun_changed");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("search: optuna: --rerun_changed cannot run 1 finished trial(s) again"),
            std::string::npos)
      << r.out;
}

// A storage file in a folder that is not there: said before anything runs, at the storage: line
// (before, Optuna's error came with no place in the sweep file). No Optuna needed to say it.
TEST_F(SweepTest, OptunaStorageInAMissingFolderIsOneLineAtItsPlace) {
  write_sweep(std::string(kOptuna) + "trials: 2\nstorage: sqlite:////no/such/folder/x.db\n");
  const auto r = sweep();
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("s.yaml:7:10: storage: sqlite:////no/such/folder/x.db: the folder "
                       "/no/such/folder is not there or not writable; "),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(invocations().empty());
}

// An ask that fails (SQLite's "database is locked") stops asking: the running trial finishes, the
// report is written and the sweep exits 1. Optuna is played by a script as $PYTHON: the first ask
// answers trial 0, the second fails.
TEST_F(SweepTest, AFailedAskLetsTheRunningTrialsFinishAndWritesTheReport) {
  const fs::path python = dir_ / "fake_python";
  std::ofstream(python)
      << "#!/bin/sh\n"
         "count='" +
             (dir_ / "asks").string() +
             "'\n"
             "case \"$2\" in\n"
             "  ask) n=$(cat \"$count\" 2>/dev/null || echo 0)\n"
             "       echo $((n + 1)) >\"$count\"\n"
             "       if [ \"$n\" = 0 ]; then\n"
             "         echo '{\"number\": 0, \"params\": {\"optimizer.lr\": 0.2}}'\n"
             "         exit 0\n"
             "       fi\n"
             "       echo 'optuna_bridge: database is locked' >&2; exit 2 ;;\n"
             "  *) exit 0 ;;\n"
             "esac\n";
  fs::permissions(python, fs::perms::owner_all);
  write_sweep(std::string(kOptuna) + "trials: 3\n");
  const auto r = sweep("PYTHON='" + python.string() + "'", "--parallel=2");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("warning: no new run could be asked for: database is locked; no more runs "
                       "start in this invocation"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(invocations(), (std::vector<std::string>{"0.2 42"})) << r.out;
  EXPECT_EQ(state()["runs"]["t0_lr=0.2"]["status"], "done") << state().dump(1);
  EXPECT_NE(read(dir_ / "out" / "results.md").find("| 1 | 0.2 |"), std::string::npos);
}

// The default storage in a sweep directory whose path holds '?', '#' and '%' (which a URL would
// read as a query, a fragment and an escape) is the optuna.db in that directory.
TEST_F(SweepTest, TheDefaultStorageIsInASweepDirectoryWithUrlCharacters) {
  if (!optuna_importable()) GTEST_SKIP() << "optuna is not installed (tools/setup.sh installs it)";
  write_sweep(std::string(kOptuna) + "trials: 1\n");
  const auto r = fabric::testing::run_command(command("", "", "'o?x=1#y%41'"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir_ / "o?x=1#y%41" / "optuna.db")) << r.out;
  EXPECT_EQ(invocations().size(), 1u) << r.out;
}

}  // namespace
