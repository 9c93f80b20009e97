// DataLoader as a checkpoint entry (Stateful): its progress and what fixes the order of its data.
#include <set>

#include "fabric/core/error.h"
#include "fabric/data/data_loader.h"
#include "fabric/data/sampler.h"

namespace fabric {

namespace {

// A DistributedSampler's loader can carry its place over to another shape (see prepare_restore);
// streamed loaders cannot.
DistributedSampler* distributed(const std::unique_ptr<Sampler>& sampler) {
  return dynamic_cast<DistributedSampler*>(sampler.get());
}

}  // namespace

std::vector<std::pair<std::string, int64_t>> DataLoader::order_facts(const State& state) const {
  std::vector<std::pair<std::string, int64_t>> out{
      {"world size", placement_.num_replicas},
      {"examples", dataset_->size()},
      {"batch_size", options_.batch_size()},
      {"samples per rank", num_samples()},
      {"shuffle", options_.shuffle()},
      {"drop_last", options_.drop_last()},
      {"seed", static_cast<int64_t>(options_.seed().value_or(0))},
      {"shuffle_buffer", options_.shuffle_buffer()}};
  // Streamed loaders: where rank 0's stream stands (shard, byte offset of the next example it
  // reads), so a resume notices shards that were changed, reordered or rewritten since.
  if (options_.shuffle_buffer() > 0) {
    const auto [shard, offset] = stream_position(state, 0);
    out.emplace_back("stream_shard", shard);
    out.emplace_back("stream_offset", offset);
  }
  // An epoch resumed at another shape starts after what the earlier job read.
  if (const auto* d = distributed(sampler_))
    out.emplace_back("skipped", d->consumed_before(state.epoch));
  return out;
}

int64_t DataLoader::consumed(const State& state) const {
  const auto* d = distributed(sampler_);
  if (d == nullptr) return -1;
  const int64_t per_rank = std::min(state.batches * options_.batch_size(), num_samples());
  return d->consumed_before(state.epoch) + per_rank * placement_.num_replicas;
}

c10::IValue DataLoader::save_state() const {
  c10::impl::GenericDict d = new_state_dict();
  const State s = state();
  d.insert("epoch", s.epoch);
  d.insert("batches", s.batches);
  d.insert("batches_per_epoch", size());
  for (const auto& [key, value] : order_facts(s)) d.insert(key, value);
  if (distributed(sampler_)) d.insert("consumed", consumed(s));
  return d;
}

std::function<void()> DataLoader::prepare_restore(const c10::IValue& saved,
                                                  const std::string& source) {
  const State s{state_int(saved, "epoch", source), state_int(saved, "batches", source)};
  const int64_t per_epoch = state_int(saved, "batches_per_epoch", source);
  if (s.batches > 0 && s.batches < per_epoch) {
    // Mid-epoch: the rest of the epoch is only the right data in the same order.
    std::string changed;
    std::set<std::string> changed_keys;
    for (const auto& [key, now] : order_facts(s)) {
      // Keys some states lack: shuffle_buffer and skipped (written later; absent means 0), the
      // stream position (absent when that loader did not stream: shuffle_buffer says so) and
      // the dataset's size (written later; absent: not compared).
      const bool zero_if_absent = key == "shuffle_buffer" || key == "skipped";
      const bool optional = zero_if_absent || key.rfind("stream_", 0) == 0 || key == "examples";
      const int64_t was = optional && !optional_state_field(saved, key, source)
                              ? (zero_if_absent ? 0 : now)
                              : state_int(saved, key, source);
      if (was != now) {
        changed += (changed.empty() ? "" : ", ") + key + " " + std::to_string(was) + " → " +
                   std::to_string(now);
        changed_keys.insert(key);
      }
    }
    // Another shape (world size, batch size) with the same order: the rest of the epoch's
    // global order, split over this job's ranks; nothing read twice or skipped.
    const std::set<std::string> shape = {"world size", "batch_size", "samples per rank", "skipped"};
    bool carry = !changed.empty() && distributed(sampler_) != nullptr;
    for (const auto& key : changed_keys) carry = carry && shape.count(key) > 0;
    if (carry) {
      const int64_t consumed =
          optional_state_field(saved, "consumed", source)
              ? state_int(saved, "consumed", source)
              : state_int(saved, "world size", source) *
                    std::min(s.batches * state_int(saved, "batch_size", source),
                             state_int(saved, "samples per rank", source));
      return [this, epoch = s.epoch, consumed] { carry_over(epoch, consumed); };
    }
    if (!changed.empty())
      throw Error(source + ": cannot resume in the middle of epoch " + std::to_string(s.epoch) +
                  " (after batch " + std::to_string(s.batches) + " of " +
                  std::to_string(per_epoch) + "): the data order changed (" + changed +
                  "); resume with the same data and order (dataset, shuffle, seed, drop_last, "
                  "streaming) or from an end-of-epoch checkpoint");
  }
  return [this, s] { load_state(s); };
}

void DataLoader::carry_over(int64_t epoch, int64_t consumed) {
  pass_.reset();
  auto* d = distributed(sampler_);
  d->set_consumed(epoch, consumed);
  d->set_epoch(epoch);
  next_epoch_ = d->num_samples() > 0 ? epoch : epoch + 1;
  next_batch_ = 0;
}

}  // namespace fabric
