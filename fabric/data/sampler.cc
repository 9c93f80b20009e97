#include "fabric/data/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>

#include "fabric/core/error.h"
#include "fabric/core/hash.h"

namespace fabric {
namespace {

// Uniform draws below n, the i-th a function of (key, i) only: no library distribution whose
// output differs between standard libraries.
class Draws {
 public:
  Draws(uint64_t seed, int64_t epoch, int64_t stream)
      : key_(splitmix64(splitmix64(seed) ^ splitmix64(static_cast<uint64_t>(epoch) + 0x51ED27ULL) ^
                        (static_cast<uint64_t>(stream) * 0xD1B54A32D192ED03ULL))) {}
  uint64_t below(uint64_t n) {
    const uint64_t x = splitmix64(key_ + 0x9E3779B97F4A7C15ULL * ++count_);
    return static_cast<uint64_t>((static_cast<unsigned __int128>(x) * n) >> 64);
  }

 private:
  uint64_t key_;
  uint64_t count_ = 0;
};

void check_rank(int64_t num_replicas, int64_t rank, const char* who) {
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas) {
    throw Error(std::string(who) +
                ": need num_replicas >= 1 and 0 <= rank < num_replicas, got rank " +
                std::to_string(rank) + " of " + std::to_string(num_replicas));
  }
}

// Examples per rank: ceil(total / R), or floor(total / R) with drop_last.
int64_t samples_per_rank(int64_t total, int64_t num_replicas, bool drop_last) {
  return drop_last ? total / num_replicas : (total + num_replicas - 1) / num_replicas;
}

// Positions [from, to) of the epoch's stream (to ≤ T), as dataset indices.
std::vector<int64_t> positions(const std::vector<int64_t>& order, const std::vector<int64_t>& sizes,
                               const std::vector<int64_t>& starts, int64_t from, int64_t to) {
  std::vector<int64_t> out;
  if (to <= from) return out;
  out.reserve(static_cast<size_t>(to - from));
  int64_t at = 0;  // stream position of the current shard's first sample
  for (int64_t s : order) {
    const int64_t size = sizes[static_cast<size_t>(s)];
    const int64_t lo = std::max(from, at), hi = std::min(to, at + size);
    for (int64_t p = lo; p < hi; ++p) out.push_back(starts[static_cast<size_t>(s)] + p - at);
    at += size;
    if (at >= to) break;
  }
  return out;
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank,
                                       bool shuffle, uint64_t seed, bool drop_last)
    : size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  check_rank(num_replicas_, rank_, "DistributedSampler");
  if (size_ < 0) throw Error("DistributedSampler: dataset size " + std::to_string(size_) + " < 0");
  num_samples_ = samples_per_rank(size_, num_replicas_, drop_last_);
}

void DistributedSampler::set_consumed(int64_t epoch, int64_t consumed) {
  skip_epoch_ = consumed > 0 ? epoch : -1;
  skip_ = consumed > 0 ? std::min(consumed, size_) : 0;
}

int64_t DistributedSampler::num_samples() const {
  if (epoch_ != skip_epoch_) return num_samples_;
  return samples_per_rank(size_ - skip_, num_replicas_, drop_last_);
}

int64_t DistributedSampler::num_real_samples() const {
  const int64_t n = num_samples();
  if (drop_last_) return n;
  // Rank r's j-th example is position r + j * R of the padded list; positions >= size wrap.
  const int64_t left = size_ - consumed_before(epoch_) - rank_;
  return left <= 0 ? 0 : std::min(n, (left + num_replicas_ - 1) / num_replicas_);
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
  // The rest of the order after what an earlier job of another shape read (set_consumed).
  const int64_t skip = consumed_before(epoch_), rest = size_ - skip;
  const int64_t n = num_samples(), total = n * num_replicas_;
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t pos = rank_; pos < total; pos += num_replicas_) {
    out.push_back(order[static_cast<size_t>(skip + pos % std::max<int64_t>(rest, 1))]);  // pad
  }
  return out;
}

StreamSampler::StreamSampler(std::vector<int64_t> shard_sizes, int64_t num_replicas, int64_t rank,
                             bool shuffle, uint64_t seed, bool drop_last, int64_t buffer)
    : shard_sizes_(std::move(shard_sizes)),
      total_(0),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last),
      buffer_(buffer) {
  check_rank(num_replicas_, rank_, "StreamSampler");
  if (buffer_ < 1) throw Error("StreamSampler: shuffle buffer " + std::to_string(buffer_) + " < 1");
  for (size_t s = 0; s < shard_sizes_.size(); ++s) {
    if (shard_sizes_[s] < 0)
      throw Error("StreamSampler: shard " + std::to_string(s) + " has a negative size");
    shard_start_.push_back(total_);
    total_ += shard_sizes_[s];
  }
  num_samples_ = samples_per_rank(total_, num_replicas_, drop_last_);
}

int64_t StreamSampler::num_real_samples() const {
  return std::max<int64_t>(0, std::min(num_samples_, total_ - rank_ * num_samples_));
}

std::vector<int64_t> StreamSampler::shard_order() const {
  std::vector<int64_t> order(shard_sizes_.size());
  for (size_t s = 0; s < order.size(); ++s) order[s] = static_cast<int64_t>(s);
  if (shuffle_) {  // Fisher-Yates, the same draws on every rank
    Draws draws(seed_, epoch_, -1);
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[draws.below(i)]);
  }
  return order;
}

std::vector<int64_t> StreamSampler::stream() const { return stream(shard_order()); }

std::optional<Sampler::ReadOrder> StreamSampler::read_order() const {
  // A copy of this epoch's sampler: the loader's own moves on to the next epoch meanwhile.
  return ReadOrder{stream(), [copy = *this](int64_t emitted) { return copy.stream_read(emitted); }};
}

std::vector<int64_t> StreamSampler::stream(const std::vector<int64_t>& order) const {
  const int64_t from = rank_ * num_samples_;
  return positions(order, shard_sizes_, shard_start_, from, from + num_real_samples());
}

std::vector<int64_t> StreamSampler::indices() const {
  const std::vector<int64_t> order = shard_order();
  std::vector<int64_t> real = stream(order);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(num_samples_));
  if (shuffle_ && buffer_ > 1) {
    Draws draws(seed_, epoch_, rank_);
    std::vector<int64_t> buf;
    buf.reserve(static_cast<size_t>(std::min<int64_t>(buffer_, num_samples_)));
    auto emit = [&] {
      std::swap(buf[draws.below(buf.size())], buf.back());
      out.push_back(buf.back());
      buf.pop_back();
    };
    for (int64_t index : real) {
      buf.push_back(index);
      if (static_cast<int64_t>(buf.size()) >= buffer_) emit();
    }
    while (!buf.empty()) emit();
  } else {
    out = std::move(real);
  }
  // Padding: the positions past T wrap to the start of the epoch's stream.
  const int64_t real_count = static_cast<int64_t>(out.size());
  if (real_count < num_samples_) {
    const int64_t from = rank_ * num_samples_ + real_count, to = (rank_ + 1) * num_samples_;
    for (int64_t p = from; p < to; ++p) {
      const int64_t wrapped = p % total_;
      out.push_back(positions(order, shard_sizes_, shard_start_, wrapped, wrapped + 1).at(0));
    }
  }
  return out;
}

int64_t StreamSampler::stream_read(int64_t emitted) const {
  const int64_t real = num_real_samples();
  if (emitted <= 0) return 0;
  if (!shuffle_ || buffer_ <= 1) return std::min(emitted, real);
  return std::min(real, emitted + buffer_ - 1);
}

}  // namespace fabric
