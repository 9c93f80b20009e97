#include "fabric/data/instruct_cache.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <system_error>

#include "fabric/core/atomic_file.h"
#include "fabric/core/hash.h"

namespace fabric::instruct_cache {

namespace fs = std::filesystem;

namespace {

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The cache file of `jsonl` tokenized under `o`: named by a hash of the file's bytes, the
// tokenizer.json's bytes, the options that change the ids (template, bos, eos) and the bos and
// eos ids themselves (tokenizer_config.json or generation_config.json may name others for the same
// tokenizer.json), so an edited file, another tokenizer or another template never reads a stale
// cache. kCacheVersion changes with any change to how examples are rendered or tokenized.
constexpr char kCacheVersion[] = "4";

}  // namespace

std::string cache_name(const fs::path& jsonl, const InstructDataset::Options& o,
                       const BpeTokenizer& tokenizer, const ChatTemplate* chat) {
  uint64_t h = fnv1a64(file_bytes(jsonl));
  h = fnv1a64(file_bytes(o.tokenizer_json), h);
  if (chat != nullptr) h = fnv1a64(chat->key(), h);
  h = fnv1a64(o.template_text + '\0' + (o.add_bos ? '1' : '0') + (o.append_eos ? '1' : '0') + '\0' +
                  std::to_string(tokenizer.bos()) + ' ' + std::to_string(tokenizer.eot()) + ' ' +
                  kCacheVersion,
              h);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return "instruct-" + jsonl.stem().string() + "-" + hex + ".bin";
}

constexpr char kCacheMagic[] = "fabric-instruct-cache-1\n";

// Cache file: the magic, the example count (int64), then per example its id count (int64), its
// ids (int64) and one byte per id (1: a response id). False when absent or not in this format.
bool read_cache(const fs::path& path, std::vector<InstructDataset::Example>& out) {
  const std::string bytes = file_bytes(path);
  const size_t magic = sizeof(kCacheMagic) - 1;
  if (bytes.size() < magic + 8 || bytes.compare(0, magic, kCacheMagic) != 0) return false;
  size_t at = magic;
  auto take = [&](void* to, size_t n) {
    if (at + n > bytes.size()) return false;
    std::memcpy(to, bytes.data() + at, n);
    at += n;
    return true;
  };
  int64_t count = 0;
  if (!take(&count, 8) || count < 0) return false;
  std::vector<InstructDataset::Example> examples(static_cast<size_t>(count));
  for (auto& e : examples) {
    int64_t n = 0;
    if (!take(&n, 8) || n < 0 || at + static_cast<size_t>(n) * 9 > bytes.size()) return false;
    e.ids.resize(static_cast<size_t>(n));
    take(e.ids.data(), static_cast<size_t>(n) * 8);
    e.response.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) e.response[static_cast<size_t>(i)] = bytes[at++] != 0;
  }
  if (at != bytes.size()) return false;
  out = std::move(examples);
  return true;
}

void write_cache(const fs::path& path, const std::vector<InstructDataset::Example>& examples) {
  std::string bytes(kCacheMagic);
  auto put = [&](const void* from, size_t n) { bytes.append(static_cast<const char*>(from), n); };
  const auto count = static_cast<int64_t>(examples.size());
  put(&count, 8);
  for (const auto& e : examples) {
    const auto n = static_cast<int64_t>(e.ids.size());
    put(&n, 8);
    put(e.ids.data(), e.ids.size() * 8);
    for (const bool r : e.response) bytes.push_back(r ? 1 : 0);
  }
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  write_file_atomically(path, bytes);  // ranks writing the same file at once: one wins, whole
}

}  // namespace fabric::instruct_cache
