// Context parallelism's pieces the models share (issue 71): the cp group their attention layers
// run fabric::nn::ring_attention over, and the global positions of a rank's tokens. The GPT
// (GPTImpl::set_context_parallel) and the Llama family (LlamaImpl::set_context_parallel) use
// them; their headers only declare ContextParallelGroup, so that they need no c10d.
#ifndef FABRIC_MODELS_CONTEXT_PARALLEL_H_
#define FABRIC_MODELS_CONTEXT_PARALLEL_H_

#include <torch/types.h>

#include <cstdint>

#include "fabric/nn/tensor_parallel.h"

namespace fabric::models {

// The process group of context parallelism, shared by every attention layer of a model.
struct ContextParallelGroup {
  fabric::nn::ProcessGroupPtr group;
};

// The global positions of this rank's `local` tokens, int64 [local] on `device`:
// fabric::nn::cp_rank_positions(local · cp, cp, rank) (chunks rank and 2·cp − 1 − rank of 2·cp),
// cp and rank those of cp.group. Throws cp_chunk_size's fabric::Error (T, cp, the nearest valid
// lengths) when 2·cp does not divide T = local · cp.
torch::Tensor context_parallel_positions(const ContextParallelGroup& cp, int64_t local,
                                         const torch::Device& device);

}  // namespace fabric::models

#endif  // FABRIC_MODELS_CONTEXT_PARALLEL_H_
