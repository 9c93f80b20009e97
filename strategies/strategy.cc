#include "strategies/strategy.h"

#include <torch/nn/utils/clip_grad.h>

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

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

namespace {

// Rank 0 only: the manifest of the complete temporary folder `tmp`, then `tmp` renamed to `dir`
// (replacing an earlier one).
void complete_sharded_folder(const std::filesystem::path& tmp, const std::filesystem::path& dir,
                             int64_t world, const std::string& suffix) {
  namespace fs = std::filesystem;
  std::vector<std::string> files = {kShardedCommon};
  for (int64_t r = 0; r < world; ++r) files.push_back(shard_file_name(r, world));
  write_manifest(tmp, world, files);
  std::error_code ec;
  const fs::path old = dir.string() + ".old" + suffix;
  const bool replacing = fs::exists(dir, ec);
  if (replacing) fs::rename(dir, old, ec);
  if (!ec) fs::rename(tmp, dir, ec);
  if (ec) throw Error("cannot write " + dir.string() + ": " + ec.message());
  if (replacing) remove_tree(old, ec);
  sync_directory(dir.parent_path());
}

// This rank's files of `contents` in the temporary folder `tmp`.
void write_shard(const std::filesystem::path& tmp, const c10::IValue& contents, int64_t rank,
                 int64_t world) {
  const ShardedParts parts = split_pieces(contents);
  if (rank == 0) save_archive(tmp / kShardedCommon, parts.common);
  save_archive(tmp / shard_file_name(rank, world), parts.shard);
}

}  // namespace

std::filesystem::path Strategy::sharded_temporary_folder(const std::filesystem::path& dir,
                                                         std::string& suffix) {
  namespace fs = std::filesystem;
  // Rank 0 makes a temporary folder beside `dir` (".tmp." in its name: the Checkpointer removes
  // those a killed save left).
  suffix = broadcast_string(*this, ".tmp." + std::to_string(::getpid()), 0);
  const fs::path tmp = dir.string() + suffix;
  on_global_zero(*this, [&] {
    std::error_code ec;
    remove_tree(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec) throw Error("cannot write " + dir.string() + ": " + tmp.string() + ": " + ec.message());
  });
  return tmp;
}

void Strategy::save_sharded_checkpoint(const std::filesystem::path& dir,
                                       const std::function<c10::IValue()>& contents) {
  namespace fs = std::filesystem;
  const int64_t world = world_size(), rank = global_rank();
  std::string suffix;
  const fs::path tmp = sharded_temporary_folder(dir, suffix);
  std::string failure;
  try {
    write_shard(tmp, contents(), rank, world);
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
      remove_tree(tmp, ec);
    }
    throw Error(why);
  }
  on_global_zero(*this, [&] { complete_sharded_folder(tmp, dir, world, suffix); });
}

std::function<void()> Strategy::sharded_checkpoint_writer(
    const std::filesystem::path& dir, std::shared_ptr<const c10::IValue> snapshot,
    std::chrono::milliseconds timeout) {
  namespace fs = std::filesystem;
  const int64_t world = world_size(), rank = global_rank();
  std::string suffix;
  const fs::path tmp = sharded_temporary_folder(dir, suffix);
  return [=] {
    const std::string mine = shard_file_name(rank, world);
    try {
      write_shard(tmp, *snapshot, rank, world);
    } catch (const std::exception& e) {
      // Rank 0 stops waiting for this shard when it finds the reason beside it; its own failure
      // ends the save at once.
      std::ofstream(tmp / (mine + ".failed")) << e.what();
      std::error_code ec;
      if (rank == 0) remove_tree(tmp, ec);
      throw;
    }
    if (rank != 0) return;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (int64_t r = 0; r < world;) {
      const fs::path shard = tmp / shard_file_name(r, world);
      std::error_code ec;
      if (fs::exists(shard, ec)) {
        ++r;
        continue;
      }
      const fs::path failed = shard.string() + ".failed";
      std::string why;
      if (fs::exists(failed, ec)) {
        std::ifstream in(failed);
        std::getline(in, why);
        why = "rank " + std::to_string(r) + ": " + why;
      } else if (std::chrono::steady_clock::now() > deadline) {
        why = "rank " + std::to_string(r) + " did not write " + shard.string() + " within " +
              std::to_string(timeout.count() / 1000) + " s";
      }
      if (!why.empty()) {
        remove_tree(tmp, ec);
        throw Error(why);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    complete_sharded_folder(tmp, dir, world, suffix);
  };
}

ParameterParts Strategy::parameter_parts(torch::nn::Module& module) {
  ParameterParts out;
  for (const auto& item : module.named_parameters())
    if (item.value().is_floating_point())
      out.parts.push_back({item.key(), item.value().detach(), item.value().sizes().vec(), 0, false});
  return out;
}

torch::Tensor Strategy::clip_gradients_norm(const std::vector<torch::Tensor>& parameters,
                                            torch::optim::Optimizer& optimizer, double max_norm,
                                            double norm_type) {
  (void)optimizer;
  return clip_grad_norm_on_device(parameters, max_norm, norm_type);
}

void Strategy::clip_gradients_value(const std::vector<torch::Tensor>& parameters,
                                    torch::optim::Optimizer& optimizer, double clip_value) {
  (void)optimizer;
  torch::nn::utils::clip_grad_value_(parameters, clip_value);
}

}  // namespace fabric
