#include "fabric/checkpoint/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"

namespace fabric {
namespace {

namespace fs = std::filesystem;

// Rank 0 makes a temporary folder `dir`.tmp.`save_id` (".tmp." in its name: the Checkpointer
// removes those a killed save left); `save_id`, the same on every rank, is rank 0's pid and a
// random number: the save's token (split_pieces'). Collective.
fs::path temporary_folder(RankGroup& ranks, const fs::path& dir, std::string& save_id) {
  char token[17];
  std::snprintf(token, sizeof(token), "%016llx",
                static_cast<unsigned long long>(std::random_device()()) << 32 ^
                    static_cast<unsigned long long>(
                        std::chrono::steady_clock::now().time_since_epoch().count()));
  save_id = ranks.broadcast_string(std::to_string(::getpid()) + "." + token, 0);
  const fs::path tmp = dir.string() + ".tmp." + save_id;
  on_rank_zero(ranks, [&] {
    std::error_code ec;
    remove_tree(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec) throw Error("cannot write " + dir.string() + ": " + tmp.string() + ": " + ec.message());
  });
  return tmp;
}

// Rank 0 only: the manifest of the complete temporary folder `tmp`, then `tmp` renamed to `dir`
// (replacing an earlier one). An earlier folder of that name (the same step saved again: a step
// and an epoch end at once) is swapped with the new one in one rename(2) (RENAME_EXCHANGE), so a
// kill at any moment leaves one complete folder under `dir`; where the file system cannot swap,
// the old folder is moved aside first (a kill between the two renames loses that step).
void complete_folder(const fs::path& tmp, const fs::path& dir, int64_t world,
                     const std::string& save_id) {
  std::vector<std::string> files = {kShardedCommon};
  for (int64_t r = 0; r < world; ++r) files.push_back(shard_file_name(r, world));
  write_manifest(tmp, world, files);
  std::error_code ec;
  const bool replacing = fs::exists(dir, ec);
  if (replacing &&
      ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    remove_tree(tmp, ec);  // the earlier folder, now under the temporary name
    sync_directory(dir.parent_path());
    return;
  }
  if (replacing && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
    throw Error("cannot write " + dir.string() + ": " + std::strerror(errno));
  const fs::path old = dir.string() + ".old.tmp." + save_id;
  if (replacing) fs::rename(dir, old, ec);
  if (!ec) fs::rename(tmp, dir, ec);
  if (ec) throw Error("cannot write " + dir.string() + ": " + ec.message());
  if (replacing) remove_tree(old, ec);
  sync_directory(dir.parent_path());
}

// This rank's files of `contents` in the temporary folder `tmp`.
void write_shard(const fs::path& tmp, const c10::IValue& contents, int64_t rank, int64_t world,
                 const std::string& save_id) {
  const ShardedParts parts = split_pieces(contents, save_id);
  if (rank == 0) save_archive(tmp / kShardedCommon, parts.common);
  save_archive(tmp / shard_file_name(rank, world), parts.shard);
}

}  // namespace

void write_checkpoint_file(RankGroup& ranks, const fs::path& file,
                           const std::function<c10::IValue()>& contents) {
  on_rank_zero(ranks, [&] { save_archive(file, contents()); });
}

void write_sharded_checkpoint(RankGroup& ranks, const fs::path& dir,
                              const std::function<c10::IValue()>& contents) {
  const int64_t world = ranks.size(), rank = ranks.rank();
  std::string save_id;
  const fs::path tmp = temporary_folder(ranks, dir, save_id);
  std::string failure;
  try {
    write_shard(tmp, contents(), rank, world, save_id);
  } catch (const std::exception& e) {
    failure = e.what();
    if (failure.empty()) failure = "cannot write " + dir.string();
  }
  if (const std::string why = first_failure(ranks, failure); !why.empty()) {
    if (rank == 0) {
      std::error_code ec;
      remove_tree(tmp, ec);
    }
    throw Error(why);
  }
  on_rank_zero(ranks, [&] { complete_folder(tmp, dir, world, save_id); });
}

std::function<void()> sharded_checkpoint_writer(RankGroup& ranks, const fs::path& dir,
                                                std::shared_ptr<const c10::IValue> snapshot,
                                                std::chrono::milliseconds timeout) {
  const int64_t world = ranks.size(), rank = ranks.rank();
  std::string save_id;
  const fs::path tmp = temporary_folder(ranks, dir, save_id);
  return [=] {
    const std::string mine = shard_file_name(rank, world);
    try {
      write_shard(tmp, *snapshot, rank, world, save_id);
    } catch (const std::exception& e) {
      // Rank 0 stops waiting for this shard when it finds the reason beside it; its own failure
      // ends the save at once.
      std::ofstream(tmp / (mine + ".failed")) << e.what();
      std::error_code ec;
      if (rank == 0) remove_tree(tmp, ec);
      throw;
    }
    // Done only once its folder entry is synced too: rank 0 renames the folder when every rank
    // said so (waiting for the shard file alone, it could rename the folder under a rank still
    // syncing it: "cannot open folder", and the entry not yet durable).
    if (rank != 0) {
      std::ofstream(tmp / (mine + ".done"));
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (int64_t r = 1; r < world;) {
      const fs::path shard = tmp / shard_file_name(r, world);
      const fs::path done = shard.string() + ".done";
      std::error_code ec;
      if (fs::exists(done, ec)) {
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
    for (int64_t r = 1; r < world; ++r) {
      std::error_code ec;
      fs::remove(tmp / (shard_file_name(r, world) + ".done"), ec);
    }
    complete_folder(tmp, dir, world, save_id);
  };
}

}  // namespace fabric
