// fabric::DataLoader: batches of a Dataset for one rank, prepared ahead by background threads and
// delivered on the training device.
//
// Each pass (range-for over the loader) is one epoch: the first pass is epoch 0 and every later
// begin() advances the epoch, so shuffling changes per epoch without user code (set_epoch()
// overrides it; load_state() resumes in the middle of an epoch). The order is DistributedSampler's
// (or StreamSampler's: DataLoaderOptions::shuffle_buffer);
// batch b of epoch e is always built from the same indices and the same augmentation randomness (a
// generator seeded from seed, epoch and b), whatever the number of threads, so runs are
// reproducible.
//
// Threads (datasets on the CPU; num_workers -1 = automatic, see DataLoaderOptions): `num_workers`
// threads build batches (get_batch + transform), at most `prefetch` ahead of the consumer (at least
// one per worker); batches are yielded in order. On CUDA each worker pins the batch and copies it
// with non_blocking on a side stream; the consumer's stream waits for the copy. num_workers = 0
// builds batches in the training thread. Leaving a pass early (break) or starting a new one stops
// the workers of the old pass. A dataset on a GPU (Dataset::device(), fabric/data/augment.h) is
// read in the training thread whatever num_workers says. An exception thrown while building batch b
// is rethrown by the iterator at batch b.
//
// Not thread-safe: iterate from one thread.
//
// Example:
//   fabric::DataLoader loader(dataset, fabric::DataLoaderOptions{}.batch_size(64).shuffle(true));
//   for (fabric::Batch& batch : loader) { ... }
#ifndef FABRIC_DATA_DATA_LOADER_H_
#define FABRIC_DATA_DATA_LOADER_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fabric/core/arg.h"
#include "fabric/core/stateful.h"
#include "fabric/data/dataset.h"
#include "fabric/data/sampler.h"

namespace fabric {

// Per-batch CPU transform (augmentation, normalization); `gen` is seeded per (seed, epoch, batch).
using BatchTransform = std::function<Batch(Batch batch, at::Generator& gen)>;

struct DataLoaderOptions {
  static constexpr int64_t kAutoWorkers = -1;  // num_workers(kAutoWorkers): chosen per dataset
  FABRIC_ARG(int64_t, batch_size) = 1;         // Default: 1.
  FABRIC_ARG(bool, shuffle) = false;           // Default: false.
  FABRIC_ARG(bool, drop_last) = false;         // Default: false: the last batch may be smaller.
  // Default: kAutoWorkers: 0 (batches built in the training thread) for a dataset with cheap
  // batches (Dataset::cheap_batches(), e.g. TensorDataset) and no transform delivered on the CPU,
  // where a hand-over costs more than the batch (measured: docs/benchmarks.md, overhead); else 1.
  // 0 = none; N = N background threads.
  FABRIC_ARG(int64_t, num_workers) = -1;
  FABRIC_ARG(int64_t, prefetch) = 2;  // Default: 2 batches ready ahead.
  // Default: 0: the order is DistributedSampler's, a global shuffle of every example. N > 0: the
  // dataset is streamed as WebDataset streams it (StreamSampler, fabric/data/sampler.h): each rank
  // reads its contiguous part of the epoch's shard order front to back and shuffles through a
  // buffer of N examples. Exact resume holds as for the global shuffle. Either way, for datasets
  // that read files (not Dataset::cheap_batches()), a read-ahead thread hands the dataset
  // (Dataset::will_read) the examples about to be read, in read order, up to
  // 2 × max(prefetch, num_workers) batches ahead of the consumer (streamed: plus the up to N - 1
  // examples the buffer holds back), so the reads are under way before a worker decodes them
  // (measured: docs/benchmarks.md, "Read-ahead and streamed shards").
  FABRIC_ARG(int64_t, shuffle_buffer) = 0;
  // Default: unset: Fabric::setup_dataloader fills in fabric.seed; a bare DataLoader uses 0.
  FABRIC_ARG(std::optional<uint64_t>, seed) = std::nullopt;
  FABRIC_ARG(BatchTransform, transform) = nullptr;  // Default: none.
};

// Where and how batches are delivered (filled in by Fabric::setup_dataloader from the strategy).
struct LoaderPlacement {
  int64_t num_replicas = 1;
  int64_t rank = 0;
  torch::Device device = torch::kCPU;
  bool channels_last = false;  // 4-D batch data delivered in channels-last memory format
  // Fabric turned cuDNN benchmarking on (fabric.cudnn_benchmark). A pass's final short batch is
  // then handed out with benchmarking off and every full batch with it on: a new batch size makes
  // cuDNN time every convolution again (5-6 s for ResNet-50 on an H100, docs/benchmarks.md), a
  // cost worth paying for the shape every step has, not for one step an epoch. The switch is
  // the process-wide at::globalContext() flag, set in the thread that takes the batch.
  bool cudnn_benchmark = false;
};

class DataLoader : public Stateful {
 private:
  class Pass;

 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options,
             LoaderPlacement placement = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;
  DataLoader(DataLoader&&) noexcept = default;
  DataLoader& operator=(DataLoader&&) noexcept = default;

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;
    Batch& operator*();
    Batch* operator->() { return &**this; }
    Iterator& operator++();
    bool operator==(const Iterator& other) const { return index_ == other.index_; }
    bool operator!=(const Iterator& other) const { return index_ != other.index_; }

   private:
    friend class DataLoader;
    Iterator(std::shared_ptr<Pass> pass, int64_t index) : pass_(std::move(pass)), index_(index) {}
    std::shared_ptr<Pass> pass_;
    int64_t index_;
  };

  // Starts a pass over the next epoch (stopping any unfinished pass).
  Iterator begin();
  // Ends the pass in progress as if it had run to its end: state() (and a checkpoint) then says
  // what the next begin() does, the next epoch from its first batch. Call it after leaving a pass
  // early that the program will not continue (an evaluation on a few batches; Fabric::evaluate
  // with a limit does), so that a resumed run evaluates on the batches the live one would. A
  // pass left without it stays "in progress" in state(): how a training loop that stops mid-epoch
  // is resumed where it stopped.
  void end_pass();
  Iterator end();

  // Batches per pass for this rank.
  int64_t size() const;
  // The epoch the next begin() will run.
  int64_t next_epoch() const { return next_epoch_; }
  // The next begin() runs `epoch` from its first batch.
  void set_epoch(int64_t epoch);

  // Progress through the data, for checkpoints: the epoch in progress and how many of its batches
  // were handed out (the batch in the caller's hands counts as consumed). Between passes (and
  // after a finished pass): {next_epoch(), 0}.
  struct State {
    int64_t epoch = 0;
    int64_t batches = 0;
  };
  State state() const;
  // Resume: the next begin() runs `state.epoch` starting at batch `state.batches`, in the same
  // order and with the same augmentation randomness as the interrupted pass; if that was the
  // epoch's last batch, the next begin() runs the next epoch from its start. Stops a pass in
  // progress. Throws fabric::Error for negative values.
  void load_state(const State& state);
  // Streamed loaders (shuffle_buffer > 0): where rank `rank`'s stream stands at `state`, as
  // Dataset::locate gives it ({shard, byte offset} of the next example it reads; {-1, -1} when its
  // part of the epoch is read). Checkpoints record rank 0's, and a resume checks it (a changed
  // shard list or shard moves it). Throws fabric::Error for a loader that is not streamed.
  std::pair<int64_t, int64_t> stream_position(const State& state, int64_t rank) const;
  // Examples per pass for this rank.
  int64_t num_samples() const { return sampler_->num_samples(); }
  const DataLoaderOptions& options() const { return options_; }
  const LoaderPlacement& placement() const { return placement_; }

  // Stateful (a checkpoint entry): the State with what fixes the data's order at that point
  // (world size, batch size, samples per rank, shuffle, drop_last, seed, shuffle_buffer, for
  // streamed loaders rank 0's stream position) and how much of the epoch's global order was
  // read. Restoring in the middle of an epoch at the same shape resumes bitwise; at another world
  // size or batch size (a job that lost or gained ranks) the rest of the epoch's global order is
  // split over the new ranks, so no example of the epoch is read twice or skipped; a changed
  // order (shuffle, seed, drop_last, streaming) is refused, naming what changed
  // (data_loader_state.cc).
  c10::IValue save_state() const override;
  std::function<void()> prepare_restore(const c10::IValue& saved,
                                        const std::string& source) override;

 private:
  // What fixes the order of the data at `state` (a mid-epoch resume needs them unchanged).
  std::vector<std::pair<std::string, int64_t>> order_facts(const State& state) const;
  // How many positions of the epoch's global order were read at `state` (-1: streamed loader).
  int64_t consumed(const State& state) const;
  // Resume epoch `epoch` after `consumed` positions of its global order (another shape).
  void carry_over(int64_t epoch, int64_t consumed);

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  LoaderPlacement placement_;
  std::unique_ptr<Sampler> make_sampler(int64_t rank) const;
  std::unique_ptr<Sampler> sampler_;  // DistributedSampler, or StreamSampler (shuffle_buffer > 0)
  int64_t next_epoch_ = 0;
  int64_t next_batch_ = 0;  // where the next begin() starts (resume)
  std::shared_ptr<Pass> pass_;
};

}  // namespace fabric

#endif  // FABRIC_DATA_DATA_LOADER_H_
