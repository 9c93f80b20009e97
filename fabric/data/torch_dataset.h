// LibTorch's own datasets as fabric::Datasets: Fabric::setup_dataloader takes them directly.
//
//   auto mnist = torch::data::datasets::MNIST(root)
//                    .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
//                    .map(torch::data::transforms::Stack<>());
//   auto train = f.setup_dataloader(std::move(mnist), fabric::DataLoaderOptions().batch_size(64));
//
// Accepted: any random-access torch::data dataset, i.e. a type with size() returning
// std::optional<size_t> (a value) and get_batch(c10::ArrayRef<size_t>) returning one stacked
// torch::data::Example (after .map(Stack<>())) or a std::vector of them (stacked here):
// torch::data::datasets::MNIST, TensorDataset, a Dataset<Self> of your own with get()/size(), and
// any of these .map()-ped through transforms. Examples with a target give Batch::target; a
// TensorDataset's (no target) leave it undefined. Not accepted: stream datasets (their requests
// are counts, not indices; use fabric::WebDataset for streams).
//
// The DataLoader then does what LibTorch's would not across processes: the distributed sampler
// (each rank its share), shuffling from fabric.seed + epoch, exact mid-epoch resume, prefetch to
// the device. Loader threads never share a copy of the dataset (LibTorch's own DataLoader gives
// each worker a copy too), so get_batch need not be thread-safe; copies share tensors. A
// dataset that is an unmapped stack of two tensors (MNIST: images(), targets()) is read as one
// fabric::TensorDataset: a batch is a gather, with no per-example calls.
#ifndef FABRIC_DATA_TORCH_DATASET_H_
#define FABRIC_DATA_TORCH_DATASET_H_

#include <c10/util/ArrayRef.h>
#include <torch/types.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/data/dataset.h"

namespace fabric {
namespace torch_data {

template <typename D, typename = void>
struct is_random_access : std::false_type {};
template <typename D>
struct is_random_access<
    D, std::void_t<decltype(std::declval<D&>().get_batch(std::declval<c10::ArrayRef<size_t>>())),
                   decltype(std::declval<const D&>().size().value())>> : std::true_type {};

template <typename D, typename = void>
struct has_images_and_targets : std::false_type {};
template <typename D>
struct has_images_and_targets<D, std::void_t<decltype(std::declval<const D&>().images()),
                                             decltype(std::declval<const D&>().targets())>>
    : std::true_type {};

template <typename E, typename = void>
struct has_target : std::false_type {};
template <typename E>
struct has_target<E, std::void_t<decltype(std::declval<E&>().target)>> : std::true_type {};

template <typename T>
struct is_vector : std::false_type {};
template <typename T, typename A>
struct is_vector<std::vector<T, A>> : std::true_type {};

// One example or a vector of them → a Batch (stacked along dimension 0).
template <typename B>
Batch to_batch(B&& got) {
  using Got = std::decay_t<B>;
  Batch batch;
  if constexpr (is_vector<Got>::value) {
    std::vector<torch::Tensor> data, target;
    data.reserve(got.size());
    for (auto& example : got) {
      data.push_back(example.data);
      if constexpr (has_target<typename Got::value_type>::value) target.push_back(example.target);
    }
    batch.data = torch::stack(data);
    if (!target.empty()) batch.target = torch::stack(target);
  } else {
    batch.data = got.data;
    if constexpr (has_target<Got>::value) batch.target = got.target;
  }
  return batch;
}

}  // namespace torch_data

// A torch::data dataset `D` (held by value) as a fabric::Dataset.
template <typename D>
class TorchDataset : public Dataset {
 public:
  explicit TorchDataset(D dataset) : prototype_(std::move(dataset)) {
    const std::optional<size_t> n = prototype_.size();
    if (!n)
      throw Error(
          "setup_dataloader: this torch::data dataset has no size (a stream?); the "
          "loader needs random access: size() and get_batch(indices)");
    size_ = static_cast<int64_t>(*n);
  }
  int64_t size() const override { return size_; }
  Batch get_batch(const std::vector<int64_t>& indices) const override {
    const std::vector<size_t> request(indices.begin(), indices.end());
    std::unique_ptr<D> copy = acquire();
    Batch batch = torch_data::to_batch(copy->get_batch(c10::ArrayRef<size_t>(request)));
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.push_back(std::move(copy));
    return batch;
  }

 private:
  // A copy no other thread is reading (as many exist as threads ever read at once).
  std::unique_ptr<D> acquire() const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (idle_.empty()) return std::make_unique<D>(prototype_);  // the prototype is only copied
    std::unique_ptr<D> copy = std::move(idle_.back());
    idle_.pop_back();
    return copy;
  }
  D prototype_;
  int64_t size_ = 0;
  mutable std::mutex mutex_;
  mutable std::vector<std::unique_ptr<D>> idle_;
};

// `dataset` as a fabric::Dataset: MNIST-like stacks (images(), targets()) as a TensorDataset,
// other random-access torch::data datasets wrapped in TorchDataset.
template <typename D>
std::shared_ptr<const Dataset> from_torch(D&& dataset) {
  using T = std::decay_t<D>;
  static_assert(torch_data::is_random_access<T>::value,
                "fabric::from_torch: not a random-access torch::data dataset (needs size() -> "
                "std::optional<size_t> and get_batch(c10::ArrayRef<size_t>))");
  if constexpr (torch_data::has_images_and_targets<T>::value) {
    return std::make_shared<const TensorDataset>(dataset.images(), dataset.targets());
  } else {
    return std::make_shared<const TorchDataset<T>>(std::forward<D>(dataset));
  }
}

}  // namespace fabric

#endif  // FABRIC_DATA_TORCH_DATASET_H_
