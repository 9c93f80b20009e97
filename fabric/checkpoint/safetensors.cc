#include "fabric/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/types.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"
#include "fabric/core/files.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace fabric {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data are little-endian; this build writes native bytes");

struct Dtype {
  const char* name;
  at::ScalarType type;
};
constexpr Dtype kDtypes[] = {
    {"BOOL", at::kBool},
    {"U8", at::kByte},
    {"I8", at::kChar},
    {"I16", at::kShort},
    {"U16", at::kUInt16},
    {"I32", at::kInt},
    {"U32", at::kUInt32},
    {"I64", at::kLong},
    {"U64", at::kUInt64},
    {"F16", at::kHalf},
    {"BF16", at::kBFloat16},
    {"F32", at::kFloat},
    {"F64", at::kDouble},
    {"C64", at::kComplexFloat},
    {"F8_E4M3", at::kFloat8_e4m3fn},
    {"F8_E5M2", at::kFloat8_e5m2},
    {"F8_E8M0", at::kFloat8_e8m0fnu},
};

const char* dtype_name(at::ScalarType type) {
  for (const auto& d : kDtypes)
    if (d.type == type) return d.name;
  return nullptr;
}

std::string known_dtypes() {
  std::string out;
  for (const auto& d : kDtypes) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// The whole file mapped copy-on-write; unmapped when the last tensor viewing it goes.
struct Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr) ::munmap(addr, size);
  }
};

std::shared_ptr<Mapping> map_file(const std::string& path) {
  require_regular_file(path);  // a FIFO would block open() forever
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot read: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(path + ": cannot read: " + std::strerror(err));
  }
  auto m = std::make_shared<Mapping>();
  m->size = static_cast<size_t>(st.st_size);
  if (m->size > 0) {
    void* addr = ::mmap(nullptr, m->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw Error(path + ": cannot map: " + std::strerror(err));
    }
    m->addr = addr;
  }
  ::close(fd);
  return m;
}

struct Entry {
  std::string name;
  at::ScalarType type;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

Entry read_entry(const std::string& path, const std::string& name, const json& e) {
  const std::string where = path + ": tensor '" + name + "': ";
  if (!e.is_object()) throw Error(where + "its header entry is not an object");
  Entry out{name, at::kFloat, {}, 0, 0};
  const auto dtype = e.find("dtype");
  if (dtype == e.end() || !dtype->is_string()) throw Error(where + "no \"dtype\" string");
  const auto& dname = dtype->get_ref<const std::string&>();
  const auto known = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                  [&](const Dtype& d) { return dname == d.name; });
  if (known == std::end(kDtypes))
    throw Error(where + "dtype " + dname + " has no torch dtype (readable: " + known_dtypes() +
                ")");
  out.type = known->type;
  const auto shape = e.find("shape");
  if (shape == e.end() || !shape->is_array()) throw Error(where + "no \"shape\" list");
  for (const auto& d : *shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{INT64_MAX})
      throw Error(where + "shape " + shape->dump() + " is not sizes");
    out.shape.push_back(d.get<int64_t>());
  }
  const auto offsets = e.find("data_offsets");
  if (offsets == e.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned())
    throw Error(where + "no \"data_offsets\" [begin, end]");
  out.begin = (*offsets)[0].get<uint64_t>();
  out.end = (*offsets)[1].get<uint64_t>();
  if (out.end < out.begin)
    throw Error(where + "data_offsets " + offsets->dump() + " end before they begin");
  // In checked arithmetic: a shape whose byte size overflows 64 bits must not wrap around to
  // the range's size (Python's safetensors refuses it too).
  uint64_t bytes = c10::elementSize(out.type);
  int64_t elements = 1;
  for (const int64_t d : out.shape) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes) ||
        __builtin_mul_overflow(elements, d, &elements))
      throw Error(where + "shape " + shape_text(out.shape) + " of " + dname +
                  " is too large: its size overflows 64 bits");
  }
  if (bytes != out.end - out.begin)
    throw Error(where + "data_offsets " + offsets->dump() + " hold " +
                std::to_string(out.end - out.begin) + " bytes, but shape " + shape_text(out.shape) +
                " of " + dname + " needs " + std::to_string(bytes));
  return out;
}

}  // namespace

bool looks_like_safetensors(std::string_view first_bytes) {
  return first_bytes.size() >= 9 && first_bytes[8] == '{' && first_bytes.substr(0, 4) != "PK\3\4";
}

bool is_safetensors_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;  // a FIFO would block the open below
  std::string head(9, '\0');
  std::ifstream in(path, std::ios::binary);
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  return looks_like_safetensors(head);
}

void save_safetensors(const fs::path& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string where = "cannot write " + path.string() + ": ";
  std::vector<std::pair<std::string, at::Tensor>> data;
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__")
      throw Error(where + "\"__metadata__\" is the file's metadata, not a tensor name");
    if (!names.insert(name).second) throw Error(where + "duplicate name " + name);
    if (!t.defined()) throw Error(where + "tensor " + name + " is undefined");
    if (!dtype_name(t.scalar_type()))
      throw Error(where + "tensor " + name + ": dtype " +
                  std::string(c10::toString(t.scalar_type())) +
                  " has no safetensors name (writable: " + known_dtypes() + ")");
    data.emplace_back(name, t.detach().to(at::kCPU).contiguous());
  }
  std::stable_sort(data.begin(), data.end(), [](const auto& a, const auto& b) {
    return a.second.element_size() > b.second.element_size();
  });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : data) {
    const uint64_t bytes = t.nbytes();
    header[name] = {{"dtype", dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data start at a multiple of 8
  const uint64_t length = text.size();
  char prefix[8];
  std::memcpy(prefix, &length, sizeof prefix);
  AtomicFile file(path);
  file.write(std::string_view(prefix, sizeof prefix));
  file.write(text);
  for (const auto& [name, t] : data)
    file.write(std::string_view(static_cast<const char*>(t.const_data_ptr()), t.nbytes()));
  file.commit();
}

SafetensorsFile load_safetensors(const fs::path& path) {
  const std::string p = path.string();
  const auto mapping = map_file(p);
  const auto* base = static_cast<const char*>(mapping->addr);
  const uint64_t size = mapping->size;
  if (size < 8)
    throw Error(p + ": not a safetensors file (" + std::to_string(size) +
                " bytes, shorter than the 8-byte header length)");
  uint64_t length = 0;
  std::memcpy(&length, base, sizeof length);
  if (length > size - 8)
    throw Error(p + ": not a safetensors file (its header length " + std::to_string(length) +
                " runs past the end of the " + std::to_string(size) + "-byte file; truncated?)");
  const std::string_view text(base + 8, length);
  if (text.empty() || text.front() != '{')
    throw Error(p +
                ": not a safetensors file (the header after the first 8 bytes is not a JSON "
                "object)");
  json header;
  std::set<std::string> names;
  std::string twice;  // a tensor the header names twice (JSON parsers keep one of the two)
  try {
    header = json::parse(text, [&](int depth, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::key && depth == 1 && twice.empty() &&
          !names.insert(parsed.get<std::string>()).second)
        twice = parsed.get<std::string>();
      return true;
    });
  } catch (const json::exception& e) {
    throw Error(p + ": the safetensors header is not JSON (" + e.what() + ")");
  }
  if (!twice.empty())
    throw Error(p + ": the safetensors header names '" + twice +
                "' twice (a valid file names each tensor once)");
  if (!header.is_object()) throw Error(p + ": the safetensors header is not a JSON object");

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) throw Error(p + ": \"__metadata__\" is not an object of strings");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) throw Error(p + ": \"__metadata__\" entry '" + k + "' is not a string");
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    entries.push_back(read_entry(p, name, value));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const uint64_t data_size = size - 8 - length;
  uint64_t expected = 0;
  for (const auto& e : entries) {
    if (e.begin != expected)
      throw Error(p + ": tensor '" + e.name + "' starts at byte " + std::to_string(e.begin) +
                  " of the data, where " +
                  (e.begin > expected
                       ? "a gap of " + std::to_string(e.begin - expected) + " bytes precedes it"
                       : std::string("it overlaps the tensor before it")) +
                  " (a valid file has no gaps and no overlaps)");
    expected = e.end;
  }
  if (expected != data_size)
    throw Error(p + ": the tensors' data end at byte " + std::to_string(expected) +
                " but the file holds " + std::to_string(data_size) + " bytes of data" +
                (expected > data_size ? " (truncated?)" : " (trailing bytes)"));

  const char* data = base + 8 + length;
  for (const auto& e : entries) {
    const auto options = at::TensorOptions().dtype(e.type);
    const size_t bytes = e.end - e.begin;
    const char* at_ptr = data + e.begin;
    at::Tensor t;
    if (bytes == 0) {
      t = at::empty(e.shape, options);
    } else if (reinterpret_cast<uintptr_t>(at_ptr) % c10::elementSize(e.type) != 0) {
      t = at::empty(e.shape, options);  // misaligned for the dtype: copied
      std::memcpy(t.data_ptr(), at_ptr, bytes);
    } else {
      t = at::from_blob(
          const_cast<char*>(at_ptr), e.shape, [mapping](void*) {}, options);
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace fabric
