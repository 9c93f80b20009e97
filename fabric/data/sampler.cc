#include "fabric/data/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "fabric/core/error.h"

namespace fabric {

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank,
                                       bool shuffle, uint64_t seed, bool drop_last)
    : size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  if (num_replicas_ < 1 || rank_ < 0 || rank_ >= num_replicas_ || size_ < 0) {
    throw Error(
        "DistributedSampler: need num_replicas >= 1 and 0 <= rank < num_replicas, got rank " +
        std::to_string(rank_) + " of " + std::to_string(num_replicas_));
  }
  num_samples_ = drop_last_ ? size_ / num_replicas_ : (size_ + num_replicas_ - 1) / num_replicas_;
}

int64_t DistributedSampler::num_real_samples() const {
  if (drop_last_) return num_samples_;
  // Rank r's j-th example is position r + j * R of the padded list; positions >= size wrap.
  const int64_t left = size_ - rank_;
  return left <= 0 ? 0 : std::min(num_samples_, (left + num_replicas_ - 1) / num_replicas_);
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order(static_cast<size_t>(size_));
  if (shuffle_) {
    at::Generator gen = at::detail::createCPUGenerator(seed_ + static_cast<uint64_t>(epoch_));
    torch::Tensor perm = torch::randperm(size_, gen, torch::kLong);
    std::copy_n(perm.data_ptr<int64_t>(), size_, order.begin());
  } else {
    for (int64_t i = 0; i < size_; ++i) order[static_cast<size_t>(i)] = i;
  }
  const int64_t total = num_samples_ * num_replicas_;
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(num_samples_));
  for (int64_t pos = rank_; pos < total; pos += num_replicas_) {
    out.push_back(order[static_cast<size_t>(pos % std::max<int64_t>(size_, 1))]);  // wrap = pad
  }
  return out;
}

}  // namespace fabric
