// Sweep files: expansion into runs, run ids, one-line errors with the file position; the results
// table's statistics and order.
#include "tools/sweep/spec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "fabric/core/error.h"
#include "tools/sweep/report.h"
#include "tools/sweep/setup.h"
#include "tools/sweep/space.h"

namespace fabric::sweep {
namespace {

std::string error_of(const std::string& yaml) {
  try {
    parse_sweep(yaml, "s.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

constexpr const char* kHead = "binary: ./t\nmetric: acc\nmode: max\n";

TEST(SweepSpec, ListTimesGridTimesSeedsWithSeedsOutermost) {
  const auto spec = parse_sweep(std::string(kHead) +
                                    "overrides: {trainer.max_epochs: 1}\n"
                                    "list:\n  - {model.width: 8}\n  - {model.width: 16}\n"
                                    "grid:\n  optimizer.lr: [0.1, 0.2, 0.3]\n"
                                    "seeds: [7, 8]\n",
                                "s.yaml");
  ASSERT_EQ(spec.runs.size(), 12u);
  EXPECT_EQ(spec.name, "s");
  EXPECT_EQ(spec.dir, "sweeps/s");
  EXPECT_EQ(spec.swept_keys, (std::vector<std::string>{"optimizer.lr", "model.width"}));
  EXPECT_EQ(spec.runs[0].id, "lr=0.1_width=8_seed=7");
  EXPECT_EQ(spec.runs[1].id, "lr=0.2_width=8_seed=7");
  EXPECT_EQ(spec.runs[3].id, "lr=0.1_width=16_seed=7");
  EXPECT_EQ(spec.runs[6].id, "lr=0.1_width=8_seed=8");
  EXPECT_EQ(spec.runs[4].arguments(spec.common, spec.seed_key),
            (std::vector<std::string>{"trainer.max_epochs=1", "model.width=16", "optimizer.lr=0.2",
                                      "fabric.seed=7"}));
  EXPECT_EQ(spec.runs[4].value_origin[1], "s.yaml:9:23");
}

TEST(SweepSpec, ValuesKeepTheirYamlMeaning) {
  const auto spec = parse_sweep(std::string(kHead) +
                                    "grid:\n  optimizer.betas: [[0.9, 0.99]]\n"
                                    "  logging.run_name: ['a b', '0.5']\n",
                                "s.yaml");
  ASSERT_EQ(spec.runs.size(), 2u);
  EXPECT_EQ(spec.runs[0].overrides[0].second, "[0.9, 0.99]");
  EXPECT_EQ(spec.runs[0].overrides[1].second, "\"a b\"");
  EXPECT_EQ(spec.runs[1].overrides[1].second, "\"0.5\"");  // stays a string
  EXPECT_EQ(spec.runs[0].id, "betas=0.9_0.99_run_name=a_b");
}

TEST(SweepSpec, LongOrCollidingIdsGetAHash) {
  const auto spec =
      parse_sweep(std::string(kHead) + "grid:\n  model.name: ['a/b', 'a b']\n", "s.yaml");
  ASSERT_EQ(spec.runs.size(), 2u);
  EXPECT_NE(spec.runs[0].id, spec.runs[1].id);
  EXPECT_EQ(spec.runs[0].id.rfind("name=a_b-", 0), 0u) << spec.runs[0].id;
  const auto shared = short_names({"a.lr", "b.lr", "c.width"});
  EXPECT_EQ(shared.at("a.lr"), "a.lr");
  EXPECT_EQ(shared.at("c.width"), "width");
}

TEST(SweepSpec, ErrorsNameTheLineAndTheFix) {
  EXPECT_EQ(error_of(std::string(kHead) + "seed: [1]\n"),
            "s.yaml:4:1: unknown sweep key 'seed'; did you mean 'seeds'? (keys: name, binary, "
            "config, overrides, grid, list, seeds, parallel, metric, devices_per_run, mode, dir, "
            "seed_key, resume_runs, search, trials, space, random_seed, pruner, sampler, storage, "
            "study, workdir)");
  EXPECT_EQ(error_of("binary: x\nmode: max\ngrid: {a.b: [1]}\n"),
            "s.yaml: metric: missing; name a key of the runs' summary.json, e.g. metric: "
            "test_accuracy");
  EXPECT_EQ(error_of("binary: x\nmetric: m\ngrid: {a.b: [1]}\n"),
            "s.yaml: mode: missing; write mode: max (higher is better) or mode: min");
  EXPECT_EQ(error_of(std::string(kHead) + "grid:\n  optimizer.lr: 0.1\n"),
            "s.yaml:5:17: grid: optimizer.lr: expected a list of values, e.g. [0.1, 0.2]");
  EXPECT_EQ(error_of(std::string(kHead) + "grid:\n  lr: [0.1]\n"),
            "s.yaml:5:3: grid: 'lr' is not a config key like 'optimizer.lr'");
  EXPECT_EQ(error_of(std::string(kHead) + "overrides: {a.b: 1}\ngrid:\n  a.b: [2]\n"),
            "s.yaml:6:3: grid: 'a.b' is also in overrides: keep it in one place");
  EXPECT_EQ(error_of(std::string(kHead) + "grid:\n  fabric.seed: [1, 2]\n"),
            "s.yaml:5:3: grid: 'fabric.seed' is the seed key: list the values under seeds:");
  EXPECT_EQ(error_of(std::string(kHead) + "seeds: [1, 1]\n"),
            "s.yaml:4:12: seeds: 1 is listed twice");
  EXPECT_EQ(error_of(std::string(kHead) + "list:\n  - {a.b: 1}\n  - {a.b: 1}\n"),
            "s.yaml:6:5: list: this entry repeats an earlier one; remove one");
  EXPECT_EQ(error_of(std::string(kHead) + "parallel: 0\nseeds: [1]\n"),
            "s.yaml:4:11: parallel: 0 is out of range: must be >= 1");
  EXPECT_EQ(error_of(std::string(kHead) + "grid: [1\n"),
            "s.yaml:5:1: YAML syntax error: end of sequence flow not found");
  EXPECT_EQ(error_of(std::string(kHead)),
            "s.yaml: nothing to sweep: add grid:, list:, space: or seeds:");
}

// Sizes are checked before any run is planned (a huge trials: used to spin for minutes).
// The configs checked before a sweep: 1000 random trials over a real learning rate and an integer
// width are checked at each real's extremes and at each integer once; a grid's every choice.
TEST(SweepSpec, PreflightChecksEachKeySetValueAndExtremeOnce) {
  std::vector<SweepRun> runs(1000);
  for (size_t i = 0; i < runs.size(); ++i) {
    runs[i].id = std::to_string(i);
    runs[i].overrides = {{"optimizer.lr", std::to_string(0.5 + 0.001 * ((i * 7919) % 1000))},
                         {"model.width", std::to_string(16 << (i % 3))}};
  }
  runs[500].overrides[0].second = "1e-9";  // the smallest, written with an exponent
  runs.push_back({"extra", {{"fabric.precision", "bf16-mixed"}}, {}, std::nullopt, ""});
  std::vector<const SweepRun*> all;
  for (const auto& r : runs) all.push_back(&r);
  std::set<std::string> ids;
  for (const SweepRun* r : runs_to_check(all)) ids.insert(r->id);
  // Widths 16, 32, 64 first seen in runs 0-2; the largest lr 1.499 at i*7919 % 1000 == 999
  // (i = 321); the smallest 1e-9 in run 500; the other key set.
  EXPECT_EQ(ids, (std::set<std::string>{"0", "1", "2", "321", "500", "extra"}));
}

TEST(SweepSpec, MoreThan100000RunsAreRefusedAtOnce) {
  EXPECT_EQ(error_of(std::string(kHead) + "search: random\ntrials: 2000000000\n" +
                     "space: {optimizer.lr: loguniform(1e-4, 1)}\n"),
            "s.yaml:5:9: trials: 2000000000 is more runs than a sweep takes (at most 100000); "
            "lower trials:");
  std::string grid = std::string(kHead) + "grid:\n";
  for (const char* k : {"a.a", "a.b", "a.c", "a.d", "a.e", "a.f"})
    grid += std::string("  ") + k + ": [1, 2, 3, 4, 5, 6, 7, 8]\n";
  EXPECT_EQ(error_of(grid),
            "s.yaml:10:3: grid: with a.f the grid holds 32768 × 8 points, more than a sweep takes "
            "(at most 100000); fewer values or a random search:");
  std::string seeded = std::string(kHead) + "seeds: [";
  for (int i = 0; i < 20; ++i) seeded += std::to_string(i) + (i < 19 ? ", " : "]\ngrid:\n");
  for (const char* k : {"a.a", "a.b", "a.c", "a.d", "a.e"})
    seeded += std::string("  ") + k + ": [1, 2, 3, 4, 5, 6, 7, 8]\n";
  EXPECT_EQ(error_of(seeded),
            "s.yaml: the sweep expands to 32768 points × 1 list entries × 20 seeds, more runs than "
            "a sweep takes (at most 100000)");
}

// yaml-cpp keeps a key given twice; the last one used to win in silence (a grid of two "points"
// at one value, a second metric: ranking the runs).
TEST(SweepSpec, AKeyGivenTwiceIsAnErrorAtTheSecond) {
  EXPECT_EQ(error_of(std::string(kHead) + "grid:\n  optimizer.lr: [0.1]\n  optimizer.lr: [0.5]\n"),
            "s.yaml:6:3: grid.optimizer.lr: duplicate key (first at line 5); give each key once");
  EXPECT_EQ(error_of(std::string(kHead) + "metric: loss\ngrid: {a.b: [1]}\n"),
            "s.yaml:4:1: metric: duplicate key (first at line 2); give each key once");
  EXPECT_EQ(error_of(std::string(kHead) + "list:\n  - {a.b: 1, a.b: 2}\n"),
            "s.yaml:5:14: list[0].a.b: duplicate key (first at line 5); give each key once");
}

std::map<std::string, RunRecord> records(const SweepSpec& spec,
                                         const std::map<std::string, double>& metric) {
  std::map<std::string, RunRecord> out;
  for (const auto& run : spec.runs) {
    RunRecord r;
    auto it = metric.find(run.id);
    r.status = it == metric.end() ? RunStatus::kFailed : RunStatus::kDone;
    if (it != metric.end()) r.summary = {{"acc", it->second}, {"name", "x"}};
    r.wall_seconds = 2;
    out[run.id] = r;
  }
  return out;
}

// search: random draws `trials` points, each value inside its distribution, the same points on
// every parse, and raising trials only adds points.
constexpr const char* kRandom =
    "search: random\n"
    "space:\n"
    "  optimizer.lr: {loguniform: [0.0001, 1]}\n"
    "  optimizer.momentum: {uniform: [0.5, 0.99]}\n"
    "  model.width: {int: [16, 20]}\n"
    "  optimizer.name: [sgd, adamw]\n";

double value_of(const SweepRun& run, const std::string& key) {
  for (const auto& [k, v] : run.overrides)
    if (k == key) return std::stod(v);
  ADD_FAILURE() << key << " not in run " << run.id;
  return NAN;
}

TEST(SweepSpec, RandomSearchDrawsInsideEachDistributionReproducibly) {
  const auto spec =
      parse_sweep(std::string(kHead) + kRandom + "trials: 40\nseeds: [1, 2]\n", "s.yaml");
  ASSERT_EQ(spec.runs.size(), 80u);  // 40 points, each with both seeds
  EXPECT_EQ(spec.search, "random");
  EXPECT_EQ(spec.swept_keys, (std::vector<std::string>{"optimizer.lr", "optimizer.momentum",
                                                       "model.width", "optimizer.name"}));
  std::set<std::string> names, ids;
  std::set<int> widths;
  int lr_below_0_01 = 0;
  for (size_t i = 0; i < 40; ++i) {
    const SweepRun& run = spec.runs[i];
    ASSERT_EQ(run.overrides.size(), 4u) << run.id;
    const double lr = value_of(run, "optimizer.lr"), m = value_of(run, "optimizer.momentum");
    const double w = value_of(run, "model.width");
    EXPECT_GE(lr, 0.0001);
    EXPECT_LE(lr, 1.0);
    EXPECT_GE(m, 0.5);
    EXPECT_LE(m, 0.99);
    EXPECT_EQ(w, std::floor(w));
    widths.insert(static_cast<int>(w));
    lr_below_0_01 += lr < 0.01;
    names.insert(run.overrides[3].second);
    ids.insert(run.id);
    // The seed-2 copy of point i has the same values.
    EXPECT_EQ(spec.runs[40 + i].overrides, run.overrides);
  }
  EXPECT_EQ(ids.size(), 40u);
  EXPECT_EQ(widths, (std::set<int>{16, 17, 18, 19, 20}));  // int bounds are inclusive
  EXPECT_EQ(names, (std::set<std::string>{"sgd", "adamw"}));
  // Log-uniform over four decades: half the draws fall in the lower two (a uniform draw would
  // put 1 % there). Deterministic: the draws are a function of the file.
  EXPECT_GE(lr_below_0_01, 12);
  EXPECT_LE(lr_below_0_01, 28);

  const auto again =
      parse_sweep(std::string(kHead) + kRandom + "trials: 40\nseeds: [1, 2]\n", "s.yaml");
  const auto fewer =
      parse_sweep(std::string(kHead) + kRandom + "trials: 10\nseeds: [1, 2]\n", "s.yaml");
  const auto other = parse_sweep(
      std::string(kHead) + kRandom + "trials: 40\nseeds: [1, 2]\nrandom_seed: 1\n", "s.yaml");
  int same_as_other = 0;
  for (size_t i = 0; i < 40; ++i) {
    EXPECT_EQ(again.runs[i].id, spec.runs[i].id);
    same_as_other += other.runs[i].overrides == spec.runs[i].overrides;
  }
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(fewer.runs[i].id, spec.runs[i].id);
  EXPECT_EQ(same_as_other, 0);
}

TEST(SweepSpec, RandomSearchRedrawsRepeatsAndRefusesTooManyTrials) {
  const auto spec = parse_sweep(
      std::string(kHead) + "search: random\ntrials: 3\nspace: {model.width: [8, 16, 32]}\n",
      "s.yaml");
  std::set<std::string> ids;
  for (const auto& run : spec.runs) ids.insert(run.id);
  EXPECT_EQ(ids, (std::set<std::string>{"width=8", "width=16", "width=32"}));
  EXPECT_EQ(error_of(std::string(kHead) +
                     "search: random\ntrials: 4\nspace: {model.width: [8, 16, 32]}\n"),
            "s.yaml:5:9: trials: 4 distinct points were asked for, but space: holds only 3; "
            "lower trials:");
}

TEST(SweepSpec, RandomSearchErrorsNameTheLineAndTheFix) {
  const std::string head = std::string(kHead) + "search: random\n";
  EXPECT_EQ(error_of(head + "space: {optimizer.lr: {uniform: [0, 1]}}\n"),
            "s.yaml:4:9: search: random needs trials: (how many points to draw), e.g. trials: 8");
  EXPECT_EQ(error_of(head + "trials: 2\n"),
            "s.yaml:4:9: search: random needs space:, e.g. space: {optimizer.lr: {loguniform: "
            "[0.001, 1]}}");
  EXPECT_EQ(error_of(head + "trials: 2\nspace: {optimizer.lr: {logunifrom: [0.1, 1]}}\n"),
            "s.yaml:6:24: space: optimizer.lr: unknown distribution 'logunifrom'; did you mean "
            "'loguniform'? (distributions: uniform, loguniform, int, choice)");
  EXPECT_EQ(error_of(head + "trials: 2\nspace: {optimizer.lr: {loguniform: [0, 1]}}\n"),
            "s.yaml:6:36: space: optimizer.lr: loguniform: low must be above 0 (use uniform for "
            "ranges that reach 0)");
  EXPECT_EQ(error_of(head + "trials: 2\nspace: {optimizer.lr: {uniform: [1, 0.5]}}\n"),
            "s.yaml:6:33: space: optimizer.lr: uniform: low must be below high");
  EXPECT_EQ(error_of(head + "trials: 2\nspace: {model.width: {int: [8, 16.5]}}\n"),
            "s.yaml:6:32: space: model.width: '16.5' is not an integer");
  EXPECT_EQ(error_of(head + "trials: 2\nspace: {optimizer.lr: 0.1}\n"),
            "s.yaml:6:23: space: optimizer.lr: expected a distribution, e.g. {uniform: [0, 1]}, "
            "{loguniform: [0.001, 1]}, {int: [16, 64]} or a list of choices");
  EXPECT_EQ(error_of(head + "trials: 2\nspace: {optimizer.lr: [0.1]}\ngrid: {model.width: [8]}\n"),
            "s.yaml:7:7: grid: not used by search: random; write each key under space: as a list "
            "(a choice among its values)");
  EXPECT_EQ(error_of(std::string(kHead) + "search: grids\n"),
            "s.yaml:4:9: search: 'grids' is not grid, random or optuna; did you mean 'grid'?");
  EXPECT_EQ(error_of(std::string(kHead) + "grid: {optimizer.lr: [0.1]}\ntrials: 4\n"),
            "s.yaml:5:9: trials: only used by search: random or optuna; add search: random");
}

TEST(SweepSpec, OptunaSearchKeepsTheSpaceAndAsksForTheRunsLater) {
  const std::string head = std::string(kHead) + "search: optuna\n";
  const SweepSpec spec = parse_sweep(
      head + "trials: 5\nspace: {optimizer.lr: {loguniform: [0.001, 1]}, model.width: [8, 16]}\n",
      "s.yaml");
  EXPECT_TRUE(spec.runs.empty());
  ASSERT_EQ(spec.space.size(), 2u);
  EXPECT_EQ(spec.space[0].second.kind, "loguniform");
  EXPECT_EQ(spec.space[1].second.values, (std::vector<std::string>{"8", "16"}));
  EXPECT_EQ(spec.swept_keys, (std::vector<std::string>{"optimizer.lr", "model.width"}));
  EXPECT_EQ(spec.sampler, "TPESampler");
  EXPECT_EQ(spec.study, "s");
  EXPECT_EQ(spec.storage, "");
  const std::string space = "trials: 2\nspace: {optimizer.lr: [0.1, 0.2]}\n";
  EXPECT_EQ(error_of(head + "space: {optimizer.lr: [0.1]}\n"),
            "s.yaml:4:9: search: optuna needs trials: (how many points to ask Optuna for), e.g. "
            "trials: 8");
  EXPECT_EQ(error_of(head + space + "seeds: [1, 2]\n"),
            "s.yaml:7:8: seeds: not used by search: optuna (each trial is one run and Optuna is "
            "told its metric); remove it, or use search: random");
  EXPECT_EQ(parse_sweep(head + space + "pruner: {type: asha, metric: m}\n", "s.yaml").pruner.type,
            "asha");  // Optuna's SuccessiveHalvingPruner decides
  EXPECT_EQ(error_of(std::string(kHead) + "grid: {optimizer.lr: [0.1]}\nsampler: TPESampler\n"),
            "s.yaml:5:10: sampler: only used by search: optuna");
}

TEST(SweepSpec, PrunerSectionDefaultsAndErrors) {
  const std::string head = std::string(kHead) + "grid: {optimizer.lr: [0.1, 0.2]}\n";
  const SweepSpec asha =
      parse_sweep(head + "pruner: {type: asha, metric: test/accuracy, min_epochs: 2}\n", "s.yaml");
  EXPECT_EQ(asha.pruner.type, "asha");
  EXPECT_EQ(asha.pruner.metric, "test/accuracy");
  EXPECT_TRUE(asha.pruner.maximize);  // the sweep's mode
  EXPECT_TRUE(asha.pruner.by_epoch);
  EXPECT_EQ(asha.pruner.min_resource, 2);
  EXPECT_EQ(asha.pruner.reduction_factor, 3);
  const SweepSpec median = parse_sweep(
      head + "pruner: {type: median, metric: train/loss, mode: min, min_runs: 5}\n", "s.yaml");
  EXPECT_FALSE(median.pruner.maximize);
  EXPECT_FALSE(median.pruner.by_epoch);
  EXPECT_EQ(median.pruner.min_resource, 1);
  EXPECT_EQ(median.pruner.min_runs, 5);
  EXPECT_EQ(parse_sweep(head, "s.yaml").pruner.type, "");

  EXPECT_EQ(error_of(head + "pruner: {type: hyperband, metric: m}\n"),
            "s.yaml:5:16: pruner: type: 'hyperband' is not median or asha");
  EXPECT_EQ(error_of(head + "pruner: {type: asha}\n"),
            "s.yaml:5:9: pruner: metric: missing; name the metrics.csv column the decisions use, "
            "e.g. metric: test/accuracy");
  EXPECT_EQ(error_of(head + "pruner: {metric: m}\n"),
            "s.yaml:5:9: pruner: type: missing; write type: median or type: asha");
  EXPECT_EQ(error_of(head + "pruner: {type: asha, metric: m, min_steps: 2, min_epochs: 1}\n"),
            "s.yaml:5:47: pruner: give min_steps or min_epochs, not both");
  EXPECT_EQ(error_of(head + "pruner: {type: median, metric: m, reduction_factor: 2}\n"),
            "s.yaml:5:53: pruner: reduction_factor: only used by type: asha");
  EXPECT_EQ(error_of(head + "pruner: {type: asha, metric: m, reduction_factr: 2}\n"),
            "s.yaml:5:33: unknown pruner key 'reduction_factr'; did you mean 'reduction_factor'? "
            "(keys: type, metric, mode, min_steps, min_epochs, reduction_factor, min_runs)");
  EXPECT_EQ(error_of(head + "pruner: {type: asha, metric: m, reduction_factor: 1}\n"),
            "s.yaml:5:51: pruner: reduction_factor: 1 is out of range: must be >= 2");
  EXPECT_EQ(error_of(head + "pruner: {type: asha, metric: step}\n"),
            "s.yaml:5:30: pruner: metric: name a metrics.csv column the runs log, e.g. "
            "test/accuracy");
}

// Every shipped sweep file (configs/sweeps/) parses and has runs.
TEST(SweepSpec, EveryShippedSweepFileParses) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator("configs/sweeps")) {
    if (entry.path().extension() != ".yaml") continue;
    ++files;
    const SweepSpec spec = load_sweep(entry.path().string());
    EXPECT_FALSE(spec.runs.empty()) << entry.path();
  }
  EXPECT_GE(files, 3);
}

TEST(SweepReport, MeanAndSampleStdSortedByMode) {
  const double m = 7.0 / 3;
  EXPECT_NEAR(stats_of({1, 2, 4}).std,
              std::sqrt(((1 - m) * (1 - m) + (2 - m) * (2 - m) + (4 - m) * (4 - m)) / 2), 1e-12);
  EXPECT_EQ(stats_of({5}).std, 0);
  auto spec = parse_sweep(
      "binary: x\nmetric: acc\nmode: max\ngrid: {a.lr: [1, 2, 3]}\nseeds: [1, 2]\n", "s.yaml");
  const auto recs = records(
      spec,
      {{"lr=1_seed=1", 0.5}, {"lr=1_seed=2", 0.7}, {"lr=2_seed=1", 0.9}, {"lr=2_seed=2", 0.9}});
  std::string md = results_markdown(spec, recs);
  EXPECT_EQ(md,
            "| rank | lr | acc (max) | seeds | wall s |\n|---:|---|---:|---:|---:|\n"
            "| 1 | 2 | 0.9000 ± 0.0000 | 2/2 | 2.0 |\n"
            "| 2 | 1 | 0.6000 ± 0.1414 | 2/2 | 2.0 |\n"
            "| – | 3 | – | 0/2 | – |\n");
  spec.maximize = false;
  md = results_markdown(spec, recs);
  EXPECT_NE(md.find("| 1 | 1 | 0.6000"), std::string::npos) << md;
  const std::string csv = results_csv(spec, recs);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "run,status,exit_code,attempts,a.lr,seed,acc,wall_time_s,run_dir,reason");
  EXPECT_NE(csv.find("\nlr=1_seed=2,done,0,0,1,2,0.7,2,,\n"), std::string::npos) << csv;
}

// A key in both list: and space: would give the run both overrides (the last winning) and label
// its results with the other.
TEST(SweepSpec, AListKeyThatIsAlsoASpaceKeyIsRefused) {
  EXPECT_EQ(
      error_of(std::string(kHead) + "search: random\ntrials: 2\nspace: {optimizer.lr: [0.1, 0.2]}\n"
                                    "list:\n  - {optimizer.lr: 0.5}\n"),
      "s.yaml:8:6: list: 'optimizer.lr' is also a space key: keep it in one place");
}

// Counts that become an int are capped: 4294967296 used to wrap to 0 (a division by zero).
TEST(SweepSpec, CountsBeyondAnIntAreOneLine) {
  EXPECT_EQ(error_of(std::string(kHead) + "parallel: 4294967296\nseeds: [1]\n"),
            "s.yaml:4:11: parallel: 4294967296 is out of range: must be <= 1000000");
  EXPECT_EQ(error_of(std::string(kHead) + "devices_per_run: 4294967296\nseeds: [1]\n"),
            "s.yaml:4:18: devices_per_run: 4294967296 is out of range: must be <= 1000000");
  EXPECT_EQ(error_of(std::string(kHead) +
                     "grid: {optimizer.lr: [0.1]}\n"
                     "pruner: {type: asha, metric: m, reduction_factor: 4294967296}\n"),
            "s.yaml:5:51: pruner: reduction_factor: 4294967296 is out of range: must be <= "
            "1000000");
}

// Drawn values stay inside [low, high] and a narrow range gets the digits to tell its values
// apart; ordinary ranges keep four significant digits.
TEST(SweepSpec, RandomValuesStayInsideNarrowRanges) {
  const auto spec = parse_sweep(std::string(kHead) +
                                    "search: random\ntrials: 30\nspace:\n"
                                    "  optimizer.momentum: {uniform: [0.999, 0.99999]}\n"
                                    "  optimizer.lr: {uniform: [0.05, 0.35]}\n",
                                "s.yaml");
  ASSERT_EQ(spec.runs.size(), 30u);
  std::set<std::string> momenta;
  for (const auto& run : spec.runs) {
    const double m = value_of(run, "optimizer.momentum"), lr = value_of(run, "optimizer.lr");
    EXPECT_GE(m, 0.999) << run.id;
    EXPECT_LE(m, 0.99999) << run.id;
    momenta.insert(run.overrides[0].second);
    char four[32];  // four significant digits, as before
    std::snprintf(four, sizeof(four), "%.4g", lr);
    EXPECT_EQ(run.overrides[1].second, four);
  }
  EXPECT_EQ(momenta.size(), 30u);
  // A value that rounds outside the range is its bound, written inside it.
  Distribution d;
  d.kind = "uniform";
  d.low = 0.12345678;
  d.high = 0.2;
  EXPECT_GE(std::stod(number_in(d, 0.12345678)), d.low) << number_in(d, 0.12345678);
  d.low = 0.5;
  d.high = 0.99999;
  EXPECT_LE(std::stod(number_in(d, 0.999995)), d.high) << number_in(d, 0.999995);
}

// A point with a failed run ranks after every point whose runs all finished, and best.yaml comes
// only from a complete point.
TEST(SweepReport, APointWithFailedRunsRanksAfterCompletePoints) {
  const auto spec = parse_sweep(
      "binary: x\nmetric: acc\nmode: max\ngrid: {a.lr: [1, 2]}\nseeds: [1, 2, 3]\n", "s.yaml");
  // lr 1: one lucky seed of three; lr 2: all three, lower.
  const auto recs = records(
      spec,
      {{"lr=1_seed=1", 0.99}, {"lr=2_seed=1", 0.8}, {"lr=2_seed=2", 0.8}, {"lr=2_seed=3", 0.8}});
  const std::string md = results_markdown(spec, recs);
  EXPECT_NE(md.find("| 1 | 2 | 0.8000 ± 0.0000 | 3/3 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 2 | 1 | 0.9900 | 1/3 |"), std::string::npos) << md;
  // No complete point: no best.yaml (and no config.yaml read).
  const auto partial = records(spec, {{"lr=1_seed=1", 0.99}, {"lr=2_seed=1", 0.8}});
  EXPECT_FALSE(best_config(spec, partial, "best.yaml").has_value());
}

}  // namespace
}  // namespace fabric::sweep
