// fabric::DistributedSampler: which examples this rank sees in an epoch, in which order.
//
// Same contract as torch.utils.data.DistributedSampler: with shuffle, the permutation is
// randperm(size) from a CPU generator seeded with seed + epoch (identical on every rank, so ranks
// take disjoint slices); rank r takes positions r, r + R, r + 2R, ... of it. Without drop_last the
// list is padded by wrapping around so every rank gets ceil(size / R) examples; with drop_last
// it is truncated to floor(size / R) * R.
#ifndef FABRIC_DATA_SAMPLER_H_
#define FABRIC_DATA_SAMPLER_H_

#include <cstdint>
#include <vector>

namespace fabric {

class DistributedSampler {
 public:
  // REQUIRES: num_replicas ≥ 1, 0 ≤ rank < num_replicas, dataset_size ≥ 0 (throws fabric::Error).
  DistributedSampler(int64_t dataset_size, int64_t num_replicas = 1, int64_t rank = 0,
                     bool shuffle = true, uint64_t seed = 0, bool drop_last = false);

  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // This rank's indices for the current epoch.
  std::vector<int64_t> indices() const;
  // Examples per rank per epoch.
  int64_t num_samples() const { return num_samples_; }
  // How many of them are distinct examples: the first num_real_samples() of indices(); the rest
  // (at most one, only without drop_last) repeat earlier examples to even out the ranks.
  int64_t num_real_samples() const;

 private:
  int64_t size_, num_replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t num_samples_;
};

}  // namespace fabric

#endif  // FABRIC_DATA_SAMPLER_H_
