// Which examples a rank sees in an epoch, in which order (the DataLoader's choice of the two):
//   DistributedSampler  a global shuffle of every example (DataLoaderOptions::shuffle_buffer 0)
//   StreamSampler       shards read front to back with a shuffle buffer, as WebDataset streams
//                       them (shuffle_buffer > 0)
//
// fabric::DistributedSampler: same contract as torch.utils.data.DistributedSampler: with shuffle,
// the permutation is randperm(size) from a CPU generator seeded with seed + epoch (identical on
// every rank, so ranks take disjoint slices); rank r takes positions r, r + R, r + 2R, ... of it.
// Without drop_last the list is padded by wrapping around so every rank gets ceil(size / R)
// examples; with drop_last it is truncated to floor(size / R) * R.
#ifndef FABRIC_DATA_SAMPLER_H_
#define FABRIC_DATA_SAMPLER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace fabric {

// What the DataLoader asks of either sampler.
class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual void set_epoch(int64_t epoch) = 0;
  // This rank's indices for the current epoch: num_samples() of them, the first
  // num_real_samples() distinct, the rest repeating earlier examples (padding).
  virtual std::vector<int64_t> indices() const = 0;
  virtual int64_t num_samples() const = 0;
  virtual int64_t num_real_samples() const = 0;

  // The order this rank reads its examples in, when it is not the order they are handed out
  // (the DataLoader reads ahead in it: Dataset::will_read).
  struct ReadOrder {
    std::vector<int64_t> examples;  // every real example of the epoch, in reading order
    // How many of `examples` have been read when the first `emitted` indices() are handed out.
    std::function<int64_t(int64_t emitted)> read_when;
  };
  // nullopt (the default): examples are read as indices() hands them out.
  virtual std::optional<ReadOrder> read_order() const { return std::nullopt; }
};

class DistributedSampler : public Sampler {
 public:
  // REQUIRES: num_replicas ≥ 1, 0 ≤ rank < num_replicas, dataset_size ≥ 0 (throws fabric::Error).
  DistributedSampler(int64_t dataset_size, int64_t num_replicas = 1, int64_t rank = 0,
                     bool shuffle = true, uint64_t seed = 0, bool drop_last = false);

  void set_epoch(int64_t epoch) override { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // This rank's indices for the current epoch.
  std::vector<int64_t> indices() const override;
  // Examples per rank per epoch (of epoch set_consumed named: of the rest).
  int64_t num_samples() const override;
  // Epoch `epoch` resumes after the first `consumed` positions of its global order (the
  // shuffled dataset that rank r reads at positions r, r + R, r + 2R, ...), read by a job of
  // another shape: that epoch hands out the rest, split over this sampler's ranks the same way.
  // Other epochs are whole. consumed <= 0 clears it.
  void set_consumed(int64_t epoch, int64_t consumed);
  // The positions of `epoch`'s global order read before its first index (0 but for the epoch
  // of set_consumed).
  int64_t consumed_before(int64_t epoch) const { return epoch == skip_epoch_ ? skip_ : 0; }
  // How many of them are distinct examples: the first num_real_samples() of indices(); the rest
  // (at most one, only without drop_last) repeat earlier examples to even out the ranks.
  int64_t num_real_samples() const override;

 private:
  int64_t size_, num_replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t num_samples_;
  int64_t skip_epoch_ = -1, skip_ = 0;  // set_consumed
};

// fabric::StreamSampler: the order in which WebDataset streams shards (webdataset's
// split_by_node + shuffle(buffer)), made exact and even over ranks. The dataset's indices fall
// into shards (shard_sizes: the first shard_sizes[0] indices are shard 0, ...). Each epoch:
//  1. the shards are put in the epoch's order: a permutation drawn from (seed, epoch) with shuffle
//     (the same on every rank), else as given;
//  2. their samples, in that order, are one stream of T samples, and rank r takes its contiguous
//     part: positions [r·n, r·n + n) with n = ceil(T / R) (positions ≥ T wrap to the start:
//     padding, on the last ranks only) or, with drop_last, n = floor(T / R). So a rank reads a
//     run of whole shards (and the ends of at most two more) front to back;
//  3. with shuffle and buffer > 1, the rank's real samples pass through a shuffle buffer of
//     `buffer` samples: each sample read goes in; once it holds `buffer`, one drawn uniformly
//     leaves (is the next example); at the end of the part the rest leave in random order. The
//     draws come from a counter-based generator of (seed, epoch, rank): the same on every
//     machine. Padding follows the real samples, unshuffled.
// An example therefore leaves at most buffer - 1 positions before it is read (stream_read()), so
// a reader that keeps `buffer` samples (plus the batches in flight) ahead of the consumer reads
// every shard sequentially; the indices are exact for any epoch, so a resumed run continues with
// the batches of the uninterrupted one. The shuffle is local: examples of one shard stay close
// together; a buffer of several shards' worth and many shards mix best (webdataset's advice).
class StreamSampler : public Sampler {
 public:
  // REQUIRES: num_replicas ≥ 1, 0 ≤ rank < num_replicas, every shard size ≥ 0, buffer ≥ 1
  // (throws fabric::Error).
  StreamSampler(std::vector<int64_t> shard_sizes, int64_t num_replicas, int64_t rank, bool shuffle,
                uint64_t seed, bool drop_last, int64_t buffer);

  void set_epoch(int64_t epoch) override { epoch_ = epoch; }
  std::vector<int64_t> indices() const override;
  int64_t num_samples() const override { return num_samples_; }
  int64_t num_real_samples() const override;
  // This rank's real samples of the current epoch in the order they are read (before the
  // shuffle buffer).
  std::vector<int64_t> stream() const;
  // stream(), with stream_read() of this epoch.
  std::optional<ReadOrder> read_order() const override;
  // How many of stream() have been read when the first `emitted` indices() have left the buffer.
  int64_t stream_read(int64_t emitted) const;

 private:
  std::vector<int64_t> shard_order() const;  // the epoch's shard order
  std::vector<int64_t> stream(const std::vector<int64_t>& order) const;
  std::vector<int64_t> shard_sizes_, shard_start_;
  int64_t total_, num_replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t buffer_;
  int64_t epoch_ = 0;
  int64_t num_samples_;
};

}  // namespace fabric

#endif  // FABRIC_DATA_SAMPLER_H_
