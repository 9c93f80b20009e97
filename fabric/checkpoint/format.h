// The checkpoint file of Fabric::save / Fabric::load, format version 1: a torch.save archive
// (fabric/checkpoint/archive.h) holding the dict
//   {"fabric": {"format_version": 1, "libtorch_version", "revision", "config" (resolved YAML),
//               "config_hash", "world_size", "saved_unix_time"},
//    "state": {entry name → entry value (fabric/checkpoint/checkpoint_state.h)},
//    "grad_scaler": {...} (16-mixed only),
//    "rng": [{"cpu": uint8 tensor, "cuda": [uint8 tensor per device],
//             "fp8_amax_history": {...} (fabric.fp8.recipe: delayed; fabric/nn/fp8_history.h)}
//            for each global rank]}
// Building and checking the dict is here; writing it from every rank is writer.h's, reading it
// read_checkpoint's (sharded.h).
#ifndef FABRIC_CHECKPOINT_FORMAT_H_
#define FABRIC_CHECKPOINT_FORMAT_H_

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fabric/checkpoint/checkpoint_state.h"
#include "fabric/checkpoint/rng_state.h"
#include "fabric/core/stateful.h"

namespace fabric {

// What the "fabric" entry records about the run that saved.
struct CheckpointMeta {
  std::string config_yaml;  // the resolved config
  std::string config_hash;
  int64_t world_size = 1;
};

// The file's contents: `state`'s entries as they are now, the GradScaler when there is one
// (16-mixed; `scaler`), and the generator states of every rank, in rank order, each rank's with
// the entries of its `extra_by_rank` dict beside them (empty: none).
c10::IValue checkpoint_contents(const CheckpointMeta& meta, const CheckpointState& state,
                                Stateful* scaler, const std::vector<RngState>& rng_by_rank,
                                const std::vector<c10::impl::GenericDict>& extra_by_rank = {});

// A loaded checkpoint, checked against `state`, ready to apply.
struct PreparedCheckpoint {
  std::vector<std::function<void()>> apply;  // writes everything back; cannot fail
  std::vector<std::string> warnings;         // one line each, without the file name
  std::string saved_config;                  // the saver's resolved config ("" if absent)
  // This rank's entry of "rng" (its generator states and extra_by_rank's; None if absent).
  c10::IValue rank_state;
};

// Checks `contents` (read from `source`) against `state`: every entry must fit, and with
// `strict` the entry names must match exactly (else names that differ are skipped with a
// warning). Also takes the GradScaler's state (when `scaler`) and rank `rank`'s generator states.
// Throws fabric::Error naming `source` and every problem; changes nothing. `explain`, when given,
// turns the saver's resolved config into a clause appended to that error (Fabric::load: the keys
// that differ from the running config, which usually say why entries or shapes do not fit).
PreparedCheckpoint prepare_checkpoint(
    const c10::IValue& contents, const std::string& source, const CheckpointState& state,
    bool strict, Stateful* scaler, int64_t rank,
    const std::function<std::string(const std::string&)>& explain = nullptr);

}  // namespace fabric

#endif  // FABRIC_CHECKPOINT_FORMAT_H_
