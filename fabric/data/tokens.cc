#include "fabric/data/tokens.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>

#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"
#include "fabric/data/bpe.h"

namespace fabric {

std::shared_ptr<TokenDataset> TokenDataset::open(const std::string& path, const Options& options) {
  if (options.token_bytes != 2 && options.token_bytes != 4)
    throw Error(path + ": tokens are 2 (uint16) or 4 (uint32) bytes, not " +
                std::to_string(options.token_bytes));
  if (options.block_size < 1) throw Error(path + ": block_size must be at least 1");
  std::shared_ptr<TokenDataset> d(new TokenDataset());
  d->path_ = path;
  d->token_bytes_ = options.token_bytes;
  d->block_ = options.block_size;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  d->bytes_ = static_cast<size_t>(st.st_size);
  const char* type = options.token_bytes == 2 ? "uint16" : "uint32";
  if (d->bytes_ % static_cast<size_t>(options.token_bytes) != 0) {
    ::close(fd);
    throw Error(path + ": " + std::to_string(d->bytes_) + " bytes is not a whole number of " +
                type + " tokens (" + std::to_string(options.token_bytes) +
                " bytes each); a file of the other width? (data.token_dtype)");
  }
  d->tokens_ = static_cast<int64_t>(d->bytes_) / options.token_bytes;
  if (d->tokens_ < options.block_size + 1) {
    ::close(fd);
    throw Error(path + ": " + std::to_string(d->tokens_) + " tokens, fewer than one window of " +
                std::to_string(options.block_size + 1) +
                " (block_size + 1); give more text or a smaller block_size");
  }
  void* p = ::mmap(nullptr, d->bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw Error(path + ": cannot map (" + std::strerror(map_errno) + ")");
  d->data_ = static_cast<const unsigned char*>(p);
  d->windows_ = (d->tokens_ - 1) / d->block_;
  // One pass over the ids: each below the vocabulary; with uint16, whether every second id is 0
  // (uint32 ids of a vocabulary under 65,536 read as uint16: the model would train on half zeros).
  bool odd_zero = options.token_bytes == 2 && d->tokens_ >= 16, even_nonzero = false;
  for (int64_t i = 0; i < d->tokens_; ++i) {
    const int64_t id = d->token(i);
    if (i % 2 == 1) {
      odd_zero = odd_zero && id == 0;
    } else {
      even_nonzero = even_nonzero || id != 0;
    }
    if (options.vocab_size <= 0 || id < options.vocab_size) continue;
    std::string fix =
        options.vocab_fix.empty()
            ? "prepare the data with this model's tokenizer, or raise model.vocab_size"
            : options.vocab_fix;
    if (options.token_bytes == 4 && id > 65535 && options.vocab_size <= 65536)
      fix = "uint16 ids read as uint32? set data.token_dtype=uint16";
    throw Error(path + ": token " + std::to_string(id) + " at token offset " + std::to_string(i) +
                " (byte " + std::to_string(i * options.token_bytes) + ") is not below " +
                options.vocab_name + " " + std::to_string(options.vocab_size) + "; " + fix);
  }
  if (odd_zero && even_nonzero)
    throw Error(path +
                ": every second uint16 id is 0, as uint32 ids read as uint16 give; set "
                "data.token_dtype=uint32");
  return d;
}

TokenDataset::~TokenDataset() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), bytes_);
}

int64_t TokenDataset::token(int64_t i) const {
  const unsigned char* p = data_ + i * token_bytes_;
  uint32_t v = p[0] | static_cast<uint32_t>(p[1]) << 8;
  if (token_bytes_ == 4) v |= static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
  return v;
}

Batch TokenDataset::get_batch(const std::vector<int64_t>& indices) const {
  const auto n = static_cast<int64_t>(indices.size());
  torch::Tensor window = torch::empty({n, block_ + 1}, torch::kInt64);
  int64_t* out = window.data_ptr<int64_t>();
  for (int64_t b = 0; b < n; ++b) {
    const int64_t i = indices[static_cast<size_t>(b)];
    if (i < 0 || i >= windows_)
      throw Error(path_ + ": window " + std::to_string(i) + " of " + std::to_string(windows_));
    for (int64_t t = 0; t <= block_; ++t) out[b * (block_ + 1) + t] = token(i * block_ + t);
  }
  return {window.narrow(1, 0, block_).contiguous(), window.narrow(1, 1, block_).contiguous()};
}

std::vector<uint16_t> byte_tokens(const std::string& bytes) {
  std::vector<uint16_t> out(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) out[i] = static_cast<unsigned char>(bytes[i]);
  return out;
}

namespace {

std::string read_all(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(file.string() + ": cannot read");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A text file for a BPE tokenizer: well-formed UTF-8 (Latin-1 or UTF-16 text would be encoded
// as garbage ids without a word), else fabric::Error naming the file and the byte.
std::string utf8_text(const std::filesystem::path& file) {
  std::string text = read_all(file);
  if (const size_t at = first_invalid_utf8(text); at != std::string::npos)
    throw Error(file.string() + ": byte " + std::to_string(at) +
                " is not UTF-8; give UTF-8 text (convert it first, e.g. iconv -t UTF-8)");
  return text;
}

// Little-endian uint16 or uint32 ids.
template <typename Id>
std::string as_bytes(const std::vector<Id>& tokens, size_t begin, size_t end) {
  std::string out;
  out.reserve((end - begin) * sizeof(Id));
  for (size_t i = begin; i < end; ++i)
    for (size_t k = 0; k < sizeof(Id); ++k) out += static_cast<char>((tokens[i] >> (8 * k)) & 0xff);
  return out;
}

}  // namespace

namespace {

std::vector<std::filesystem::path> text_files(
    const std::vector<std::filesystem::path>& inputs,
    const std::function<bool(const std::filesystem::path&)>& accept) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  // Each file once: one read twice (given alone and inside a folder given, or twice) would be
  // counted twice, and its second copy could become the validation split of its first. Inside
  // one folder a second name of a file (a symlink beside it, as Ubuntu's python3.12 has for
  // _sysconfigdata) is the same text under another name: it is read once, silently.
  std::map<fs::path, fs::path> seen;  // the file's canonical path → the --input that gave it
  auto add = [&](const fs::path& file, const fs::path& input, bool in_folder) {
    std::error_code ec;
    fs::path key = fs::weakly_canonical(file, ec);
    if (ec) key = file;
    const auto [it, added] = seen.emplace(key, input);
    if (!added && in_folder && it->second == input) return;
    if (!added)
      throw Error(file.string() + ": read twice (--input " + it->second.string() + " and --input " +
                  input.string() + "); give each file once");
    files.push_back(file);
  };
  for (const fs::path& input : inputs) {
    std::error_code ec;
    if (fs::is_directory(input, ec)) {
      std::vector<fs::path> under;
      for (auto it = fs::recursive_directory_iterator(input, ec); !ec && it != fs::end(it);
           it.increment(ec))
        if (it->is_regular_file(ec) && (!accept || accept(it->path()))) under.push_back(it->path());
      std::sort(under.begin(), under.end());
      for (const fs::path& f : under) add(f, input, true);
    } else if (fs::is_regular_file(input, ec)) {
      add(input, input, false);
    } else {
      throw Error(input.string() + ": no such file or folder (--input)");
    }
  }
  return files;
}

// Splits `tokens` into OUTPUT/train.bin and val.bin, and writes meta.json with `meta_fields`
// (JSON members without braces) before the token counts.
template <typename Id>
PreparedText write_splits(const std::vector<Id>& tokens, size_t files,
                          const std::filesystem::path& output, double val_fraction,
                          const std::string& meta_fields) {
  namespace fs = std::filesystem;
  const auto val = static_cast<size_t>(static_cast<double>(tokens.size()) * val_fraction);
  const size_t train = tokens.size() - val;
  if (val < 2 && tokens.size() >= 4)
    throw Error("--val_fraction " + std::to_string(val_fraction) + " of " +
                std::to_string(tokens.size()) + " tokens leaves " + std::to_string(val) +
                " for val.bin (at least 2); raise --val_fraction");
  if (train < 2 || val < 2)
    throw Error(std::to_string(tokens.size()) + " tokens of text in " + std::to_string(files) +
                " file(s) are too few for a train and a val split; give more text");
  std::error_code ec;
  fs::create_directories(output, ec);
  if (ec) throw Error(output.string() + ": cannot create (" + ec.message() + ")");
  // meta.json goes first and comes back last: a run cut short (a kill, a full disk) leaves a
  // folder without it, which training refuses, never the new train.bin beside an old val.bin
  // and meta.json. Temporary files of earlier runs that were killed go too.
  for (const auto& e : fs::directory_iterator(output, ec)) {
    const std::string file = e.path().filename().string();
    const size_t tmp = file.find(".tmp.");
    if (tmp == std::string::npos) continue;
    const std::string name = file.substr(0, tmp), pid = file.substr(tmp + 5);
    if (name != "train.bin" && name != "val.bin" && name != "meta.json") continue;
    if (!pid.empty() && pid.size() <= 9 &&
        pid.find_first_not_of("0123456789") == std::string::npos &&
        ::kill(static_cast<pid_t>(std::stoll(pid)), 0) != 0 && errno == ESRCH)
      fs::remove(e.path(), ec);
  }
  fs::remove(output / "meta.json", ec);
  if (ec) throw Error((output / "meta.json").string() + ": cannot replace (" + ec.message() + ")");
  write_file_atomically(output / "train.bin", as_bytes(tokens, 0, train));
  write_file_atomically(output / "val.bin", as_bytes(tokens, train, tokens.size()));
  write_file_atomically(output / "meta.json",
                        "{" + meta_fields + ", \"train_tokens\": " + std::to_string(train) +
                            ", \"val_tokens\": " + std::to_string(val) + "}\n");
  return {static_cast<int64_t>(files), static_cast<int64_t>(train), static_cast<int64_t>(val)};
}

// A JSON string literal of `s` (quotes, backslashes and control characters escaped).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

PreparedText prepare_byte_text(const std::vector<std::filesystem::path>& inputs,
                               const std::filesystem::path& output, double val_fraction,
                               const std::function<bool(const std::filesystem::path&)>& accept) {
  const auto files = text_files(inputs, accept);
  std::vector<uint16_t> tokens;
  for (const auto& file : files) {
    const auto t = byte_tokens(read_all(file));
    tokens.insert(tokens.end(), t.begin(), t.end());
  }
  return write_splits(tokens, files.size(), output, val_fraction,
                      "\"tokenizer\": \"bytes\", \"vocab_size\": 256");
}

PreparedText prepare_bpe_text(const std::vector<std::filesystem::path>& inputs,
                              const std::filesystem::path& output,
                              const std::filesystem::path& vocab_json,
                              const std::filesystem::path& merges_txt, double val_fraction,
                              const std::function<bool(const std::filesystem::path&)>& accept) {
  namespace fs = std::filesystem;
  const BpeTokenizer bpe = BpeTokenizer::load(vocab_json, merges_txt);
  if (bpe.vocab_size() > 65536)
    throw Error(vocab_json.string() + ": " + std::to_string(bpe.vocab_size()) +
                " ids do not fit uint16 token files, the only kind prepare_text writes");
  const auto files = text_files(inputs, accept);
  std::vector<uint16_t> tokens;
  for (const auto& file : files) {
    for (const int64_t id : bpe.encode(utf8_text(file)))
      tokens.push_back(static_cast<uint16_t>(id));
    if (bpe.eot() >= 0) tokens.push_back(static_cast<uint16_t>(bpe.eot()));
  }
  return write_splits(
      tokens, files.size(), output, val_fraction,
      "\"tokenizer\": \"gpt2-bpe\", \"vocab_size\": " + std::to_string(bpe.vocab_size()) +
          ", \"vocab\": " + json_string(fs::absolute(vocab_json).string()) +
          ", \"merges\": " + json_string(fs::absolute(merges_txt).string()));
}

PreparedText prepare_hf_text(const std::vector<std::filesystem::path>& inputs,
                             const std::filesystem::path& output,
                             const std::filesystem::path& tokenizer_json, double val_fraction,
                             const std::function<bool(const std::filesystem::path&)>& accept) {
  namespace fs = std::filesystem;
  const BpeTokenizer bpe = BpeTokenizer::from_tokenizer_json(tokenizer_json);
  // Token files hold uint32 ids at most: a larger id would be written cut to its low 32 bits.
  if (bpe.vocab_size() > (int64_t{1} << 32))
    throw Error(tokenizer_json.string() + ": ids up to " + std::to_string(bpe.vocab_size() - 1) +
                " do not fit the token files' uint32; give a tokenizer with ids below 2^32");
  const auto files = text_files(inputs, accept);
  std::vector<uint32_t> tokens;
  for (const auto& file : files) {
    for (const int64_t id : bpe.encode(utf8_text(file)))
      tokens.push_back(static_cast<uint32_t>(id));
    if (bpe.eot() >= 0) tokens.push_back(static_cast<uint32_t>(bpe.eot()));
  }
  const std::string fields =
      "\"tokenizer\": \"hf-tokenizer\", \"vocab_size\": " + std::to_string(bpe.vocab_size()) +
      ", \"tokenizer_json\": " + json_string(fs::absolute(tokenizer_json).string());
  if (bpe.vocab_size() > 65536) {
    PreparedText done = write_splits(tokens, files.size(), output, val_fraction,
                                     fields + ", \"token_dtype\": \"uint32\"");
    done.no_separator = bpe.eot() < 0;
    return done;
  }
  const std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
  PreparedText done = write_splits(narrow, files.size(), output, val_fraction, fields);
  done.no_separator = bpe.eot() < 0;
  return done;
}

}  // namespace fabric
