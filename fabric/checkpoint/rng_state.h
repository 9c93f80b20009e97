// The random generator states of this process: torch's default CPU generator (dropout and
// initialization on CPU, torch::randperm, ...) and the default generator of every visible CUDA
// device. The data loader's shuffling and augmentation randomness need no state: they are
// functions of (seed, epoch, batch) (see fabric/data/data_loader.h).
#ifndef FABRIC_CHECKPOINT_RNG_STATE_H_
#define FABRIC_CHECKPOINT_RNG_STATE_H_

#include <torch/types.h>

#include <vector>

namespace fabric {

struct RngState {
  torch::Tensor cpu;                // uint8
  std::vector<torch::Tensor> cuda;  // uint8, one per visible CUDA device
};

RngState get_rng_state();
// Restores the CPU state and the states of the CUDA devices both `state` and this process have.
// Throws fabric::Error for a state of the wrong size (another LibTorch's generator).
void set_rng_state(const RngState& state);

}  // namespace fabric

#endif  // FABRIC_CHECKPOINT_RNG_STATE_H_
