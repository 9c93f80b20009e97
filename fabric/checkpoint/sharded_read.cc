// The reading side of sharded checkpoints (sharded.h): the joiner that builds whole tensors or
// the pieces a reader wants one shard file at a time, the manifest's checks, read_checkpoint,
// verify_checkpoint and join_pieces. The writing side and the helpers both use are sharded.cc.
#include <torch/types.h>

#include <algorithm>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/checkpoint/sharded_detail.h"
#include "fabric/core/error.h"

namespace fabric {
namespace fs = std::filesystem;
using namespace sharded_detail;  // NOLINT(build/namespaces): the format's helpers

namespace {

// Joins pieces into whole tensors (or into the pieces a reader wants) one shard at a time: a
// reader holds one shard file beside what it builds, never every shard at once.
class Joiner {
 public:
  // Allocates a whole tensor for every descriptor of `common`, or the piece `wanted` names;
  // `verify_only`: allocates nothing and only checks where the pieces lie.
  Joiner(const c10::IValue& common, int64_t world_size, std::string source,
         const WantedPieces& wanted = nullptr, bool verify_only = false)
      : world_(world_size), source_(std::move(source)) {
    auto whole = transform(common, "", [&](const c10::IValue& v, const std::string& at) {
      if (!is_marked(v, kDescriptorKey)) return std::optional<c10::IValue>();
      const Dict d = v.toGenericDict();
      const std::string what = source_ + ": sharded tensor '" + at + "'";
      if (!d.at(kDescriptorKey).isString() || d.at(kDescriptorKey).toStringRef() != at)
        throw Error(what + ": its descriptor names another place");
      if (!d.contains("shape") || !d.contains("strides"))
        throw Error(what + ": malformed descriptor");
      const auto sizes = ints_of(d.at("shape"), what + ": malformed shape");
      const auto strides = ints_of(d.at("strides"), what + ": malformed strides");
      if (!d.contains("dtype") || !d.at("dtype").isString()) throw Error(what + ": no dtype");
      const torch::ScalarType dtype = dtype_named(d.at("dtype").toStringRef(), what);
      const int64_t numel = dense_extent(sizes, strides);
      if (numel < 0) throw Error(what + ": shape and strides do not describe a dense tensor");
      std::optional<PieceLayout> layout = layout_of(d, what);
      if (layout) {
        check_layout(*layout, numel, what);
        if (!c10::IntArrayRef(strides).equals(c10::contiguous_strides(sizes)))
          throw Error(what + ": a layout with strides that are not contiguous");
      }
      Target& t = tensors_[at];
      t.numel = numel;
      t.runs = {{0, numel, 0}};
      t.total = numel;
      t.dtype = dtype;
      if (verify_only) return std::optional<c10::IValue>();
      auto range = wanted ? wanted(at, sizes, strides, layout) : std::nullopt;
      if (layout && !range) {  // whole: joined in the layout's order, put in shape in finish()
        ++whole_tensors_;
        t.layout = layout;
        t.flat = torch::empty({numel}, torch::dtype(dtype));
        t.whole = torch::empty(sizes, torch::dtype(dtype));
        return std::optional<c10::IValue>(t.whole);
      }
      if (range) {
        auto asked = [&](int64_t offset, int64_t count) {
          if (offset < 0 || count < 0 || offset > numel - count)
            throw Error(what + ": elements " + std::to_string(offset) + " to " +
                        std::to_string(offset + count) + " asked of " + std::to_string(numel));
        };
        t.runs.clear();
        if (range->from.empty()) {
          asked(range->offset, range->count);
          t.runs.push_back({range->offset, range->count, 0});
        } else {
          int64_t dest = 0;
          for (const auto& [offset, count] : range->from) {
            asked(offset, count);
            t.runs.push_back({offset, count, dest});
            dest += count;
          }
          if (dest != range->count)
            throw Error(what + ": runs of " + std::to_string(dest) + " elements for a piece of " +
                        std::to_string(range->count));
          std::sort(t.runs.begin(), t.runs.end());
        }
        t.total = range->count;
        t.flat = torch::empty({range->count}, torch::dtype(dtype));
        c10::IValue piece =
            range->from.empty()
                ? tensor_piece(sizes, strides, range->offset, t.flat, layout)
                : tensor_piece(sizes, strides, range->offset, t.flat, range->layout);
        t.piece = piece.toGenericDict();
        return std::optional<c10::IValue>(piece);
      }
      ++whole_tensors_;
      torch::Tensor out = torch::empty_strided(sizes, strides, torch::dtype(dtype));
      t.flat = out.as_strided({numel}, {1}, 0);
      return std::optional<c10::IValue>(out);
    });
    whole_ = whole ? *whole : common;
    // The save's token (written since it was added): kept for add(), not part of the dict.
    if (whole_.isGenericDict() && whole_.toGenericDict().contains(kSaveIdKey)) {
      Dict top = whole_.toGenericDict().copy();
      const c10::IValue id = top.at(kSaveIdKey);
      save_id_ = id.isString() ? id.toStringRef() : "?";
      top.erase(kSaveIdKey);
      whole_ = top;
    }
  }

  // Copies rank `rank`'s pieces in (those elements of them this reader builds).
  void add(const c10::IValue& shard, int64_t rank) {
    const std::string name = shard_file_name(rank, world_);
    const std::string file = source_ + "/" + name;
    if (!is_marked(shard, "pieces") || !shard.toGenericDict().at("pieces").isGenericDict())
      throw Error(file + ": not a shard of a sharded checkpoint (no \"pieces\" dict)");
    // Every file of one save carries its token: a shard copied in from another save (same
    // size, so the manifest's check passes) would mix two steps' states in silence.
    const Dict top = shard.toGenericDict();
    const std::string id = top.contains(kSaveIdKey) && top.at(kSaveIdKey).isString()
                               ? top.at(kSaveIdKey).toStringRef()
                               : std::string();
    if (id != save_id_)
      throw Error(file + ": written by another save than " + kShardedCommon + " (save " +
                  (id.empty() ? "unmarked" : id) + ", " + kShardedCommon + "'s " +
                  (save_id_.empty() ? "unmarked" : save_id_) +
                  "): the folder mixes two checkpoints' files; resume from a complete one");
    for (const auto& e : shard.toGenericDict().at("pieces").toGenericDict()) {
      const c10::IValue& p = e.value();
      if (!e.key().isString() || !is_marked(p, "offset") || !p.toGenericDict().contains("values") ||
          !p.toGenericDict().at("offset").isInt() || !p.toGenericDict().at("values").isTensor())
        throw Error(file + ": malformed piece " + key_text(e.key()));
      const std::string& at = e.key().toStringRef();
      auto it = tensors_.find(at);
      if (it == tensors_.end())
        throw Error(source_ + ": " + name + " holds a piece of '" + at + "', which " +
                    kShardedCommon + " does not describe");
      const std::string what = source_ + ": sharded tensor '" + at + "': " + name;
      const int64_t offset = p.toGenericDict().at("offset").toInt();
      const torch::Tensor values = p.toGenericDict().at("values").toTensor();
      Target& t = it->second;
      if (values.scalar_type() != t.dtype)
        throw Error(what + " holds " + c10::toString(values.scalar_type()) +
                    " values, the descriptor says " + c10::toString(t.dtype));
      const int64_t n = values.numel();
      if (offset < 0 || offset + n > t.numel)
        throw Error(what + " holds elements " + std::to_string(offset) + " to " +
                    std::to_string(offset + n) + " of " + std::to_string(t.numel));
      // The parts of [offset, offset + n) inside the runs built (sorted, disjoint): the first
      // run ending after `offset`, and on.
      auto run = std::upper_bound(t.runs.begin(), t.runs.end(), offset,
                                  [](int64_t o, const Run& r) { return o < r.stored + r.count; });
      for (; run != t.runs.end() && run->stored < offset + n; ++run) {
        const int64_t x = std::max(offset, run->stored);
        const int64_t y = std::min(offset + n, run->stored + run->count);
        if (x >= y) continue;
        const int64_t dest = run->dest + (x - run->stored);
        if (t.flat.defined() && t.piece && t.total != t.numel && t.runs.size() == 1 &&
            t.count == 0 && dest == 0 && y - x == t.total && offset == x && n == y - x) {
          // The piece is exactly what the reader wants (the same world size): no copy. Its
          // memory was never touched, so it was never resident.
          t.flat = values.reshape(-1);
          t.piece->insert_or_assign("values", t.flat);
        } else if (t.flat.defined()) {
          t.flat.narrow(0, dest, y - x).copy_(values.reshape(-1).narrow(0, x - offset, y - x));
        }
        t.held.push_back({dest, y - x, rank});
        t.count += y - x;
      }
    }
  }

  // Whether nothing more is needed: no whole tensors, every wanted piece's elements held once.
  bool pieces_complete() const {
    if (whole_tensors_ > 0) return false;
    for (const auto& [at, t] : tensors_)
      if (t.count < t.total) return false;
    return true;
  }

  // The dict; throws when an element is missing or held twice.
  c10::IValue finish() {
    for (auto& [at, t] : tensors_) {
      // Held places, in the order of what is built (a whole tensor's: its own): each once.
      std::sort(t.held.begin(), t.held.end());
      int64_t next = 0;
      const std::string what = source_ + ": sharded tensor '" + at + "'";
      for (const auto& [dest, n, rank] : t.held) {
        if (dest < next)
          throw Error(what + ": " + shard_file_name(rank, world_) + " holds elements from " +
                      std::to_string(stored_of(t, dest)) + ", which another shard holds too");
        if (dest > next) break;
        next += n;
      }
      if (next != t.total)
        throw Error(what + ": the shards hold " + std::to_string(t.count) + " of its " +
                    std::to_string(t.total) + (t.piece ? " wanted" : "") + " elements");
      if (t.layout) {
        t.whole.copy_(from_layout_order(t.flat, *t.layout, t.whole.sizes()));
        t.flat = torch::Tensor();
      }
    }
    return whole_;
  }

 private:
  // Elements [stored, stored + count) of the stored order, built at [dest, dest + count).
  struct Run {
    int64_t stored = 0, count = 0, dest = 0;
    bool operator<(const Run& other) const { return stored < other.stored; }
  };
  struct Target {
    int64_t numel = 0;      // the whole tensor's elements
    std::vector<Run> runs;  // what is built, sorted by `stored` (a whole tensor: one run)
    int64_t total = 0;      // their elements
    torch::ScalarType dtype = torch::kFloat;
    torch::Tensor flat;                 // their memory (undefined when only verifying)
    std::optional<Dict> piece;          // the piece in the dict (a wanted piece)
    std::optional<PieceLayout> layout;  // `flat` in this order, `whole` the tensor in the dict
    torch::Tensor whole;
    int64_t count = 0;                                        // elements held so far
    std::vector<std::tuple<int64_t, int64_t, int64_t>> held;  // dest, elements, rank
  };
  // The stored place of built element `dest` (for messages).
  static int64_t stored_of(const Target& t, int64_t dest) {
    for (const Run& r : t.runs)
      if (dest >= r.dest && dest < r.dest + r.count) return r.stored + (dest - r.dest);
    return dest;
  }
  int64_t world_;
  std::string source_;
  std::string save_id_;  // common.pt's token ("" when it has none)
  c10::IValue whole_;
  int64_t whole_tensors_ = 0;
  std::map<std::string, Target> tensors_;
};

// A sharded folder's manifest: its world size and the size of every file.
struct Manifest {
  int64_t world = 0;
  std::map<std::string, int64_t> sizes;
};

Manifest read_manifest(const fs::path& path) {
  std::error_code ec;
  const std::string source = path.string();
  if (!fs::exists(path / kShardedManifest, ec))
    throw Error(source + ": incomplete sharded checkpoint (no " + kShardedManifest +
                ": its save did not finish)");
  const std::string manifest = read_text(path / kShardedManifest);
  const std::string where = (path / kShardedManifest).string();
  std::smatch m;
  if (!std::regex_search(manifest, m, std::regex("\"format\": \"([^\"]*)\"")) || m[1] != kFormat)
    throw Error(where + ": not a sharded checkpoint manifest");
  if (!std::regex_search(manifest, m, std::regex("\"version\": ([0-9]+)")) ||
      (m[1] != "1" && m[1] != "2"))
    throw Error(where + ": unsupported version (this build reads versions 1 and 2)");
  // Numbers of at most 15 digits (the regexes admit only digits): no overflow, no huge loop.
  const auto number = [&](const std::string& digits, const char* what) {
    if (digits.size() > 15) throw Error(where + ": " + what + " " + digits + " is out of range");
    return std::stoll(digits);
  };
  if (!std::regex_search(manifest, m, std::regex("\"world_size\": ([0-9]+)")))
    throw Error(where + ": no world_size");
  Manifest out;
  out.world = number(m[1], "world_size");
  if (out.world < 1 || out.world > (int64_t{1} << 20))
    throw Error(where + ": world_size " + std::to_string(out.world) + " is out of range");
  const size_t files_at = manifest.find("\"files\"");
  if (files_at == std::string::npos) throw Error(where + ": no files list");
  const std::string files = manifest.substr(files_at);
  const std::regex entry("\"([^\"]+\\.pt)\": ([0-9]+)");
  for (std::sregex_iterator it(files.begin(), files.end(), entry), end; it != end; ++it)
    out.sizes[(*it)[1]] = number((*it)[2], "file size");
  // Every file is there with its size before any is read (a damaged shard fails every reader).
  std::vector<std::string> names = {kShardedCommon};
  for (int64_t r = 0; r < out.world; ++r) names.push_back(shard_file_name(r, out.world));
  for (const auto& name : names)
    if (!out.sizes.count(name)) throw Error(where + ": does not list " + name);
  // And every other file it lists (a folder that lost one is not the checkpoint that was saved).
  for (const auto& [name, listed] : out.sizes)
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  for (const auto& name : names) {
    const fs::path file = path / name;
    auto it = out.sizes.find(name);
    const auto bytes = fs::file_size(file, ec);
    if (ec) throw Error(file.string() + ": cannot open (" + ec.message() + ")");
    if (static_cast<int64_t>(bytes) != it->second)
      throw Error(file.string() + ": " + std::to_string(bytes) + " bytes, the manifest says " +
                  std::to_string(it->second) + " (damaged or replaced)");
  }
  return out;
}

}  // namespace

c10::IValue join_pieces(const c10::IValue& common, const std::vector<c10::IValue>& shards,
                        const std::string& source) {
  Joiner joiner(common, static_cast<int64_t>(shards.size()), source);
  for (size_t r = 0; r < shards.size(); ++r) joiner.add(shards[r], static_cast<int64_t>(r));
  return joiner.finish();
}

c10::IValue read_checkpoint(const fs::path& path, const ReadOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return load_archive(path);
  const Manifest manifest = read_manifest(path);
  const int64_t world = manifest.world;
  const c10::IValue common = load_archive(path / kShardedCommon);
  if (options.on_common) options.on_common(common);
  Joiner joiner(common, world, path.string(), options.wanted);
  // The shard files in the order most likely to hold this reader's pieces first: at the same
  // world size its own, at another the one that held the same fraction of each tensor.
  const int64_t first = options.world_size > 0
                            ? (options.rank * world) / std::max<int64_t>(options.world_size, 1)
                            : 0;
  for (int64_t k = 0; k < world; ++k) {
    const int64_t r = (first + k) % world;
    joiner.add(load_archive(path / shard_file_name(r, world)), r);
    if (options.wanted && joiner.pieces_complete()) break;
  }
  return joiner.finish();
}

c10::IValue verify_checkpoint(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return check_archive(path);
  const Manifest manifest = read_manifest(path);
  c10::IValue common = check_archive(path / kShardedCommon);
  Joiner joiner(common, manifest.world, path.string(), nullptr, /*verify_only=*/true);
  for (int64_t r = 0; r < manifest.world; ++r)
    joiner.add(check_archive(path / shard_file_name(r, manifest.world)), r);
  joiner.finish();
  return common;
}

}  // namespace fabric
