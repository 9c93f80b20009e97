// Fabric::save and Fabric::load's side of fabric/nn/fp8_history.h: delayed scaling's amax
// histories (fabric.fp8.recipe: delayed) of every rank, kept beside its generator states.
#ifndef FABRIC_FP8_CHECKPOINT_H_
#define FABRIC_FP8_CHECKPOINT_H_

#include <ATen/core/Dict.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "fabric/checkpoint/checkpoint_state.h"
#include "fabric/checkpoint/format.h"
#include "strategies/strategy.h"

namespace fabric::internal {

// Every rank's histories of the layers of `state`'s modules, as each rank's extra checkpoint
// entry {"fp8_amax_history": ...} (collective: every rank calls it; through `device`).
std::vector<c10::impl::GenericDict> gather_fp8_histories(Strategy& strategy,
                                                         const torch::Device& device,
                                                         const CheckpointState& state);

// Adds to `prepared` what gives this rank (`rank`) its saved histories back, or, when the file
// has none for it or they do not fit the model, a warning: delayed scaling seeds them again.
void prepare_fp8_histories(PreparedCheckpoint& prepared, const CheckpointState& state,
                           int64_t rank);

}  // namespace fabric::internal

#endif  // FABRIC_FP8_CHECKPOINT_H_
