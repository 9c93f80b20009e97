#include "fabric/data/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <vector>

#include <torch/types.h>

#include "fabric/core/error.h"

namespace fabric {
namespace {

constexpr char kMagic[] = "\x93NUMPY";

// A file mapped copy-on-write (readable and writable; writes stay private).
class Mapping {
 public:
  explicit Mapping(const std::string& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw Error(path + ": not a regular file");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        throw Error(path + ": cannot map: " + std::strerror(e));
      }
      data_ = static_cast<char*>(p);
    }
    ::close(fd);
  }
  ~Mapping() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::string path_;
  char* data_ = nullptr;
  size_t size_ = 0;
};

uint64_t le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

struct Header {
  char order = '<';  // '<' little, '>' big, '|' not applicable
  char kind = 'f';
  size_t itemsize = 4;
  bool fortran = false;
  std::vector<int64_t> shape;
};

// The value text after 'key': in a header dict ("" when absent).
size_t find_key(const std::string& dict, const std::string& key) {
  for (const char* quote : {"'", "\""}) {
    const size_t at = dict.find(quote + key + quote);
    if (at == std::string::npos) continue;
    const size_t colon = dict.find(':', at + key.size() + 2);
    if (colon == std::string::npos) return std::string::npos;
    size_t v = colon + 1;
    while (v < dict.size() && dict[v] == ' ') ++v;
    return v;
  }
  return std::string::npos;
}

Header parse_header(const std::string& dict, const std::string& name) {
  auto bad = [&](const std::string& what) {
    return Error(name + ": not a NumPy array header (" + what + ")");
  };
  Header h;
  size_t at = find_key(dict, "descr");
  if (at == std::string::npos || at >= dict.size()) throw bad("no 'descr'");
  if (dict[at] == '[')
    throw Error(name + ": a structured array (record dtype) cannot be read; save each field as " +
                "its own numeric array");
  const char quote = dict[at];
  const size_t end = dict.find(quote, at + 1);
  if ((quote != '\'' && quote != '"') || end == std::string::npos) throw bad("malformed 'descr'");
  const std::string descr = dict.substr(at + 1, end - at - 1);
  if (descr.size() < 2) throw bad("malformed 'descr'");
  size_t k = 0;
  if (descr[0] == '<' || descr[0] == '>' || descr[0] == '|' || descr[0] == '=') {
    h.order = descr[0] == '=' ? '<' : descr[0];
    k = 1;
  }
  h.kind = descr[k];
  const std::string digits = descr.substr(k + 1);
  if (h.kind == 'O')
    throw Error(
        name + ": holds Python objects (dtype object, pickled), which cannot be read " +
        "without running code; save a numeric array, e.g. np.save(f, a.astype(np.float32))");
  if (digits.empty() || digits.size() > 2 ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    throw Error(name + ": dtype '" + one_line(descr, 40) +
                "' is not supported (numbers and bool only)");
  h.itemsize = std::stoul(digits);

  at = find_key(dict, "fortran_order");
  if (at == std::string::npos) throw bad("no 'fortran_order'");
  if (dict.compare(at, 4, "True") == 0) {
    h.fortran = true;
  } else if (dict.compare(at, 5, "False") != 0) {
    throw bad("malformed 'fortran_order'");
  }

  at = find_key(dict, "shape");
  if (at == std::string::npos || at >= dict.size() || dict[at] != '(') throw bad("no 'shape'");
  const size_t close = dict.find(')', at);
  if (close == std::string::npos) throw bad("malformed 'shape'");
  const std::string dims = dict.substr(at + 1, close - at - 1);
  size_t i = 0;
  while (i < dims.size()) {
    while (i < dims.size() && (dims[i] == ' ' || dims[i] == ',')) ++i;
    if (i == dims.size()) break;
    size_t j = i;
    while (j < dims.size() && dims[j] >= '0' && dims[j] <= '9') ++j;
    if (j == i || j - i > 18) throw bad("malformed 'shape'");
    h.shape.push_back(std::stoll(dims.substr(i, j - i)));
    if (j < dims.size() && dims[j] == 'L') ++j;  // written by Python 2
    i = j;
    if (i < dims.size() && dims[i] != ',' && dims[i] != ' ') throw bad("malformed 'shape'");
  }
  if (h.shape.size() > 32) throw Error(name + ": more than 32 dimensions");
  return h;
}

c10::ScalarType scalar_type(const Header& h, const std::string& name) {
  const std::string dtype = std::string(1, h.kind) + std::to_string(h.itemsize);
  static const std::map<std::string, c10::ScalarType> types = {
      {"b1", torch::kBool},          {"i1", torch::kInt8},   {"u1", torch::kUInt8},
      {"i2", torch::kInt16},         {"u2", torch::kUInt16}, {"i4", torch::kInt32},
      {"u4", torch::kUInt32},        {"i8", torch::kInt64},  {"f2", torch::kHalf},
      {"f4", torch::kFloat},         {"f8", torch::kDouble}, {"c8", torch::kComplexFloat},
      {"c16", torch::kComplexDouble}};
  auto it = types.find(dtype);
  if (it == types.end()) {
    const std::string hint =
        dtype == "u8" ? "; convert it with a.astype(np.int64)" : " (numbers and bool only)";
    throw Error(name + ": dtype '" + one_line(dtype, 40) + "' is not supported" + hint);
  }
  return it->second;
}

// ZIP structures (.npz), bounds-checked.
struct Member {
  std::string name;
  int method = 0;
  uint64_t compressed = 0, uncompressed = 0, local = 0;
};

std::vector<Member> zip_members(const char* d, size_t n, const std::string& path) {
  auto bad = [&](const std::string& what) {
    return Error(path + ": not a valid .npz (" + what + ")");
  };
  if (n < 22) throw bad("too short for a zip archive");
  size_t eocd = std::string::npos;
  const size_t lowest = n > 22 + 65535 ? n - 22 - 65535 : 0;
  for (size_t i = n - 22 + 1; i-- > lowest;) {
    if (le(d + i, 4) == 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd == std::string::npos) throw bad("no end-of-directory record");
  uint64_t entries = le(d + eocd + 10, 2), cd_size = le(d + eocd + 12, 4),
           cd_offset = le(d + eocd + 16, 4);
  if ((entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) && eocd >= 20 &&
      le(d + eocd - 20, 4) == 0x07064b50) {
    const uint64_t z = le(d + eocd - 20 + 8, 8);
    if (z > n || n - z < 56 || le(d + z, 4) != 0x06064b50) throw bad("bad zip64 record");
    entries = le(d + z + 32, 8);
    cd_size = le(d + z + 40, 8);
    cd_offset = le(d + z + 48, 8);
  }
  if (cd_offset > n || cd_size > n - cd_offset) throw bad("directory outside the file");
  std::vector<Member> out;
  size_t p = cd_offset;
  for (uint64_t e = 0; e < entries; ++e) {
    if (p > n || n - p < 46 || le(d + p, 4) != 0x02014b50) throw bad("bad directory entry");
    Member m;
    if (le(d + p + 8, 2) & 1) throw Error(path + ": encrypted members cannot be read");
    m.method = static_cast<int>(le(d + p + 10, 2));
    m.compressed = le(d + p + 20, 4);
    m.uncompressed = le(d + p + 24, 4);
    const size_t name_len = le(d + p + 28, 2), extra_len = le(d + p + 30, 2),
                 comment_len = le(d + p + 32, 2);
    m.local = le(d + p + 42, 4);
    if (n - p - 46 < name_len + extra_len + comment_len) throw bad("bad directory entry");
    m.name.assign(d + p + 46, name_len);
    // zip64 extra field: the 0xFFFFFFFF sizes and offset, in this order.
    const char* x = d + p + 46 + name_len;
    for (size_t q = 0; q + 4 <= extra_len;) {
      const uint64_t id = le(x + q, 2), len = le(x + q + 2, 2);
      if (q + 4 + len > extra_len) break;
      if (id == 1) {
        size_t r = q + 4;
        for (uint64_t* field : {&m.uncompressed, &m.compressed, &m.local}) {
          if (*field != 0xFFFFFFFF) continue;
          if (r + 8 > q + 4 + len) throw bad("bad zip64 field");
          *field = le(x + r, 8);
          r += 8;
        }
      }
      q += 4 + len;
    }
    out.push_back(m);
    p += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

}  // namespace

torch::Tensor parse_npy(const char* bytes, size_t size, const std::string& name,
                        std::shared_ptr<const void> owner) {
  if (size < 10 || std::memcmp(bytes, kMagic, 6) != 0)
    throw Error(name + ": not a .npy file (no \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  if (major < 1 || major > 3)
    throw Error(name + ": .npy format version " + std::to_string(major) + " is not supported");
  const size_t len_bytes = major == 1 ? 2 : 4;
  if (size < 8 + len_bytes) throw Error(name + ": truncated header");
  const uint64_t header_len = le(bytes + 8, static_cast<int>(len_bytes));
  const size_t start = 8 + len_bytes;
  if (header_len > size - start) throw Error(name + ": truncated header");
  const Header h = parse_header(std::string(bytes + start, header_len), name);
  const c10::ScalarType type = scalar_type(h, name);
  if (h.itemsize != c10::elementSize(type)) throw Error(name + ": inconsistent dtype size");

  int64_t numel = 1, extent = 1;  // extent: the product with zeros skipped (strides need it)
  for (int64_t d : h.shape) {
    if (d < 0 || (d > 0 && extent > std::numeric_limits<int64_t>::max() / 16 / d))
      throw Error(name + ": shape too large");
    numel *= d;
    extent *= std::max<int64_t>(d, 1);
  }
  const size_t offset = start + header_len;
  const uint64_t need = static_cast<uint64_t>(numel) * h.itemsize;
  if (numel > 0 && need / static_cast<uint64_t>(numel) != h.itemsize)
    throw Error(name + ": shape too large");
  if (need > size - offset) {
    throw Error(name + ": truncated: the header's shape needs " + std::to_string(need) +
                " bytes of data, the file has " + std::to_string(size - offset));
  }
  const char* data = bytes + offset;
  const bool swap = h.order == '>' && h.itemsize > 1;
  const size_t align = std::min<size_t>(h.itemsize, 8);
  torch::Tensor flat;
  if (!swap && reinterpret_cast<uintptr_t>(data) % align == 0 && type != torch::kBool) {
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast): the mapping is private and writable
    flat = torch::from_blob(
        const_cast<char*>(data), {numel}, [owner](void*) {}, torch::TensorOptions().dtype(type));
  } else {
    const auto raw_type = type == torch::kBool ? torch::kUInt8 : type;
    flat = torch::empty({numel}, torch::TensorOptions().dtype(raw_type));
    char* out = static_cast<char*>(flat.data_ptr());
    if (swap) {  // per component: a complex number is two floats, each byte-swapped
      const size_t unit = h.kind == 'c' ? h.itemsize / 2 : h.itemsize;
      const size_t units = need / unit;
      for (size_t i = 0; i < units; ++i)
        for (size_t b = 0; b < unit; ++b) out[i * unit + b] = data[i * unit + (unit - 1 - b)];
    } else {
      std::memcpy(out, data, need);
    }
    if (type == torch::kBool) flat = flat.ne(0);
  }
  if (type == torch::kUInt16) flat = flat.to(torch::kInt32);
  if (type == torch::kUInt32) flat = flat.to(torch::kInt64);
  if (!h.fortran) return flat.view(h.shape);
  std::vector<int64_t> reversed(h.shape.rbegin(), h.shape.rend()), dims;
  for (int64_t i = static_cast<int64_t>(h.shape.size()) - 1; i >= 0; --i) dims.push_back(i);
  return flat.view(reversed).permute(dims);
}

torch::Tensor load_npy(const std::string& path) {
  auto mapping = std::make_shared<Mapping>(path);
  return parse_npy(mapping->data(), mapping->size(), path, mapping);
}

std::map<std::string, torch::Tensor> load_npz(const std::string& path) {
  auto mapping = std::make_shared<Mapping>(path);
  return parse_npz(mapping->data(), mapping->size(), path, mapping);
}

std::map<std::string, torch::Tensor> parse_npz(const char* d, size_t n, const std::string& path,
                                               std::shared_ptr<const void> owner) {
  std::map<std::string, torch::Tensor> out;
  for (const Member& m : zip_members(d, n, path)) {
    const std::string name = path + ":" + one_line(m.name, 200);
    if (m.local > n || n - m.local < 30 || le(d + m.local, 4) != 0x04034b50)
      throw Error(name + ": bad local header");
    const uint64_t start = m.local + 30 + le(d + m.local + 26, 2) + le(d + m.local + 28, 2);
    if (start > n || m.compressed > n - start) throw Error(name + ": member outside the file");
    std::string key = m.name;
    if (key.size() > 4 && key.compare(key.size() - 4, 4, ".npy") == 0) key.resize(key.size() - 4);
    if (m.method == 0) {
      out[key] = parse_npy(d + start, m.compressed, name, owner);
      continue;
    }
    if (m.method != 8)
      throw Error(name + ": compression method " + std::to_string(m.method) +
                  " is not supported (stored or deflate only)");
    // Deflate expands at most ~1032:1; a larger claim is corrupt (and must not allocate).
    if (m.uncompressed > m.compressed * 1100 + 4096)
      throw Error(name + ": corrupt (claims " + std::to_string(m.uncompressed) + " bytes from " +
                  std::to_string(m.compressed) + " compressed)");
    auto buffer = std::make_shared<std::string>(m.uncompressed, '\0');
    z_stream z{};
    if (inflateInit2(&z, -MAX_WBITS) != Z_OK) throw Error(name + ": cannot start zlib");
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(d + start));
    z.avail_in =
        static_cast<uInt>(std::min<uint64_t>(m.compressed, std::numeric_limits<uInt>::max()));
    z.next_out = reinterpret_cast<Bytef*>(buffer->data());
    z.avail_out =
        static_cast<uInt>(std::min<uint64_t>(m.uncompressed, std::numeric_limits<uInt>::max()));
    int rc = Z_OK;
    uint64_t in_left = m.compressed - z.avail_in, out_left = m.uncompressed - z.avail_out;
    while (rc == Z_OK) {
      rc = inflate(&z, Z_NO_FLUSH);
      if (z.avail_in == 0 && in_left > 0) {
        z.avail_in =
            static_cast<uInt>(std::min<uint64_t>(in_left, std::numeric_limits<uInt>::max()));
        in_left -= z.avail_in;
      }
      if (z.avail_out == 0 && out_left > 0) {
        z.avail_out =
            static_cast<uInt>(std::min<uint64_t>(out_left, std::numeric_limits<uInt>::max()));
        out_left -= z.avail_out;
      }
      if (rc == Z_BUF_ERROR && (z.avail_in > 0 || in_left > 0) && z.avail_out > 0) rc = Z_OK;
    }
    const uint64_t produced = z.total_out;
    inflateEnd(&z);
    if (rc != Z_STREAM_END || produced != m.uncompressed)
      throw Error(name + ": corrupt compressed data");
    out[key] = parse_npy(buffer->data(), buffer->size(), name, buffer);
  }
  return out;
}

NpyDataset::NpyDataset(torch::Tensor inputs, torch::Tensor targets, std::string inputs_name,
                       std::string targets_name)
    : inputs_(std::move(inputs)),
      targets_(std::move(targets)),
      inputs_name_(std::move(inputs_name)),
      targets_name_(std::move(targets_name)) {
  if (inputs_.dim() == 0 || targets_.dim() == 0)
    throw Error(inputs_.dim() == 0 ? inputs_name_ + ": a 0-d array has no rows"
                                   : targets_name_ + ": a 0-d array has no rows");
  if (inputs_.size(0) != targets_.size(0)) {
    throw Error(inputs_name_ + " has " + std::to_string(inputs_.size(0)) + " rows but " +
                targets_name_ + " has " + std::to_string(targets_.size(0)));
  }
  if (!c10::isFloatingType(targets_.scalar_type()) && !c10::isComplexType(targets_.scalar_type()))
    targets_ = targets_.to(torch::kInt64);  // class labels (small next to the inputs)
}

std::shared_ptr<NpyDataset> NpyDataset::open(const std::string& inputs_path,
                                             const std::string& targets_path) {
  return std::make_shared<NpyDataset>(load_npy(inputs_path), load_npy(targets_path), inputs_path,
                                      targets_path);
}

Batch NpyDataset::get_batch(const std::vector<int64_t>& indices) const {
  const auto idx = torch::tensor(indices, torch::kInt64);
  return {inputs_.index_select(0, idx), targets_.index_select(0, idx)};
}

}  // namespace fabric
