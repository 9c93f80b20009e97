// Fabric++'s umbrella header: everything the //:fabric target offers, in one include, for
// programs that want it all (examples/consumer/train.cc). Libraries and larger programs include
// what they use instead: fabric/fabric.h for the facade, and beside it
//   fabric/main.h                  run_main: --config, key=value overrides, exit statuses 0/1/2
//   fabric/callbacks.h             callbacks: the interface (callback.h), early stopping
//   fabric/checkpointer.h          periodic checkpoints, rotation, resume: auto
//   fabric/nonfinite_guard.h       trainer.stop_on_nonfinite
//   fabric/stop_signal.h           SIGTERM → checkpoint and exit 143
//   fabric/training/optimizers.h   the optimizer of the optimizer: section (fused where it can)
//   fabric/training/lr_scheduler.h the schedule of the scheduler: section
//   fabric/graphed_step.h whole training steps replayed as CUDA graphs
//   fabric/training/throughput.h   samples/s, TFLOP/s and MFU (FLOPs from flop_counter.h)
//   fabric/data/augment.h          device-side crop/flip/normalize
//   fabric/data/npy.h              NumPy .npy/.npz arrays (memory-mapped) and NpyDataset
//   fabric/data/image_folder.h     JPEG/PNG class folders, path,label lists and WebDataset shards
//   fabric/data/webdataset.h       tar shards: brace patterns, members, samples by key
//   fabric/nn/batch_norm.h         BatchNorm that can synchronize across processes (SyncBatchNorm)
//   fabric/nn/empty_init.h         a model built without memory, replayed at setup (init_module)
//   fabric/nn/tensor_parallel.h    Linear and Embedding a tensor-parallel plan can split, the
//                                  plan (TensorParallelPlanned), local_heads, sequence
//                                  parallelism's enter/leave (docs/tensor_parallel.md)
//   fabric/nn/fp8_layers.h         float8 nodes of several Linear layers, inputs cast by norms
//   fabric/nn/parallel_rng.h       RankRandomScope: dropout on a rank's own heads or positions
//   fabric/accelerators/memory.h   tensor memory per process: statistics, a limit
//   fabric/connector.h             how the config was resolved (Fabric::setup_info)
// The GPT and its token data are a second public target, //:gpt, kept out of what every program
// compiles (it is not included here):
//   fabric/models/gpt.h            a GPT-2 language model (presets gpt2 .. gpt2-xl, tiny)
//   fabric/data/tokens.h           token files in nanoGPT's format (TokenDataset), text → tokens
//   fabric/data/bpe.h              GPT-2's byte-level BPE tokenizer (vocab.json + merges.txt)
#ifndef FABRIC_ALL_H_
#define FABRIC_ALL_H_

#include "fabric/accelerators/memory.h"
#include "fabric/callbacks.h"
#include "fabric/checkpointer.h"
#include "fabric/connector.h"
#include "fabric/data/augment.h"
#include "fabric/data/image_folder.h"
#include "fabric/data/npy.h"
#include "fabric/data/webdataset.h"
#include "fabric/fabric.h"
#include "fabric/graphed_step.h"
#include "fabric/main.h"
#include "fabric/nn/batch_norm.h"
#include "fabric/nn/fp8_layers.h"
#include "fabric/nn/parallel_rng.h"
#include "fabric/nn/tensor_parallel.h"
#include "fabric/nonfinite_guard.h"
#include "fabric/stop_signal.h"
#include "fabric/training/activation_checkpoint.h"
#include "fabric/training/ema.h"
#include "fabric/training/flop_counter.h"
#include "fabric/training/lr_scheduler.h"
#include "fabric/training/optimizers.h"
#include "fabric/training/state_bytes.h"
#include "fabric/training/throughput.h"

#endif  // FABRIC_ALL_H_
