#include "fabric/distributed/collective_check.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <vector>

#include "fabric/core/error.h"

namespace fabric::distributed {
namespace {

std::string key(int64_t seq, int64_t rank) {
  return "fabric/collective/" + std::to_string(seq) + "/" + std::to_string(rank);
}

}  // namespace

std::string collective_signature(const std::string& kind, const at::Tensor* tensor) {
  if (tensor == nullptr) return kind;
  std::string shape;
  for (int64_t d : tensor->sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
  return kind + " " + c10::getDtypeNames(tensor->scalar_type()).first + " [" + shape + "]";
}

CollectiveChecker::CollectiveChecker(c10::intrusive_ptr<c10d::Store> store, int64_t rank,
                                     int64_t world_size, std::chrono::milliseconds timeout)
    : store_(std::move(store)), rank_(rank), world_size_(world_size), timeout_(timeout) {}

void CollectiveChecker::check(int64_t seq, const std::string& signature) {
  // Keys of collective seq - 2 are read by everyone already (every rank has completed seq - 1).
  if (seq > 2) store_->deleteKey(key(seq - 2, rank_));
  store_->set(key(seq, rank_), std::vector<uint8_t>(signature.begin(), signature.end()));
  auto compare = [&](int64_t other) {
    const std::string k = key(seq, other);
    try {
      store_->wait({k}, timeout_);
    } catch (const std::exception&) {
      throw Error(
          "collective #" + std::to_string(seq) + " (" + signature + "): rank " +
          std::to_string(other) +
          " did not reach it within fabric.ddp.timeout_s (it "
          "issues fewer collectives, or is stuck elsewhere) (fabric.ddp.debug_collectives)");
    }
    const auto bytes = store_->get(k);
    const std::string theirs(bytes.begin(), bytes.end());
    if (theirs == signature) return;
    const bool me_first = rank_ < other;
    const std::string a = me_first ? signature : theirs, b = me_first ? theirs : signature;
    throw Error("collective #" + std::to_string(seq) + " differs between ranks: rank " +
                std::to_string(std::min(rank_, other)) + " calls " + a + ", rank " +
                std::to_string(std::max(rank_, other)) + " calls " + b +
                " (fabric.ddp.debug_collectives)");
  };
  if (rank_ == 0) {
    for (int64_t r = 1; r < world_size_; ++r) compare(r);
  } else {
    compare(0);
  }
}

}  // namespace fabric::distributed
