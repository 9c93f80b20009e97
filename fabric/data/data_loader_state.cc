// DataLoader as a checkpoint entry (Stateful): its progress and what fixes the order of its data.
#include "fabric/core/error.h"
#include "fabric/data/data_loader.h"

namespace fabric {

std::vector<std::pair<std::string, int64_t>> DataLoader::order_facts(const State& state) const {
  std::vector<std::pair<std::string, int64_t>> out{
      {"world size", placement_.num_replicas},
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
  return out;
}

c10::IValue DataLoader::save_state() const {
  c10::impl::GenericDict d = new_state_dict();
  const State s = state();
  d.insert("epoch", s.epoch);
  d.insert("batches", s.batches);
  d.insert("batches_per_epoch", size());
  for (const auto& [key, value] : order_facts(s)) d.insert(key, value);
  return d;
}

std::function<void()> DataLoader::prepare_restore(const c10::IValue& saved,
                                                  const std::string& source) {
  const State s{state_int(saved, "epoch", source), state_int(saved, "batches", source)};
  const int64_t per_epoch = state_int(saved, "batches_per_epoch", source);
  if (s.batches > 0 && s.batches < per_epoch) {
    // Mid-epoch: the rest of the epoch is only the right data in the same order.
    std::string changed;
    for (const auto& [key, now] : order_facts(s)) {
      // Keys some states lack: shuffle_buffer (written later; absent means 0) and the stream
      // position (absent when that loader did not stream: shuffle_buffer says so).
      const bool optional = key == "shuffle_buffer" || key.rfind("stream_", 0) == 0;
      const int64_t was = optional && !optional_state_field(saved, key, source)
                              ? (key == "shuffle_buffer" ? 0 : now)
                              : state_int(saved, key, source);
      if (was != now)
        changed += (changed.empty() ? "" : ", ") + key + " " + std::to_string(was) + " → " +
                   std::to_string(now);
    }
    if (!changed.empty())
      throw Error(source + ": cannot resume in the middle of epoch " + std::to_string(s.epoch) +
                  " (after batch " + std::to_string(s.batches) + " of " +
                  std::to_string(per_epoch) + "): the data order changed (" + changed +
                  "); resume with the same settings or from an end-of-epoch checkpoint");
  }
  return [this, s] { load_state(s); };
}

}  // namespace fabric
