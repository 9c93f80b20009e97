// //tools:sweep end to end with tests/tools/fake_trainer (a real Fabric command line that trains
// nothing): results, failures that do not stop the sweep, re-runs that only run what is left,
// Ctrl-C, up-front checks of every run's config, the sweep directory lock. SLURM job arrays:
// sweep_slurm_test.cc.
#include <fcntl.h>
#include <sys/file.h>

#include <cmath>
#include <set>

#include "tests/tools/sweep_testing.h"

namespace {

using fabric::testing::fake_metric;
using fabric::testing::lines;
using fabric::testing::read;
using fabric::testing::SweepTest;
namespace fs = std::filesystem;

constexpr const char* kLrSeeds =
    "grid:\n  optimizer.lr: [0.1, 0.2, 0.3]\nseeds: [1, 2]\nmetric: fake_metric\nmode: max\n";

TEST_F(SweepTest, RunsEveryPointWritesResultsAndRerunRetriesOnlyTheFailedRuns) {
  write_sweep(kLrSeeds);
  auto r = sweep("FAKE_FAIL_LR=0.3");
  EXPECT_EQ(r.code, 1) << r.out;  // a failing run does not stop the sweep
  EXPECT_EQ(invocations().size(), 6u) << r.out;
  EXPECT_NE(r.out.find("FAILED lr=0.3_seed=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("error: fake failure at lr 0.300000"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("4 done, 2 failed, 0 not run"), std::string::npos) << r.out;

  // results.csv: one row per run, metrics from each run's summary.json.
  auto csv = lines(read(dir_ / "out" / "results.csv"));
  ASSERT_EQ(csv.size(), 7u) << read(dir_ / "out" / "results.csv");
  EXPECT_EQ(csv[0].rfind("run,status,exit_code,attempts,optimizer.lr,seed,fake_metric,steps,", 0),
            0u)
      << csv[0];
  int failed = 0;
  for (size_t i = 1; i < csv.size(); ++i) {
    std::istringstream row(csv[i]);
    std::vector<std::string> c;
    for (std::string cell; std::getline(row, cell, ',');) c.push_back(cell);
    ASSERT_GE(c.size(), 7u) << csv[i];
    const double lr = std::stod(c[4]);
    const int seed = std::stoi(c[5]);
    if (c[1] == "failed") {
      ++failed;
      EXPECT_EQ(lr, 0.3);
      EXPECT_EQ(c[2], "1");
      EXPECT_EQ(c[6], "");
    } else {
      EXPECT_EQ(c[1], "done") << csv[i];
      EXPECT_NEAR(std::stod(c[6]), fake_metric(lr, seed), 1e-9) << csv[i];
    }
  }
  EXPECT_EQ(failed, 2);

  // The table: best first, mean ± sample std over the seeds; the failed point last.
  const std::string md = read(dir_ / "out" / "results.md");
  const auto rows = lines(md);
  ASSERT_GE(rows.size(), 7u) << md;
  char best[128];
  const double m1 = fake_metric(0.2, 1), m2 = fake_metric(0.2, 2);
  std::snprintf(best, sizeof(best), "| 1 | 0.2 | %.4f ± %.4f | 2/2 |", (m1 + m2) / 2,
                std::sqrt(((m1 - m2) * (m1 - m2)) / 2));
  EXPECT_EQ(rows[4].rfind(best, 0), 0u) << md;
  EXPECT_EQ(rows[5].rfind("| 2 | 0.1 |", 0), 0u) << md;
  EXPECT_EQ(rows[6].rfind("| – | 0.3 | – | 0/2 |", 0), 0u) << md;
  EXPECT_NE(r.out.find(rows[4]), std::string::npos) << "table is printed too";

  // Re-run: only the two failed runs run again, and now succeed.
  r = sweep();
  EXPECT_EQ(r.code, 0) << r.out;
  const auto calls = invocations();
  ASSERT_EQ(calls.size(), 8u) << r.out;
  EXPECT_EQ(calls[6], "0.3 1");
  EXPECT_EQ(calls[7], "0.3 2");
  EXPECT_EQ(state()["runs"]["lr=0.3_seed=2"]["attempts"], 2);
  // The failed attempt's run folder (nothing to resume in it) was removed: the retry's is
  // runs/<id>.
  EXPECT_TRUE(fs::exists(dir_ / "out" / "runs" / "lr=0.3_seed=2" / "summary.json")) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "out" / "runs" / "lr=0.3_seed=2-1")) << r.out;
  EXPECT_NE(r.out.find("6 done, 0 failed, 0 not run"), std::string::npos) << r.out;

  // Once everything is done, nothing runs.
  r = sweep();
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(invocations().size(), 8u) << r.out;
}

// Runs whose ids share a prefix ("root=r" and "root=r-50", which RunDirectory's "-N" suffix could
// make look like an attempt of the first): a failing run never touches the other's folder.
TEST_F(SweepTest, RunsWhoseIdsShareAPrefixKeepTheirOwnFolders) {
  write_sweep("grid:\n  data.root: [r-50, r]\nmetric: fake_metric\nmode: max\n");
  auto r = sweep("FAKE_FAIL_EARLY_ROOT=r");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("FAILED root=r in "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fake early failure at data.root r"), std::string::npos) << r.out;
  const fs::path other = dir_ / "out" / "runs" / "root=r-50";
  EXPECT_TRUE(fs::exists(other / "summary.json")) << r.out;
  auto s = state();
  EXPECT_EQ(s["runs"]["root=r-50"]["status"], "done");
  EXPECT_EQ(s["runs"]["root=r-50"]["run_dir"], other.string());
  EXPECT_EQ(s["runs"]["root=r"]["run_dir"], "") << s.dump(2);

  r = sweep();  // the retry writes its own folder; the other's stays
  EXPECT_EQ(r.code, 0) << r.out;
  s = state();
  EXPECT_EQ(s["runs"]["root=r"]["run_dir"], (dir_ / "out" / "runs" / "root=r").string());
  EXPECT_TRUE(fs::exists(other / "summary.json"));
}

// A finished run whose command line changed (an edited overrides:) is not reused in silence:
// the sweep is refused before anything runs, naming the run and the argument; --rerun_changed
// runs those runs again. State files without recorded command lines are not checked.
TEST_F(SweepTest, AnEditedSweepFileIsRefusedOrRerunsTheChangedRuns) {
  const std::string grid = "grid:\n  optimizer.lr: [0.1, 0.2]\nmetric: fake_metric\nmode: max\n";
  write_sweep("overrides: {trainer.max_steps: 10}\n" + grid);
  auto r = sweep();
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_EQ(invocations().size(), 2u);
  EXPECT_FALSE(state()["runs"]["lr=0.1"]["command"].empty()) << state().dump(2);

  write_sweep("overrides: {trainer.max_steps: 20}\n" + grid);
  r = sweep();
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("s.yaml:2:13: trainer.max_steps: run lr=0.1 has a result from another "
                       "command line: it ran with 'trainer.max_steps=10', now "
                       "'trainer.max_steps=20' (and 1 more run(s)); run with --rerun_changed"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(invocations().size(), 2u) << "nothing may run";

  r = sweep("", "--rerun_changed");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(invocations().size(), 4u) << r.out;
  EXPECT_NE(r.out.find("2 runs (0 done earlier)"), std::string::npos) << r.out;
  r = sweep();  // the same file again: nothing changed, nothing runs
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(invocations().size(), 4u) << r.out;

  // An old state file (no command lines): no check.
  auto s = state();
  for (auto& [id, run] : s["runs"].items()) run.erase("command");
  std::ofstream(dir_ / "out" / "sweep_state.json") << s.dump(2);
  write_sweep("overrides: {trainer.max_steps: 30}\n" + grid);
  r = sweep();
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2 runs (2 done earlier)"), std::string::npos) << r.out;
  EXPECT_EQ(invocations().size(), 4u) << r.out;
}

// The config's base: files count as the config: an edit there is a changed config as well.
TEST_F(SweepTest, AnEditedBaseConfigIsAChangedConfig) {
  std::ofstream(dir_ / "b.yaml") << "trainer:\n  max_steps: 10\n";
  std::ofstream(dir_ / "c.yaml") << "base: b.yaml\n";
  write_sweep("config: c.yaml\ngrid:\n  optimizer.lr: [0.1]\nmetric: fake_metric\nmode: max\n");
  auto r = sweep();
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_EQ(invocations().size(), 1u);
  std::ofstream(dir_ / "b.yaml") << "trainer:\n  max_steps: 20\n";
  r = sweep();
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("config: run lr=0.1 has a result from another config"), std::string::npos)
      << r.out;
  EXPECT_EQ(invocations().size(), 1u) << "nothing may run";
}

// A run that wrote summary.json and then crashed keeps its folder (renamed <id>.failed-1, so the
// retry writes runs/<id>); with nothing printed, the reason is how it ended, not the sweep's
// own header line.
TEST_F(SweepTest, ACrashedRunsFolderIsKeptAndItsReasonIsHowItEnded) {
  write_sweep("grid:\n  optimizer.lr: [0.1, 0.3]\nmetric: fake_metric\nmode: max\n");
  auto r = sweep("FAKE_CRASH_LR=0.3");
  EXPECT_EQ(r.code, 1) << r.out;
  const fs::path runs = dir_ / "out" / "runs";
  EXPECT_TRUE(fs::exists(runs / "lr=0.3.failed-1" / "summary.json")) << r.out;
  EXPECT_FALSE(fs::exists(runs / "lr=0.3")) << r.out;
  auto s = state();
  EXPECT_EQ(s["runs"]["lr=0.3"]["status"], "failed");
  EXPECT_EQ(s["runs"]["lr=0.3"]["reason"], "killed by signal 9") << s.dump(2);
  EXPECT_EQ(s["runs"]["lr=0.3"]["run_dir"], (runs / "lr=0.3.failed-1").string());

  r = sweep();
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(runs / "lr=0.3" / "summary.json")) << r.out;
  EXPECT_TRUE(fs::exists(runs / "lr=0.3.failed-1" / "summary.json")) << r.out;
  EXPECT_EQ(state()["runs"]["lr=0.3"]["run_dir"], (runs / "lr=0.3").string());
}

// A NaN metric (null in summary.json) is a diverged result; a finished run without the metric key
// stays done and the report names the key and the closest one.
TEST_F(SweepTest, ANanMetricIsDivergedAndAMissingOneIsNamed) {
  write_sweep("grid:\n  optimizer.lr: [0.1, 0.2, 0.3]\nmetric: fake_metric\nmode: max\n");
  auto r = sweep("FAKE_NAN_LR=0.3 FAKE_NO_METRIC_LR=0.1");
  EXPECT_EQ(r.code, 0) << r.out;
  auto s = state();
  EXPECT_EQ(s["runs"]["lr=0.3"]["status"], "diverged");
  EXPECT_EQ(s["runs"]["lr=0.3"]["reason"],
            "fake_metric is not a finite number (null in "
            "summary.json)");
  EXPECT_EQ(s["runs"]["lr=0.1"]["status"], "done");
  EXPECT_NE(r.out.find("2 done, 1 diverged, 0 failed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("warning: 1 finished run(s) have no number 'fake_metric' in summary.json "
                       "(lr=0.1; did you mean 'fake_metrik'?"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("best: lr=0.2 -> "), std::string::npos) << r.out;
}

// A sweep directory with " #", ": " and quotes works (logging.run_dir is passed quoted); one with
// braces, which the program would expand as {fields}, is one line.
TEST_F(SweepTest, ASweepDirectoryWithYamlCharactersWorksAndBracesAreRefused) {
  write_sweep("grid:\n  optimizer.lr: [0.1]\nmetric: fake_metric\nmode: max\n");
  const std::string odd = "o #1: \"q\" 'x' [y]";
  auto r = fabric::testing::run_command(command("", "", "'o #1: \"q\" '\\''x'\\'' [y]'"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir_ / odd / "runs" / "lr=0.1" / "summary.json")) << r.out;
  r = fabric::testing::run_command(command("", "", "'o{name}'"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("command line: --dir=o{name}: the sweep directory " +
                       (dir_ / "o{name}").string() + " holds '{' or '}'"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(invocations().size(), 1u) << "nothing more may run";
}

// The SLURM script quotes what may hold spaces and keeps a '%' of the sweep directory literal.
TEST_F(SweepTest, TheSlurmScriptQuotesItsPaths) {
  write_sweep("grid:\n  optimizer.lr: [0.1]\nmetric: fake_metric\nmode: max\n");
  const auto r = fabric::testing::run_command(command("", "--launcher=slurm --dry_run", "'a b%c'"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("#SBATCH --job-name=\"sweep_s\"\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("#SBATCH --chdir=\"" + dir_.string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("#SBATCH --output=\"" + dir_.string() + "/a b%%c/slurm/%A_%a.out\"\n"),
            std::string::npos)
      << r.out;
}

// Runs start in the sweep file's folder (or its workdir:), also under `bazel run`
// (BUILD_WORKING_DIRECTORY): a relative path in an override means what it means there.
TEST_F(SweepTest, RunsStartInTheSweepFilesFolder) {
  fs::create_directories(dir_ / "sub");
  const std::string log = (dir_ / "roots").string();
  for (const std::string workdir : {"", "workdir: ..\n"}) {
    std::ofstream(dir_ / "sub" / "s.yaml")
        << "binary: " << fake_ << "\n"
        << workdir
        << "metric: fake_metric\nmode: max\noverrides: {data.root: data}\n"
           "grid: {optimizer.lr: [0.1]}\n";
    for (const std::string bazel_run :
         {std::string(), "BUILD_WORKING_DIRECTORY='" + dir_.string() + "' "}) {
      const std::string out = workdir.empty() ? "a" : "b";
      fs::remove_all(dir_ / out);
      auto r = fabric::testing::run_command("cd '" + dir_.string() + "' && FAKE_ROOT_LOG='" + log +
                                            "' " + bazel_run + "'" + sweep_ +
                                            "' --sweep=sub/s.yaml --dir=" + out);
      EXPECT_EQ(r.code, 0) << r.out;
    }
  }
  EXPECT_EQ(
      lines(read(log)),
      (std::vector<std::string>{(dir_ / "sub" / "data").string(), (dir_ / "sub" / "data").string(),
                                (dir_ / "data").string(), (dir_ / "data").string()}));
}

// A relative binary: means what it means where the runs start (the workdir:), wherever the sweep
// is started from (it was looked up from the working directory, then the sweep file's folder).
TEST_F(SweepTest, ARelativeBinaryIsFoundWhereTheRunsStart) {
  fs::create_directories(dir_ / "w" / "bin");
  fs::create_directories(dir_ / "files");
  const fs::path wrapper = dir_ / "w" / "bin" / "trainer";
  std::ofstream(wrapper) << "#!/bin/sh\nexec '" << fake_ << "' \"$@\"\n";
  fs::permissions(wrapper, fs::perms::owner_all);
  std::ofstream(dir_ / "files" / "s.yaml")
      << "binary: bin/trainer\nworkdir: ../w\nmetric: fake_metric\nmode: max\n"
         "grid: {optimizer.lr: [0.1]}\n";
  auto r = fabric::testing::run_command("cd / && '" + sweep_ +
                                        "' --sweep=" + (dir_ / "files" / "s.yaml").string() +
                                        " --dir=" + (dir_ / "relative").string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("1 done, 0 failed"), std::string::npos) << r.out;
}

// Parallel runs on CPU split the sweep's CPUs: with FABRIC_CPUS=4 and --parallel=2 each run gets
// FABRIC_CPUS=2, and the sweep says so; one run at a time keeps the whole budget.
TEST_F(SweepTest, ParallelRunsOnCpuSplitTheCpus) {
  write_sweep(kLrSeeds);
  const std::string log = (dir_ / "cpus").string();
  auto r = sweep("FABRIC_CPUS=4 FAKE_CPUS_LOG='" + log + "'", "--parallel=2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("parallel 2, 2 CPU(s) per run (FABRIC_CPUS)"), std::string::npos) << r.out;
  EXPECT_EQ(lines(read(log)), std::vector<std::string>(6, "2"));

  r = fabric::testing::run_command(
      command("FABRIC_CPUS=4 FAKE_CPUS_LOG='" + log + "'", "--parallel=1", "out1"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("CPU(s) per run"), std::string::npos) << r.out;
  const auto all = lines(read(log));
  ASSERT_EQ(all.size(), 12u);
  EXPECT_EQ(std::vector<std::string>(all.begin() + 6, all.end()), std::vector<std::string>(6, "4"));
}

// best.yaml: the best run's whole config (the first-ranked point lr 0.2, its better seed 2), which
// re-runs that trial: the program given --config=best.yaml reports the same metric.
TEST_F(SweepTest, BestYamlReRunsTheBestTrial) {
  write_sweep(kLrSeeds);
  auto r = sweep();
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("best: lr=0.2_seed=2 -> "), std::string::npos) << r.out;
  const fs::path best = dir_ / "out" / "best.yaml";
  const std::string text = read(best);
  ASSERT_FALSE(text.empty()) << r.out;
  EXPECT_EQ(text.rfind("# The best run of sweep s (fake_metric, max): lr=0.2_seed=2", 0), 0u)
      << text;
  EXPECT_NE(text.find("--config=" + best.string() + "\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("run_dir:"), std::string::npos) << text;
  EXPECT_EQ(text.find("resume:"), std::string::npos) << text;
  EXPECT_NE(text.find("lr: 0.2\n"), std::string::npos) << text;

  const auto rerun = fabric::testing::run_command("cd '" + dir_.string() + "' && '" + fake_ +
                                                  "' --config=out/best.yaml logging.run_dir=rerun");
  ASSERT_EQ(rerun.code, 0) << rerun.out;
  const auto summary = nlohmann::json::parse(read(dir_ / "rerun" / "summary.json"));
  EXPECT_EQ(summary["fake_metric"].get<double>(), fake_metric(0.2, 2));
}

// search: random end to end: `trials` runs with the drawn values on their command lines, ranked
// by the metric; raising trials on the same directory runs only the new points.
TEST_F(SweepTest, RandomSearchRunsTheDrawnTrialsAndMoreTrialsRunOnlyTheNewOnes) {
  const std::string space =
      "search: random\nspace: {optimizer.lr: {uniform: [0.05, 0.35]}}\nseeds: [1]\n"
      "metric: fake_metric\nmode: max\n";
  write_sweep(space + "trials: 3\n");
  auto r = sweep();
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_EQ(invocations().size(), 3u) << r.out;
  auto csv = lines(read(dir_ / "out" / "results.csv"));
  ASSERT_EQ(csv.size(), 4u) << read(dir_ / "out" / "results.csv");
  std::set<double> lrs;
  for (size_t i = 1; i < csv.size(); ++i) {
    std::istringstream row(csv[i]);
    std::vector<std::string> c;
    for (std::string cell; std::getline(row, cell, ',');) c.push_back(cell);
    ASSERT_GE(c.size(), 7u) << csv[i];
    EXPECT_EQ(c[1], "done") << csv[i];
    const double lr = std::stod(c[4]);
    EXPECT_GE(lr, 0.05);
    EXPECT_LE(lr, 0.35);
    EXPECT_NEAR(std::stod(c[6]), fake_metric(lr, 1), 1e-9) << csv[i];  // the run got this lr
    lrs.insert(lr);
  }
  EXPECT_EQ(lrs.size(), 3u);

  write_sweep(space + "trials: 5\n");
  r = sweep();
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(invocations().size(), 5u) << r.out;  // 3 + the 2 new points
  EXPECT_EQ(lines(read(dir_ / "out" / "results.csv")).size(), 6u);
}

// A run that stops on non-finite values (exit 3) is a result: recorded as diverged with its step,
// ranked after the finished points, the sweep exits 0, and a re-run does not repeat it.
TEST_F(SweepTest, DivergedRunsAreResultsNotFailures) {
  write_sweep(kLrSeeds);
  auto r = sweep("FAKE_DIVERGE_LR=0.3");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(invocations().size(), 6u) << r.out;
  EXPECT_NE(r.out.find("diverged lr=0.3_seed=1 in "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("4 done, 2 diverged, 0 failed, 0 not run"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("run the same command again"), std::string::npos) << r.out;
  EXPECT_EQ(state()["runs"]["lr=0.3_seed=2"]["status"], "diverged");

  auto csv = lines(read(dir_ / "out" / "results.csv"));
  int diverged = 0;
  for (const auto& row : csv) {
    if (row.rfind("lr=0.3_", 0) != 0) continue;
    ++diverged;
    EXPECT_EQ(row.rfind("lr=0.3_seed=", 0), 0u) << row;
    EXPECT_NE(row.find(",diverged,3,1,"), std::string::npos) << row;
    EXPECT_NE(row.find("detected at step 7"), std::string::npos) << row;
  }
  EXPECT_EQ(diverged, 2);
  const auto rows = lines(read(dir_ / "out" / "results.md"));
  ASSERT_GE(rows.size(), 7u);
  EXPECT_EQ(rows[4].rfind("| 1 | 0.2 |", 0), 0u) << rows[4];
  EXPECT_EQ(rows[6].rfind("| 3 | 0.3 | – | 0/2, 2 diverged |", 0), 0u) << rows[6];

  r = sweep("FAKE_DIVERGE_LR=0.3");  // nothing left to run
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(invocations().size(), 6u) << r.out;
}

TEST_F(SweepTest, InterruptStopsTheRunningRunAndTheRerunContinuesWithTheRest) {
  write_sweep(kLrSeeds);
  // Wait (bounded) until the third run is blocked, then press "Ctrl-C".
  const auto [pid, run_pid] = start_with_blocked_run("0.3");
  ASSERT_GT(pid, 0);
  ASSERT_GT(run_pid, 0) << read(dir_ / "first.out");
  kill(pid, SIGINT);
  const auto stopped = wait_for_exit(pid, std::chrono::seconds(60));
  ASSERT_TRUE(stopped) << "the sweep did not stop on SIGINT:\n" << read(dir_ / "first.out");
  const int status = *stopped;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGINT) << read(dir_ / "first.out");
  EXPECT_EQ(kill(run_pid, 0), -1) << "the interrupted run must be gone";
  auto s = state();
  EXPECT_EQ(s["runs"]["lr=0.1_seed=1"]["status"], "done");
  EXPECT_EQ(s["runs"]["lr=0.3_seed=1"]["status"], "interrupted");
  EXPECT_EQ(s["runs"]["lr=0.1_seed=2"]["status"], "pending");
  EXPECT_NE(read(dir_ / "first.out").find("4 not run"), std::string::npos)
      << read(dir_ / "first.out");

  const auto r = sweep();
  EXPECT_EQ(r.code, 0) << r.out;
  const auto calls = invocations();
  ASSERT_EQ(calls.size(), 7u) << r.out;  // 3 before the interrupt, then the 4 left
  EXPECT_EQ(calls[3], "0.3 1");
  EXPECT_EQ(calls[4], "0.1 2");
}

// kill -9 of the sweep itself: its running run dies with it (PR_SET_PDEATHSIG), the state file
// still says "running", and the same command then finishes the sweep without repeating the runs
// that had finished.
TEST_F(SweepTest, SweepKilledWithSigkillCompletesOnRerunWithoutRepeatingFinishedRuns) {
  write_sweep(kLrSeeds);
  const auto [pid, run_pid] = start_with_blocked_run("0.3");
  ASSERT_GT(pid, 0);
  ASSERT_GT(run_pid, 0) << read(dir_ / "first.out");
  kill(pid, SIGKILL);
  const auto stopped = wait_for_exit(pid, std::chrono::seconds(60));
  ASSERT_TRUE(stopped);
  EXPECT_TRUE(WIFSIGNALED(*stopped) && WTERMSIG(*stopped) == SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (kill(run_pid, 0) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(kill(run_pid, 0), -1) << "the run must die with the sweep";
  auto s = state();
  EXPECT_EQ(s["runs"]["lr=0.1_seed=1"]["status"], "done");
  EXPECT_EQ(s["runs"]["lr=0.2_seed=1"]["status"], "done");
  EXPECT_EQ(s["runs"]["lr=0.3_seed=1"]["status"], "running");  // as the killed sweep left it

  const auto r = sweep();
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("6 runs (2 done earlier)"), std::string::npos) << r.out;
  const auto calls = invocations();
  ASSERT_EQ(calls.size(), 7u) << r.out;  // 3 before the kill, then the 4 left: none repeated
  EXPECT_EQ(calls[3], "0.3 1");
  EXPECT_EQ(calls[4], "0.1 2");
  EXPECT_EQ(state()["runs"]["lr=0.3_seed=1"]["status"], "done");
}

// Many runs to check (each a start of the program) say so before the first check.
TEST_F(SweepTest, ChecksOfManyRunsSaySoFirst) {
  write_sweep(
      "search: random\ntrials: 21\nspace: {optimizer.lr: {uniform: [0.01, 1]}}\n"
      "metric: fake_metric\nmode: max\n");
  auto r = sweep("", "--dry_run");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("sweep: checking the configs of 21 runs ("), std::string::npos) << r.out;
}

// A metric no run reports: the sweep ends saying why best.yaml is missing, with the closest key.
TEST_F(SweepTest, AMetricNoRunReportsSaysWhyThereIsNoBest) {
  write_sweep("grid: {optimizer.lr: [0.1]}\nmetric: fake_metrc\nmode: max\n");
  auto r = sweep();
  EXPECT_NE(r.out.find("best.yaml not written: no finished run's summary.json has metric "
                       "'fake_metrc'; did you mean 'fake_metric'? (its numbers: "),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "out" / "best.yaml"));
}

TEST_F(SweepTest, ASweepFolderThatCannotBeOneIsAConfigError) {
  write_sweep("grid: {optimizer.lr: [0.1]}\nmetric: fake_metric\nmode: max\n");
  std::ofstream(dir_ / "a_file") << "x";
  auto r = fabric::testing::run_command(command("", "", "a_file/sweep"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("command line: --dir=a_file/sweep: cannot be the sweep's folder (Not a "
                       "directory); give a folder you can write"),
            std::string::npos)
      << r.out;
}

TEST_F(SweepTest, EveryRunIsCheckedBeforeAnyRuns) {
  write_sweep("grid:\n  optimizer.lr: [0.1, -1]\nmetric: fake_metric\nmode: max\n");
  auto r = sweep();
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("s.yaml:3:23: optimizer.lr: -1 is out of range: must be > 0.0 (run lr=-1)"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "invocations")) << "nothing may run";

  write_sweep("grid:\n  optimizer.lrr: [0.1]\nmetric: fake_metric\nmode: max\n");
  r = sweep();
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("s.yaml:3:3: 'optimizer.lrr' is not a key of"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("did you mean 'optimizer.lr'?"), std::string::npos) << r.out;

  write_sweep("grid:\n  optimizer.lr: [0.1]\nmetric: fake_metric\nmode: maximum\n");
  r = sweep();
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("s.yaml:5:7: mode: 'maximum' is not max or min"), std::string::npos)
      << r.out;
}

TEST_F(SweepTest, ASecondSweepOnTheSameDirectoryIsRefused) {
  write_sweep(kLrSeeds);
  fs::create_directories(dir_ / "out");
  const int fd = open((dir_ / "out" / ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX), 0);
  const auto r = sweep();
  close(fd);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("another sweep is running in"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "invocations"));
}

TEST_F(SweepTest, MaxRunsStartsOnlyThatMany) {
  write_sweep(kLrSeeds);
  auto r = sweep("", "--max_runs=2 --parallel=2");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(invocations().size(), 2u) << r.out;
  EXPECT_NE(r.out.find("2 done, 0 failed, 4 not run"), std::string::npos) << r.out;
  r = sweep("", "--parallel=3");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(invocations().size(), 6u) << r.out;
}

// The real example program by label (a data dependency of //tools:sweep), a few steps per run.
TEST_F(SweepTest, RunsTheFashionMnistExampleByLabel) {
  std::ofstream(dir_ / "s.yaml")
      << "binary: //examples:fashion_mnist\nconfig: fashion_mnist.yaml\n"
         "overrides: {trainer.max_steps: 3, trainer.limit_eval_batches: 2, model.width: 4, "
         "model.hidden: 8}\n"
         "grid:\n  optimizer.lr: [0.05, 0.1]\nmetric: test_accuracy\nmode: max\n";
  const auto r =
      fabric::testing::run_command("cd '" + dir_.string() + "' && BUILD_WORKING_DIRECTORY='" +
                                   dir_.string() + "' '" + sweep_ + "' --sweep=s.yaml --dir=out");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto csv = lines(read(dir_ / "out" / "results.csv"));
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_EQ(csv[0].rfind("run,status,exit_code,attempts,optimizer.lr,seed,test_accuracy,", 0), 0u)
      << csv[0];
  for (const char* id : {"lr=0.05", "lr=0.1"}) {
    const fs::path run = dir_ / "out" / "runs" / id;
    EXPECT_TRUE(fs::exists(run / "summary.json")) << id;
    EXPECT_TRUE(fs::exists(run / "metrics.csv")) << id;
    const auto summary = nlohmann::json::parse(read(run / "summary.json"));
    EXPECT_EQ(summary["steps"], 3);
  }
}

}  // namespace
