// Whether a sweep's finished runs still match the sweep file: each run's recorded command line
// and config hash (RunRecord::command, config_hash) against what the run would get now.
#ifndef TOOLS_SWEEP_CHANGES_H_
#define TOOLS_SWEEP_CHANGES_H_

#include <string>
#include <vector>

#include "tools/sweep/runner.h"
#include "tools/sweep/spec.h"
#include "tools/sweep/state.h"

namespace fabric::sweep {

// A hash of the text of the config file `config` ("" for none or unreadable).
std::string config_text_hash(const std::string& config);

// The runs of `spec` with a result in `state` whose recorded command line (or config file's hash)
// differs from the one they would get now (a changed overrides:, config file, ...). Old state
// files without recorded command lines are not checked. Without `rerun_changed`, throws
// ConfigError "FILE:LINE:COL: KEY: run ID has a result from another command line: it ran with
// 'a=1', now 'a=2' (and N more run(s)); run with --rerun_changed ..., or give --dir= another
// folder ..."; with it, marks those runs pending and returns their ids.
std::vector<std::string> check_changed_runs(const SweepSpec& spec, SweepState& state,
                                            const RunnerOptions& options, bool rerun_changed);

}  // namespace fabric::sweep

#endif  // TOOLS_SWEEP_CHANGES_H_
