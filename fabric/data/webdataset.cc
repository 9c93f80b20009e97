#include "fabric/data/webdataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "fabric/core/error.h"

namespace fabric {
namespace {

constexpr int64_t kBlock = 512;
constexpr size_t kMaxNames = 1000000;

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The alternatives inside one pair of braces: a numeric range or a comma list (commas inside
// nested braces belong to the nested ones).
std::vector<std::string> alternatives(const std::string& inner, const std::string& pattern) {
  const size_t dots = inner.find("..");
  if (dots != std::string::npos && all_digits(inner.substr(0, dots)) &&
      all_digits(inner.substr(dots + 2))) {
    const std::string a = inner.substr(0, dots), b = inner.substr(dots + 2);
    if (a.size() > 18 || b.size() > 18) throw Error(pattern + ": a range bound is too long");
    const int64_t from = std::stoll(a), to = std::stoll(b);
    const bool pad =
        a.size() == b.size() || (a.size() > 1 && a[0] == '0') || (b.size() > 1 && b[0] == '0');
    const size_t width = pad ? std::max(a.size(), b.size()) : 0;
    if (static_cast<uint64_t>(std::abs(to - from)) >= kMaxNames)
      throw Error(pattern + ": {" + inner + "} names more than 1000000 shards");
    std::vector<std::string> out;
    const int64_t step = from <= to ? 1 : -1;
    for (int64_t i = from;; i += step) {
      std::string text = std::to_string(i);
      if (text.size() < width) text.insert(0, width - text.size(), '0');
      out.push_back(std::move(text));
      if (i == to) break;
    }
    return out;
  }
  std::vector<std::string> out;
  int depth = 0;
  std::string current;
  for (char c : inner) {
    if (c == ',' && depth == 0) {
      out.push_back(current);
      current.clear();
      continue;
    }
    if (c == '{') ++depth;
    if (c == '}') --depth;
    current += c;
  }
  out.push_back(current);
  if (out.size() == 1) return {"{" + inner + "}"};  // "{x}": not an expansion (as braceexpand)
  return out;
}

void expand_into(const std::string& text, const std::string& pattern,
                 std::vector<std::string>& out) {
  const size_t open = text.find('{');
  if (open == std::string::npos) {
    if (text.find('}') != std::string::npos) throw Error(pattern + ": unmatched '}'");
    if (out.size() >= kMaxNames) throw Error(pattern + ": names more than 1000000 shards");
    out.push_back(text);
    return;
  }
  if (text.substr(0, open).find('}') != std::string::npos) throw Error(pattern + ": unmatched '}'");
  int depth = 0;
  size_t close = std::string::npos;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == '{') ++depth;
    if (text[i] == '}' && --depth == 0) {
      close = i;
      break;
    }
  }
  if (close == std::string::npos) throw Error(pattern + ": unmatched '{'");
  const std::string head = text.substr(0, open), tail = text.substr(close + 1);
  const std::vector<std::string> choices =
      alternatives(text.substr(open + 1, close - open - 1), pattern);
  if (choices.size() == 1 && choices[0].front() == '{') {  // literal braces: keep, go on after
    std::vector<std::string> rest;
    expand_into(tail, pattern, rest);
    for (auto& r : rest) {
      if (out.size() >= kMaxNames) throw Error(pattern + ": names more than 1000000 shards");
      out.push_back(head + choices[0] + r);  // `head` holds no brace
    }
    return;
  }
  for (const auto& choice : choices) expand_into(head + choice + tail, pattern, out);
}

// An octal (or GNU base-256) number field of a tar header; -1 when it is not one.
int64_t number_field(const unsigned char* field, size_t width) {
  if (field[0] & 0x80) {  // base-256: big-endian two's complement, first byte's top bit set
    if (field[0] & 0x40) return -1;  // negative
    uint64_t v = field[0] & 0x3f;
    for (size_t i = 1; i < width; ++i) {
      if (v >> 55) return -1;
      v = (v << 8) | field[i];
    }
    return static_cast<int64_t>(v);
  }
  size_t i = 0;
  while (i < width && field[i] == ' ') ++i;
  int64_t v = 0;
  bool any = false;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; ++i) {
    if (v >> 60) return -1;
    v = v * 8 + (field[i] - '0');
    any = true;
  }
  for (; i < width; ++i)
    if (field[i] != ' ' && field[i] != '\0') return -1;
  return any ? v : 0;
}

std::string string_field(const unsigned char* field, size_t width) {
  const char* s = reinterpret_cast<const char*>(field);
  return std::string(s, strnlen(s, width));
}

class File {
 public:
  // O_NONBLOCK: a FIFO would block open() until a writer came (regular files ignore it).
  explicit File(const std::string& path)
      : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)) {}
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  int fd() const { return fd_; }
  // Reads exactly `n` bytes at `offset`; false at the end of the file or on an error (errno).
  bool read_at(void* data, int64_t n, int64_t offset) const {
    auto* p = static_cast<char*>(data);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, static_cast<size_t>(n), offset);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      p += got;
      n -= got;
      offset += got;
    }
    return true;
  }

 private:
  int fd_;
};

// The "path" record of a pax extended header ("LEN path=VALUE\n" records), or "".
std::string pax_path(const std::string& records) {
  size_t at = 0;
  while (at < records.size()) {
    const size_t space = records.find(' ', at);
    if (space == std::string::npos) break;
    const long long len = std::atoll(records.substr(at, space - at).c_str());
    if (len <= 0 || at + static_cast<size_t>(len) > records.size()) break;
    const std::string record = records.substr(space + 1, at + len - space - 2);  // drop '\n'
    if (record.rfind("path=", 0) == 0) return record.substr(5);
    at += static_cast<size_t>(len);
  }
  return "";
}

}  // namespace

std::vector<std::string> expand_braces(const std::string& pattern) {
  std::vector<std::string> out;
  expand_into(pattern, pattern, out);
  return out;
}

std::vector<TarMember> list_tar(const std::string& path) {
  File file(path);
  struct stat st {};
  if (file.fd() < 0 || ::fstat(file.fd(), &st) != 0)
    throw Error(path + ": cannot read (" + std::strerror(errno) + ")");
  const int64_t file_size = st.st_size;
  std::vector<TarMember> out;
  std::string long_name;  // from a GNU 'L' or pax 'x' entry, for the next member
  unsigned char h[kBlock];
  int64_t at = 0;
  while (true) {
    if (at + kBlock > file_size) {
      if (at == file_size && at > 0) break;  // no end-of-archive blocks: tolerated
      throw Error(path + ": truncated: a tar header at byte " + std::to_string(at) +
                  " runs past the end of the file (" + std::to_string(file_size) + " bytes)");
    }
    if (!file.read_at(h, kBlock, at))
      throw Error(path + ": cannot read at byte " + std::to_string(at) + " (" +
                  std::strerror(errno) + ")");
    if (std::all_of(h, h + kBlock, [](unsigned char c) { return c == 0; })) break;  // the end
    int64_t sum = 0;
    for (int64_t i = 0; i < kBlock; ++i) sum += (i >= 148 && i < 156) ? ' ' : h[i];
    const int64_t stored = number_field(h + 148, 8);
    if (stored != sum)
      throw Error(path + ": not a tar file, or damaged (the header at byte " + std::to_string(at) +
                  " has a wrong checksum)");
    const int64_t size = number_field(h + 124, 12);
    if (size < 0)
      throw Error(path + ": damaged tar header at byte " + std::to_string(at) +
                  " (its size field is not a number)");
    const int64_t data = at + kBlock;
    if (size > file_size - data)
      throw Error(path + ": truncated: member '" + one_line(string_field(h, 100), 100) +
                  "' needs " + std::to_string(size) + " bytes at byte " + std::to_string(data) +
                  ", the file has " + std::to_string(file_size) + " bytes");
    const char type = static_cast<char>(h[156]);
    if (type == 'L' || type == 'x') {
      if (size > (1 << 20))
        throw Error(path + ": a " + (type == 'L' ? "long-name" : "pax") + " header at byte " +
                    std::to_string(at) + " is " + std::to_string(size) + " bytes");
      std::string text(static_cast<size_t>(size), '\0');
      if (size > 0 && !file.read_at(text.data(), size, data))
        throw Error(path + ": cannot read at byte " + std::to_string(data));
      if (type == 'L') {
        long_name = text.substr(0, strnlen(text.c_str(), text.size()));
      } else if (std::string p = pax_path(text); !p.empty()) {
        long_name = p;
      }
    } else if (type == '0' || type == '\0' || type == '7') {
      std::string name;
      if (!long_name.empty()) {
        name = long_name;
      } else {
        name = string_field(h, 100);
        const std::string prefix = string_field(h + 345, 155);
        if (std::memcmp(h + 257, "ustar", 5) == 0 && !prefix.empty()) name = prefix + "/" + name;
      }
      out.push_back({name, data, size});
      long_name.clear();
    } else if (type != 'g') {
      long_name.clear();  // directories, links, devices: not data
    }
    at = data + (size + kBlock - 1) / kBlock * kBlock;
  }
  return out;
}

std::vector<WebDatasetSample> index_webdataset(const std::vector<std::string>& shards) {
  std::vector<WebDatasetSample> out;
  for (size_t s = 0; s < shards.size(); ++s) {
    const size_t before = out.size();
    for (TarMember& member : list_tar(shards[s])) {
      const size_t slash = member.name.rfind('/');
      const size_t base = slash == std::string::npos ? 0 : slash + 1;
      if (base < member.name.size() && member.name[base] == '.') continue;  // hidden
      const size_t dot = member.name.find('.', base);
      if (dot == std::string::npos || dot + 1 == member.name.size()) continue;  // no extension
      std::string key = member.name.substr(0, dot), ext = member.name.substr(dot + 1);
      if (out.size() == before || out.back().key != key) out.push_back({s, std::move(key), {}});
      out.back().members.emplace_back(std::move(ext), std::move(member));
    }
    if (out.size() == before) throw Error(shards[s] + ": no samples (no member has an extension)");
  }
  return out;
}

std::string read_file_range(const std::string& path, int64_t offset, int64_t size,
                            const std::string& name) {
  File file(path);
  if (file.fd() < 0)
    throw Error(name + ": cannot open " + path + " (" + std::strerror(errno) + ")");
  std::string bytes(static_cast<size_t>(size), '\0');
  if (size > 0 && !file.read_at(bytes.data(), size, offset))
    throw Error(name + ": cannot read " + std::to_string(size) + " bytes at byte " +
                std::to_string(offset) + " of " + path + " (the shard changed or is truncated)");
  return bytes;
}

}  // namespace fabric
