#include "fabric/distributed/shm_backend.h"

#include <ATen/ATen.h>
#include <sys/mman.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/distributed/shm_segment.h"

namespace fabric::distributed {
namespace {

using Future = c10::ivalue::Future;

bool reducible(c10d::ReduceOp::RedOpType op) {
  return op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::MIN || op == c10d::ReduceOp::MAX ||
         op == c10d::ReduceOp::PRODUCT;
}

bool shm_dtype(const at::Tensor& t) {  // what ShmSegment's reductions dispatch on
  switch (t.scalar_type()) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kByte:
    case at::kChar:
    case at::kShort:
    case at::kInt:
    case at::kLong:
      return t.device().is_cpu() && t.layout() == at::kStrided;
    default:
      return false;
  }
}

class ShmWork : public c10d::Work {
 public:
  ShmWork(c10d::OpType type, const char* profiling_title, std::vector<at::Tensor> tensors,
          c10::intrusive_ptr<Future> future)
      : c10d::Work(-1, type, profiling_title),
        tensors_(std::move(tensors)),
        future_(std::move(future)) {}
  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return !future_->hasError(); }
  std::exception_ptr exception() const override { return future_->exception_ptr(); }
  std::vector<at::Tensor> result() override { return tensors_; }
  void synchronize() override {}
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    future_->wait();  // the worker's barriers bound the wait
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }
  c10::intrusive_ptr<Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> tensors_;
  c10::intrusive_ptr<Future> future_;
};

class ShmBackend : public c10d::Backend {
 public:
  ShmBackend(std::unique_ptr<ShmSegment> segment, c10::intrusive_ptr<c10d::Backend> fallback,
             int rank, int size)
      : c10d::Backend(rank, size), segment_(std::move(segment)), fallback_(std::move(fallback)) {
    worker_ = std::thread([this] { run(); });
  }
  ~ShmBackend() override { stop(); }

  const std::string getBackendName() const override { return "fabric_shm"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (tensors.size() != 1 || !reducible(opts.reduceOp.op_) || !shm_dtype(tensors[0]))
      return fallback_->allreduce(tensors, opts);
    return enqueue(Kind::kAllReduce, tensors[0], {}, opts.reduceOp.op_, {}, tensors);
  }

  // out (k elements) = this rank's reduced slice of every rank's `in` (world * k elements).
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& o) override {
    if (!reducible(o.reduceOp.op_) || !shm_dtype(out) || !shm_dtype(in) ||
        in.scalar_type() != out.scalar_type() || in.numel() != out.numel() * size_)
      return fallback_->_reduce_scatter_base(out, in, o);
    return enqueue(Kind::kReduceScatter, out, in, o.reduceOp.op_, {}, {out});
  }

  // out (world * k elements) = every rank's `in` (k elements), in rank order.
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions& o) override {
    if (!shm_dtype(out) || !shm_dtype(in) || in.scalar_type() != out.scalar_type() ||
        out.numel() != in.numel() * size_)
      return fallback_->_allgather_base(out, in, o);
    return enqueue(Kind::kAllGather, out, in, c10d::ReduceOp::SUM, {}, {out});
  }

  // The list form (what Fabric::all_gather issues): one input, one output per rank of its shape.
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& out,
                                           std::vector<at::Tensor>& in,
                                           const c10d::AllgatherOptions& o) override {
    bool native = in.size() == 1 && out.size() == 1 && shm_dtype(in[0]) &&
                  static_cast<int>(out[0].size()) == size_;
    for (size_t r = 0; native && r < out[0].size(); ++r) {
      native = out[0][r].scalar_type() == in[0].scalar_type() &&
               out[0][r].sizes() == in[0].sizes() && shm_dtype(out[0][r]);
    }
    if (!native) return fallback_->allgather(out, in, o);
    return enqueue(Kind::kAllGather, at::empty({size_ * in[0].numel()}, in[0].options()), in[0],
                   c10d::ReduceOp::SUM, out[0], out[0]);
  }

  // Everything else is Gloo's.
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& t,
                                           const c10d::BroadcastOptions& o) override {
    return fallback_->broadcast(t, o);
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& t, const c10d::AllreduceCoalescedOptions& o) override {
    return fallback_->allreduce_coalesced(t, o);
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& t,
                                        const c10d::ReduceOptions& o) override {
    return fallback_->reduce(t, o);
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& out,
                                                     std::vector<at::Tensor>& in,
                                                     const c10d::AllgatherOptions& o) override {
    return fallback_->allgather_coalesced(out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
      const c10d::AllgatherOptions& o) override {
    return fallback_->allgather_into_tensor_coalesced(out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& out,
                                        std::vector<at::Tensor>& in,
                                        const c10d::GatherOptions& o) override {
    return fallback_->gather(out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& out,
                                         std::vector<std::vector<at::Tensor>>& in,
                                         const c10d::ScatterOptions& o) override {
    return fallback_->scatter(out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& out,
                                                std::vector<std::vector<at::Tensor>>& in,
                                                const c10d::ReduceScatterOptions& o) override {
    return fallback_->reduce_scatter(out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in,
                                               std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits,
                                               const c10d::AllToAllOptions& o) override {
    return fallback_->alltoall_base(out, in, out_splits, in_splits, o);
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                          const c10d::AllToAllOptions& o) override {
    return fallback_->alltoall(out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& t, int dst, int tag) override {
    return fallback_->send(t, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& t, int src, int tag) override {
    return fallback_->recv(t, src, tag);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& t, int tag) override {
    return fallback_->recvAnysource(t, tag);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& o) override {
    return fallback_->barrier(o);
  }
  void monitoredBarrier(const c10d::BarrierOptions& o, bool wait_all_ranks) override {
    fallback_->monitoredBarrier(o, wait_all_ranks);
  }
  // Gloo's count plus the all-reduces run here: every collective the group issued.
  void setSequenceNumberForGroup() override { fallback_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override {
    return fallback_->getSequenceNumberForGroup() + issued_.load();
  }
  void abort() override { stop(); }
  void shutdown() override { stop(); }

 private:
  enum class Kind { kAllReduce, kReduceScatter, kAllGather };
  struct Job {
    Kind kind = Kind::kAllReduce;
    at::Tensor out;  // all_reduce: reduced in place
    at::Tensor in;   // reduce_scatter, all_gather
    c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM;
    std::vector<at::Tensor> pieces;  // list all_gather: `out` is copied into these, rank by rank
    std::vector<at::Tensor> result;  // the future's value
    c10::intrusive_ptr<Future> future;
  };

  c10::intrusive_ptr<c10d::Work> enqueue(Kind kind, at::Tensor out, at::Tensor in,
                                         c10d::ReduceOp::RedOpType op,
                                         std::vector<at::Tensor> pieces,
                                         std::vector<at::Tensor> result) {
    static const char* const kNames[] = {"all_reduce", "reduce_scatter", "all_gather"};
    static const char* const kTitles[] = {"fabric_shm:all_reduce", "fabric_shm:reduce_scatter",
                                          "fabric_shm:all_gather"};
    static const c10d::OpType kTypes[] = {
        c10d::OpType::ALLREDUCE, c10d::OpType::_REDUCE_SCATTER_BASE, c10d::OpType::_ALLGATHER_BASE};
    const int k = static_cast<int>(kind);
    auto future = c10::make_intrusive<Future>(c10::ListType::create(c10::TensorType::get()));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) {
        throw Error(std::string("shared-memory ") + kNames[k] +
                    ": the process group was shut down");
      }
      queue_.push_back(
          Job{kind, std::move(out), std::move(in), op, std::move(pieces), result, future});
    }
    ++issued_;
    wake_.notify_one();
    return c10::make_intrusive<ShmWork>(kTypes[k], kTitles[k], std::move(result), future);
  }

  void run() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        if (broken_) std::rethrow_exception(broken_);
        switch (job.kind) {
          case Kind::kAllReduce:
            segment_->all_reduce(job.out, job.op);
            break;
          case Kind::kReduceScatter:
            segment_->reduce_scatter(job.out, job.in, job.op);
            break;
          case Kind::kAllGather:
            segment_->all_gather(job.out, job.in);
            for (size_t r = 0; r < job.pieces.size(); ++r) {
              const int64_t k = job.in.numel();
              job.pieces[r].copy_(
                  job.out.narrow(0, static_cast<int64_t>(r) * k, k).view(job.pieces[r].sizes()));
            }
            break;
        }
        job.future->markCompleted(c10::IValue(job.result));
      } catch (...) {
        broken_ = std::current_exception();  // the segment's rounds are out of step now
        job.future->setError(broken_);
      }
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
    }
    segment_->stop();
    wake_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  std::unique_ptr<ShmSegment> segment_;
  c10::intrusive_ptr<c10d::Backend> fallback_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  std::atomic<uint64_t> issued_{0};
  std::exception_ptr broken_;  // worker thread only
  std::thread worker_;
};

std::string get_string(c10d::Store& store, const std::string& key) {
  const std::vector<uint8_t> v = store.get(key);
  return std::string(v.begin(), v.end());
}

void set_string(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_shm_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                   c10::intrusive_ptr<c10d::Backend> fallback,
                                                   const ShmBackendOptions& o,
                                                   std::string* why_not) {
  static std::atomic<int> made{0};  // same count on every rank: groups are made in one order
  const std::string prefix = o.key_prefix + "/" + std::to_string(made++) + "/";
  const int64_t chunk = std::max<int64_t>(4096, (o.chunk_bytes + 4095) / 4096 * 4096);
  const int64_t bytes = ShmSegment::size(o.world_size, chunk);
  std::string name, why;
  void* base = nullptr;
  if (o.rank == 0) {
    std::random_device entropy;
    name = "/fabricpp-" + std::to_string(getpid()) + "-" + std::to_string(entropy());
    why = ShmSegment::map(name, /*create=*/true, bytes, &base);
    set_string(*store, prefix + "name", why.empty() ? name : "");
  } else {
    name = get_string(*store, prefix + "name");
    why = name.empty() ? "rank 0 has no segment" : ShmSegment::map(name, false, bytes, &base);
  }
  set_string(*store, prefix + "ok/" + std::to_string(o.rank), why.empty() ? "ok" : why);
  std::string first_failure;
  for (int64_t r = 0; r < o.world_size; ++r) {
    const std::string report = get_string(*store, prefix + "ok/" + std::to_string(r));
    if (report != "ok" && first_failure.empty())
      first_failure = "rank " + std::to_string(r) + ": " + report;
  }
  if (o.rank == 0 && base != nullptr) shm_unlink(name.c_str());  // every rank has reported
  if (!first_failure.empty()) {
    if (base != nullptr) munmap(base, static_cast<size_t>(bytes));
    if (why_not != nullptr) *why_not = first_failure;
    return {};
  }
  auto segment = ShmSegment::adopt(base, o.rank, o.world_size, chunk, o.timeout);
  return c10::make_intrusive<ShmBackend>(std::move(segment), std::move(fallback),
                                         static_cast<int>(o.rank), static_cast<int>(o.world_size));
}

}  // namespace fabric::distributed
