// Writing a checkpoint from every rank of a job: one file that global rank 0 writes, or a sharded
// folder (fabric/checkpoint/sharded.h) to which every rank writes its part, now or in the
// background (checkpoint.async). Every step that makes a checkpoint complete on disk is here:
// the temporary folder, the parts, the manifest, the rename that publishes it. Reading is
// read_checkpoint (sharded.h).
#ifndef FABRIC_CHECKPOINT_WRITER_H_
#define FABRIC_CHECKPOINT_WRITER_H_

#include <ATen/core/ivalue.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>

#include "fabric/core/rank_group.h"

namespace fabric {

// Ranks holding the same state: rank 0 writes `contents()` to `file` (crash-safe: a temporary
// file renamed over it); every rank returns once it is complete or throws rank 0's error.
// Collective.
void write_checkpoint_file(RankGroup& ranks, const std::filesystem::path& file,
                           const std::function<c10::IValue()>& contents);

// The sharded checkpoint folder `dir`: `contents` builds this rank's dict (with its pieces);
// every rank writes its shard file into a temporary folder, rank 0 also the common part, then,
// once all are complete, the manifest, and renames the folder to `dir` (replacing an earlier
// one). Collective: every rank throws the first failing rank's error, and `dir` is then
// untouched.
void write_sharded_checkpoint(RankGroup& ranks, const std::filesystem::path& dir,
                              const std::function<c10::IValue()>& contents);

// The same in the background. Collective now: the temporary folder. Returns what writes this
// rank's part of `snapshot` (a host copy of what `contents` above builds) without communication:
// its shard (rank 0 also the common part) into the folder; rank 0 then waits (polling the folder,
// at most `timeout`) until every rank's shard is complete, writes the manifest and renames the
// folder to `dir`. A rank whose write fails leaves its error beside its shard ("<shard>.failed"),
// which ends rank 0's wait with it. The writer throws fabric::Error on the rank that failed (rank 0
// also for the others).
std::function<void()> sharded_checkpoint_writer(RankGroup& ranks, const std::filesystem::path& dir,
                                                std::shared_ptr<const c10::IValue> snapshot,
                                                std::chrono::milliseconds timeout);

}  // namespace fabric

#endif  // FABRIC_CHECKPOINT_WRITER_H_
