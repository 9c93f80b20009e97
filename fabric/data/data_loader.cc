#include "fabric/data/data_loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>

#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#ifdef FABRIC_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "fabric/core/error.h"
#include "fabric/core/hash.h"

namespace fabric {

namespace {

// Seed of batch `b` of `epoch`: a SplitMix64 mix so neighbouring batches get unrelated streams.
uint64_t batch_seed(uint64_t seed, int64_t epoch, int64_t b) {
  return mix64(seed ^ (static_cast<uint64_t>(epoch) * 0x9E3779B97F4A7C15ULL) ^
               (static_cast<uint64_t>(b) * 0xBF58476D1CE4E5B9ULL));
}

}  // namespace

// One epoch's worth of batches, built ahead by worker threads and consumed in order.
class DataLoader::Pass {
 public:
  Pass(std::shared_ptr<const Dataset> dataset, const DataLoaderOptions& options,
       const LoaderPlacement& placement, const Sampler& sampler, int64_t epoch, int64_t start)
      : dataset_(std::move(dataset)),
        options_(options),
        placement_(placement),
        indices_(sampler.indices()),
        num_real_(sampler.num_real_samples()),
        epoch_(epoch),
        start_(start),
        next_(start),
        consumed_(start),
        delivered_(start) {
    const int64_t n = static_cast<int64_t>(indices_.size());
    const int64_t bs = options_.batch_size();
    num_batches_ = options_.drop_last() ? n / bs : (n + bs - 1) / bs;
    capacity_ = std::max(options_.prefetch(), options_.num_workers());
    for (int64_t w = 0; w < options_.num_workers(); ++w) workers_.emplace_back([this] { work(); });
    // Read-ahead for datasets that read files (not in-memory ones): in the order the examples
    // are read, each example as many places ahead as the sampler lets it leave early.
    if (auto order = sampler.read_order()) {
      stream_ = std::move(order->examples);
      reader_ = std::thread([this, read_when = std::move(order->read_when)] {
        read_ahead(stream_, static_cast<int64_t>(stream_.size()), read_when);
      });
    } else if (!dataset_->cheap_batches()) {
      reader_ = std::thread([this, real = std::min<int64_t>(num_real_, n)] {
        read_ahead(indices_, real, [real](int64_t emitted) { return std::min(emitted, real); });
      });
    }
  }

  ~Pass() {
    if (placement_.cudnn_benchmark) at::globalContext().setBenchmarkCuDNN(true);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopped_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    if (reader_.joinable()) reader_.join();
  }

  int64_t num_batches() const { return num_batches_; }
  int64_t epoch() const { return epoch_; }
  // Batches of this epoch handed out so far (the one in the caller's hands included).
  int64_t delivered() const { return delivered_; }

  // Batch `b`, waiting for its worker (or building it here without workers).
  Batch& get(int64_t b) {
    if (b == current_index_) return current_;
    if (in_thread_) {
      if (reader_.joinable()) {  // let the read-ahead move on
        std::lock_guard<std::mutex> lock(mutex_);
        consumed_ = b;
        cv_.notify_all();
      }
      current_ = build(b);
    } else {
      std::unique_lock<std::mutex> lock(mutex_);
      consumed_ = b;  // earlier batches are done with: workers may run further ahead
      cv_.notify_all();
      cv_.wait(lock, [&] { return ready_.count(b) > 0; });
      Slot slot = std::move(ready_.at(b));
      ready_.erase(b);
      lock.unlock();
      if (slot.error) std::rethrow_exception(slot.error);
      current_ = std::move(slot.batch);
      wait_for_copy(slot);
    }
    current_index_ = b;
    delivered_ = b + 1;
    if (placement_.cudnn_benchmark) at::globalContext().setBenchmarkCuDNN(b < num_full_batches());
    return current_;
  }

 private:
  int64_t num_full_batches() const {
    return static_cast<int64_t>(indices_.size()) / options_.batch_size();
  }

  struct Slot {
    Batch batch;
    std::exception_ptr error;
#ifdef FABRIC_WITH_CUDA
    std::shared_ptr<at::cuda::CUDAEvent> copied;
#endif
  };

  Batch build(int64_t b) {
    const int64_t bs = options_.batch_size();
    const int64_t begin = b * bs;
    const int64_t end = std::min<int64_t>(begin + bs, static_cast<int64_t>(indices_.size()));
    std::vector<int64_t> ids(indices_.begin() + begin, indices_.begin() + end);
    // One generator per batch: the dataset draws first (random crops while decoding), then
    // the transform.
    at::Generator gen =
        at::detail::createCPUGenerator(batch_seed(options_.seed().value_or(0), epoch_, b));
    Batch batch = dataset_->get_batch(ids, gen);
    if (options_.transform()) batch = options_.transform()(std::move(batch), gen);
    batch.padding = end - std::max(begin, std::min(end, num_real_));
    if (placement_.channels_last && batch.data.dim() == 4)
      batch.data = batch.data.contiguous(at::MemoryFormat::ChannelsLast);
    if (in_thread_ && placement_.device != torch::kCPU) {
      batch.data = batch.data.to(placement_.device);
      if (batch.target.defined()) batch.target = batch.target.to(placement_.device);
    }
    return batch;
  }

  void work() {
    for (;;) {
      int64_t b;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] {
          return stopped_ || (next_ < num_batches_ && next_ < consumed_ + capacity_);
        });
        if (stopped_) return;
        b = next_++;
      }
      Slot slot;
      try {
        slot.batch = build(b);
        copy_to_device(slot);
      } catch (...) {
        slot.error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ready_.emplace(b, std::move(slot));
      }
      cv_.notify_all();
    }
  }

  // Hands the dataset the first `n` of `order` (the examples in the order they are read) ahead
  // of use (Dataset::will_read), in chunks of a batch, keeping those of the batches in flight and
  // of the next `capacity_` ones asked for. `reads_before(k)`: how many have been read when k
  // examples have been handed out (k itself for a global shuffle; with a shuffle buffer, up to
  // buffer - 1 more). Examples a resumed pass's shuffle buffer held are read on demand.
  void read_ahead(const std::vector<int64_t>& order, int64_t n,
                  const std::function<int64_t(int64_t)>& reads_before) {
    const int64_t bs = options_.batch_size();
    int64_t at = reads_before(start_ * bs);
    while (at < n) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock,
                 [&] { return stopped_ || at < reads_before((consumed_ + 2 * capacity_) * bs); });
        if (stopped_) return;
      }
      const int64_t to = std::min(n, at + bs);
      try {
        dataset_->will_read(std::vector<int64_t>(order.begin() + at, order.begin() + to));
      } catch (...) {
        // A hint only: get_batch reads (and reports) the same examples itself.
      }
      at = to;
    }
  }

  void copy_to_device(Slot& slot) {
    if (placement_.device.is_cpu()) return;
#ifdef FABRIC_WITH_CUDA
    // Pinned host memory lets the copy run asynchronously on a side stream, overlapping compute.
    c10::cuda::CUDAGuard device_guard(placement_.device);
    c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, placement_.device.index());
    c10::cuda::CUDAStreamGuard stream_guard(stream);
    slot.batch.data = slot.batch.data.pin_memory().to(placement_.device, /*non_blocking=*/true);
    if (slot.batch.target.defined())  // datasets without targets (torch::data::TensorDataset)
      slot.batch.target =
          slot.batch.target.pin_memory().to(placement_.device, /*non_blocking=*/true);
    slot.copied = std::make_shared<at::cuda::CUDAEvent>();
    slot.copied->record(stream);
#else
    throw Error("DataLoader: device " + placement_.device.str() + " needs a CUDA build");
#endif
  }

  void wait_for_copy(Slot& slot) {
#ifdef FABRIC_WITH_CUDA
    if (!slot.copied) return;
    c10::cuda::CUDAStream consumer = c10::cuda::getCurrentCUDAStream(placement_.device.index());
    slot.copied->block(consumer);
    // The tensors were allocated on the side stream; tell the caching allocator they are used on
    // the consumer's stream too, so their memory is not reused before that work finishes.
    current_.data.record_stream(consumer);
    if (current_.target.defined()) current_.target.record_stream(consumer);
#else
    (void)slot;
#endif
  }

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  LoaderPlacement placement_;
  std::vector<int64_t> indices_;
  int64_t num_real_;  // indices_[num_real_:] are padding
  int64_t epoch_;
  int64_t num_batches_ = 0;
  int64_t capacity_ = 1;

  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopped_ = false;
  const int64_t start_;  // the pass's first batch (a resumed pass: not 0)
  int64_t next_;         // next batch a worker will claim
  int64_t consumed_;     // batch the consumer is waiting for / holds
  int64_t delivered_;
  std::map<int64_t, Slot> ready_;
  // Set before any worker starts and never changed: workers read it while workers_ still grows
  // (a data race ThreadSanitizer found when build() asked workers_.empty()).
  const bool in_thread_ = options_.num_workers() == 0;
  std::vector<std::thread> workers_;
  std::vector<int64_t> stream_;  // Sampler::read_order's examples (when it has an order)
  std::thread reader_;           // read_ahead()

  Batch current_;
  int64_t current_index_ = -1;
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options,
                       LoaderPlacement placement)
    : dataset_(std::move(dataset)), options_(std::move(options)), placement_(placement) {
  if (!dataset_) throw Error("DataLoader: dataset is null");
  if (options_.shuffle_buffer() < 0)
    throw Error("DataLoader: shuffle_buffer must be >= 0 (0: a global shuffle)");
  sampler_ = make_sampler(placement_.rank);
  if (options_.batch_size() < 1) throw Error("DataLoader: batch_size must be >= 1");
  if (options_.num_workers() < DataLoaderOptions::kAutoWorkers)
    throw Error("DataLoader: num_workers must be >= 0, or -1 for automatic");
  if (options_.num_workers() == DataLoaderOptions::kAutoWorkers) {
    const bool cheap =
        dataset_->cheap_batches() && !options_.transform() && placement_.device.is_cpu();
    options_.num_workers(cheap ? 0 : 1);
  }
  if (options_.prefetch() < 1) throw Error("DataLoader: prefetch must be >= 1");
  // Batches of a GPU-resident dataset are a few kernel launches: built in the training thread.
  if (!dataset_->device().is_cpu()) options_.num_workers(0);
}

DataLoader::~DataLoader() = default;

std::unique_ptr<Sampler> DataLoader::make_sampler(int64_t rank) const {
  const uint64_t seed = options_.seed().value_or(0);
  if (options_.shuffle_buffer() == 0) {
    return std::make_unique<DistributedSampler>(dataset_->size(), placement_.num_replicas, rank,
                                                options_.shuffle(), seed, options_.drop_last());
  }
  std::vector<int64_t> shards = dataset_->shard_sizes();
  int64_t total = 0;
  for (int64_t s : shards) total += s;
  if (total != dataset_->size())
    throw Error("DataLoader: the dataset's shard_sizes() add up to " + std::to_string(total) +
                ", its size() is " + std::to_string(dataset_->size()));
  return std::make_unique<StreamSampler>(std::move(shards), placement_.num_replicas, rank,
                                         options_.shuffle(), seed, options_.drop_last(),
                                         options_.shuffle_buffer());
}

std::pair<int64_t, int64_t> DataLoader::stream_position(const State& state, int64_t rank) const {
  if (options_.shuffle_buffer() == 0)
    throw Error("DataLoader: stream_position needs a streamed loader (shuffle_buffer > 0)");
  std::unique_ptr<Sampler> sampler = make_sampler(rank);
  auto& streamed = static_cast<StreamSampler&>(*sampler);
  streamed.set_epoch(state.epoch);
  const std::vector<int64_t> stream = streamed.stream();
  const int64_t read =
      streamed.stream_read(std::min(state.batches * options_.batch_size(), streamed.num_samples()));
  if (read >= static_cast<int64_t>(stream.size())) return {-1, -1};
  return dataset_->locate(stream[static_cast<size_t>(read)]);
}

DataLoader::Iterator DataLoader::begin() {
  pass_.reset();  // joins the old pass's workers first
  sampler_->set_epoch(next_epoch_);
  const int64_t start = next_batch_;
  pass_ = std::make_shared<Pass>(dataset_, options_, placement_, *sampler_, next_epoch_, start);
  ++next_epoch_;
  next_batch_ = 0;
  return Iterator(pass_, start);
}

void DataLoader::end_pass() {
  pass_.reset();  // begin() already moved next_epoch_ past it
  next_batch_ = 0;
}

void DataLoader::set_epoch(int64_t epoch) {
  next_epoch_ = epoch;
  next_batch_ = 0;
}

DataLoader::State DataLoader::state() const {
  if (pass_ && pass_->delivered() < pass_->num_batches())
    return {pass_->epoch(), pass_->delivered()};
  return {next_epoch_, next_batch_};
}

void DataLoader::load_state(const State& state) {
  if (state.epoch < 0 || state.batches < 0)
    throw Error("DataLoader: invalid state (epoch " + std::to_string(state.epoch) + ", batch " +
                std::to_string(state.batches) + ")");
  pass_.reset();
  const bool finished = state.batches >= size();
  next_epoch_ = finished ? state.epoch + 1 : state.epoch;
  next_batch_ = finished ? 0 : state.batches;
}

DataLoader::Iterator DataLoader::end() { return Iterator(nullptr, size()); }

int64_t DataLoader::size() const {
  const int64_t n = sampler_->num_samples();
  const int64_t bs = options_.batch_size();
  return options_.drop_last() ? n / bs : (n + bs - 1) / bs;
}

Batch& DataLoader::Iterator::operator*() { return pass_->get(index_); }

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  ++index_;
  return *this;
}

}  // namespace fabric
