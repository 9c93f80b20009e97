#include "fabric/fp8_checkpoint.h"

#include <string>
#include <utility>

#include "fabric/nn/fp8_history.h"
#include "strategies/collectives.h"

namespace fabric::internal {

namespace {

nn::NamedModules modules_of(const CheckpointState& state) {
  nn::NamedModules out;
  for (const auto& entry : state.entries())
    if (entry.module) out.emplace_back(entry.name, entry.module);
  return out;
}

constexpr const char* kKey = "fp8_amax_history";

}  // namespace

std::vector<c10::impl::GenericDict> gather_fp8_histories(Strategy& strategy,
                                                         const torch::Device& device,
                                                         const CheckpointState& state) {
  const nn::Fp8HistoryPack pack = nn::pack_fp8_histories(modules_of(state));
  const auto values = all_gather_padded(strategy, pack.values.to(device));
  const torch::Tensor name_bytes =
      torch::from_blob(const_cast<char*>(pack.names.data()),
                       {static_cast<int64_t>(pack.names.size())}, torch::kUInt8)
          .clone();
  const auto names = all_gather_padded(strategy, name_bytes.to(device));
  std::vector<c10::impl::GenericDict> out;
  for (size_t r = 0; r < values.size(); ++r) {
    const torch::Tensor bytes = names[r].cpu().contiguous();
    const std::string text(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
                           static_cast<size_t>(bytes.numel()));
    c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
    d.insert(kKey, nn::fp8_histories_dict(values[r], text));
    out.push_back(std::move(d));
  }
  return out;
}

void prepare_fp8_histories(PreparedCheckpoint& prepared, const CheckpointState& state,
                           int64_t rank) {
  const std::string reseeded = ": delayed scaling seeds them again at the first step";
  c10::IValue saved;
  if (prepared.rank_state.isGenericDict()) {
    const auto d = prepared.rank_state.toGenericDict();
    if (const auto it = d.find(kKey); it != d.end()) saved = it->value();
  }
  if (saved.isNone()) {
    prepared.warnings.push_back("no fp8 amax histories for rank " + std::to_string(rank) +
                                " (saved under another fabric.fp8.recipe or world size)" +
                                reseeded);
    return;
  }
  std::string why;
  if (auto apply = nn::restore_fp8_histories(saved, modules_of(state), &why)) {
    prepared.apply.push_back(std::move(apply));
  } else {
    prepared.warnings.push_back("fp8 amax histories of rank " + std::to_string(rank) +
                                " do not fit: " + why + reseeded);
  }
}

}  // namespace fabric::internal
