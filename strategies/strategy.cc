#include "strategies/strategy.h"

#include <torch/nn/utils/clip_grad.h>

#include <unistd.h>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"
#include "fabric/training/clip.h"
#include "strategies/collectives.h"

namespace fabric {

void Strategy::save_checkpoint(const std::filesystem::path& file,
                               const std::function<c10::IValue()>& contents) {
  // Every rank holds the same state: one writer.
  on_global_zero(*this, [&] { save_archive(file, contents()); });
}

c10::IValue Strategy::load_checkpoint(const std::filesystem::path& file,
                                      const WantedPieces& wanted) {
  return read_checkpoint(file, {wanted, global_rank(), world_size()});
}

void Strategy::save_sharded_checkpoint(const std::filesystem::path& dir,
                                       const std::function<c10::IValue()>& contents) {
  namespace fs = std::filesystem;
  const int64_t world = world_size(), rank = global_rank();
  // Rank 0 makes a temporary folder beside `dir` (".tmp." in its name: the Checkpointer removes
  // those a killed save left).
  const std::string suffix = ".tmp." + std::to_string(::getpid());
  const fs::path tmp = dir.string() + broadcast_string(*this, suffix, 0);
  on_global_zero(*this, [&] {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec) throw Error("cannot write " + dir.string() + ": " + tmp.string() + ": " + ec.message());
  });
  std::string failure;
  try {
    const ShardedParts parts = split_pieces(contents());
    if (rank == 0) save_archive(tmp / kShardedCommon, parts.common);
    save_archive(tmp / shard_file_name(rank, world), parts.shard);
  } catch (const std::exception& e) {
    failure = e.what();
    if (failure.empty()) failure = "cannot write " + dir.string();
  }
  // The first failing rank's reason, on every rank.
  const int64_t first_failed = static_cast<int64_t>(
      all_reduce(torch::tensor(static_cast<double>(failure.empty() ? world : rank))
                     .to(root_device()),
                 ReduceOp::kMin)
          .item<double>());
  if (first_failed < world) {
    const std::string why = broadcast_string(*this, failure, first_failed);
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    throw Error(why);
  }
  on_global_zero(*this, [&] {
    std::vector<std::string> files = {kShardedCommon};
    for (int64_t r = 0; r < world; ++r) files.push_back(shard_file_name(r, world));
    write_manifest(tmp, world, files);
    std::error_code ec;
    const fs::path old = dir.string() + ".old" + suffix;
    const bool replacing = fs::exists(dir, ec);
    if (replacing) fs::rename(dir, old, ec);
    if (!ec) fs::rename(tmp, dir, ec);
    if (ec) throw Error("cannot write " + dir.string() + ": " + ec.message());
    if (replacing) fs::remove_all(old, ec);
    sync_directory(dir.parent_path());
  });
}

torch::Tensor Strategy::clip_gradients_norm(torch::nn::Module& module,
                                            torch::optim::Optimizer& optimizer, double max_norm,
                                            double norm_type) {
  (void)optimizer;
  return clip_grad_norm_on_device(module.parameters(), max_norm, norm_type);
}

void Strategy::clip_gradients_value(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                    double clip_value) {
  (void)optimizer;
  torch::nn::utils::clip_grad_value_(module.parameters(), clip_value);
}

}  // namespace fabric
