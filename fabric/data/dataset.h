// fabric::Dataset: random access to examples, a batch at a time.
//
// get_batch() is called from the loader's background threads, possibly concurrently: it must be
// safe to call from several threads at once (read-only datasets are). It returns tensors on
// device() (CPU by default); the loader moves them to the training device.
#ifndef FABRIC_DATA_DATASET_H_
#define FABRIC_DATA_DATASET_H_

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace fabric {

struct Batch {
  torch::Tensor data;
  torch::Tensor target;
  // Trailing examples that only repeat others (DistributedSampler pads the last batch of some ranks
  // so that every rank runs the same number of steps). Count metrics on the first
  // size() - padding examples to get exactly the single-process value; see Fabric::evaluate docs.
  int64_t padding = 0;
  int64_t size() const { return target.defined() ? target.size(0) : data.size(0); }
  // The first size() - padding rows of `per_example` (e.g. predictions or losses).
  torch::Tensor unpadded(const torch::Tensor& per_example) const {
    return per_example.narrow(0, 0, per_example.size(0) - padding);
  }
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // The examples at `indices`, stacked along dimension 0.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const = 0;
  // The same for datasets that draw randomness per example (random crops while decoding):
  // `gen` is the DataLoader's generator of this batch (seeded from seed, epoch and batch; the
  // transform draws from it next), so a batch is the same whatever thread builds it. Default:
  // get_batch(indices).
  virtual Batch get_batch(const std::vector<int64_t>& indices, at::Generator& gen) const {
    (void)gen;
    return get_batch(indices);
  }
  // Where get_batch's tensors live. Default: CPU. A dataset on a GPU is read by DataLoaders in
  // the training thread (no worker threads, no copies).
  virtual c10::Device device() const { return c10::kCPU; }
  // get_batch is a gather from memory (no file reads, no decoding): cheap enough that handing the
  // batch to another thread costs more than building it in the training thread. DataLoader's
  // automatic num_workers uses no thread for such datasets without a transform. Default: false.
  virtual bool cheap_batches() const { return false; }

  // Streamed reading (DataLoaderOptions::shuffle_buffer > 0; the order: StreamSampler in
  // fabric/data/sampler.h). The sizes of the shards the indices fall into, in index order (the
  // first shard_sizes()[0] indices are shard 0, ...). Default: {size()}, one shard.
  virtual std::vector<int64_t> shard_sizes() const { return {size()}; }
  // Where example `index` lies: {shard, byte offset in it}; a streamed loader's checkpoint records
  // where its stream stands with it. Default: {0, index}.
  virtual std::pair<int64_t, int64_t> locate(int64_t index) const { return {0, index}; }
  // A streamed loader's read-ahead: `indices` will be read soon, in this order (called from a
  // loader thread, possibly while get_batch runs). Default: nothing.
  virtual void will_read(const std::vector<int64_t>& indices) const { (void)indices; }
};

// Examples are rows of two tensors (e.g. images [N, C, H, W] and labels [N]).
class TensorDataset : public Dataset {
 public:
  // REQUIRES: data.size(0) == target.size(0) (throws fabric::Error otherwise).
  TensorDataset(torch::Tensor data, torch::Tensor target);
  int64_t size() const override { return data_.size(0); }
  // Gathers on the tensors' device (the indices are copied there without blocking).
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  c10::Device device() const override { return data_.device(); }
  bool cheap_batches() const override { return true; }
  const torch::Tensor& data() const { return data_; }
  const torch::Tensor& target() const { return target_; }

 private:
  torch::Tensor data_, target_;
};

}  // namespace fabric

#endif  // FABRIC_DATA_DATASET_H_
