#include "fabric/checkpoint/archive.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/pickler_helper.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "fabric/checkpoint/torch_pickle.h"
#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"
#include "fabric/core/files.h"

namespace fabric {

c10::impl::GenericDict new_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

namespace fs = std::filesystem;

namespace {

// CPU, contiguous copies of every tensor in `value` (the pickler writes storages as they are).
c10::IValue to_cpu(const c10::IValue& value) {
  if (value.isTensor()) {
    const auto& t = value.toTensor();
    return t.defined() ? c10::IValue(t.detach().cpu().contiguous()) : value;
  }
  if (value.isGenericDict()) {
    const auto dict = value.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), dict.valueType());
    for (const auto& entry : dict) out.insert(entry.key(), to_cpu(entry.value()));
    return out;
  }
  if (value.isList()) {
    const auto list = value.toList();
    c10::impl::GenericList out(list.elementType());
    for (const auto& item : list) out.push_back(to_cpu(item));
    return out;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const auto& item : value.toTupleRef().elements()) items.push_back(to_cpu(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return value;
}

}  // namespace

namespace {

// Writes `value` in torch.save's layout through `sink` (bytes in order, as they are made).
void write_archive(const c10::IValue& value, const std::function<void(const void*, size_t)>& sink) {
  // torch.save's layout: archive/data.pkl (pickle protocol 2, tensors as persistent ids) and
  // archive/data/<key> (raw storages). Unlike torch::pickle_save, aggregates are not tagged with
  // torch.jit._pickle.restore_type_tag, which torch.load(weights_only=True) refuses.
  std::string pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t n) { pickle.append(data, n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(to_cpu(value));
  pickler.stop();
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    sink(data, n);
    return n;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  writer.writeRecord("byteorder", "little", 6);
  const auto& tensors = pickler.tensorData();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto data = torch::jit::getWriteableTensorData(tensors[i]);
    writer.writeRecord("data/" + std::to_string(i), data.data(), data.sizeInBytes());
  }
  writer.writeEndOfFile();
}

}  // namespace

std::string archive_bytes(const c10::IValue& value) {
  std::string archive;
  write_archive(value, [&](const void* data, size_t n) {
    archive.append(static_cast<const char*>(data), n);
  });
  return archive;
}

void save_archive(const fs::path& path, const c10::IValue& value) {
  // Streamed to the file: the archive is never whole in memory. A failed write (fabric::Error
  // from the file) ends the writer; nothing else is written.
  AtomicFile file(path);
  std::optional<Error> failed;
  try {
    write_archive(value, [&](const void* data, size_t n) {
      if (failed) return;
      try {
        file.write(std::string_view(static_cast<const char*>(data), n));
      } catch (const Error& e) {
        failed = e;
      }
    });
  } catch (const std::exception& e) {
    if (failed) throw *failed;
    std::string why = e.what();
    throw Error("cannot write " + path.string() + ": " + why.substr(0, why.find('\n')));
  }
  if (failed) throw *failed;
  file.commit();
}

namespace {

// CRC-32 (ISO-HDLC, zip's) of `data` continuing from `crc` (0 to start), eight bytes per step.
uint32_t crc32_update(uint32_t crc, const char* data, size_t n) {
  static const auto tables = [] {
    std::array<std::array<uint32_t, 256>, 8> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (size_t k = 1; k < 8; ++k)
      for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
    return t;
  }();
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  crc ^= 0xFFFFFFFFu;
  for (; n >= 8; n -= 8, p += 8) {
    uint32_t one, two;
    std::memcpy(&one, p, 4);  // little-endian hosts only (as torch.save's byteorder record)
    std::memcpy(&two, p + 4, 4);
    one ^= crc;
    crc = tables[7][one & 0xFF] ^ tables[6][(one >> 8) & 0xFF] ^ tables[5][(one >> 16) & 0xFF] ^
          tables[4][one >> 24] ^ tables[3][two & 0xFF] ^ tables[2][(two >> 8) & 0xFF] ^
          tables[1][(two >> 16) & 0xFF] ^ tables[0][two >> 24];
  }
  for (; n > 0; --n, ++p) crc = tables[0][(crc ^ *p) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint64_t little(const std::string& b, size_t at, int bytes) {
  if (at + bytes > b.size()) throw std::runtime_error("truncated zip directory");
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}

// What a file that is not a zip is instead, from its first bytes ("" when nothing is known):
// the zip reader's own text for a JSON file says nothing a user recognises.
std::string what_else(const fs::path& path) {
  char head[64] = {};
  std::ifstream in(path, std::ios::binary);
  in.read(head, sizeof head);
  const std::string_view bytes(head,
                               static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  if (bytes.size() >= 4 && bytes.substr(0, 4) == std::string_view("PK\3\4", 4)) return "";
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return bytes.empty() ? "an empty file" : "";
  if (bytes[first] == '{' || bytes[first] == '[') return "JSON text";
  if (std::all_of(bytes.begin(), bytes.end(), [](char c) {
        return c == '\n' || c == '\r' || c == '\t' || (c >= 0x20 && c < 0x7f);
      }))
    return "text";
  return "";
}

UnreadableArchive unreadable(const fs::path& path, const std::exception& e) {
  if (const std::string other = what_else(path); !other.empty())
    return UnreadableArchive(path.string() + ": not a readable PyTorch file (it is " + other +
                             ", not torch.save's zip archive)");
  std::string why = e.what();
  why = why.substr(0, why.find('\n'));
  // miniz explains at length what a damaged file may be; the first sentence says it.
  if (const size_t cut = why.find(". This is an internal miniz error"); cut != std::string::npos)
    why = why.substr(0, cut);
  return UnreadableArchive(path.string() + ": not a readable PyTorch file (" + why + ")");
}

// A record as the zip central directory lists it.
struct ZipEntry {
  uint32_t crc = 0;
  uint64_t size = 0;          // stored (torch.save does not compress)
  uint64_t local_header = 0;  // offset of its local header
};

// Reads byte ranges of a file; throws std::runtime_error past its end.
class FileRanges {
 public:
  explicit FileRanges(const fs::path& path)
      : in_(path, std::ios::binary), size_(fs::file_size(path)) {}
  uint64_t size() const { return size_; }
  void read(uint64_t at, char* out, uint64_t n) {
    if (at + n > size_ || at + n < at) throw std::runtime_error("truncated zip file");
    in_.seekg(static_cast<std::streamoff>(at));
    in_.read(out, static_cast<std::streamsize>(n));
    if (!in_) throw std::runtime_error("cannot read the zip file");
  }
  std::string read(uint64_t at, uint64_t n) {
    if (at + n > size_ || at + n < at) throw std::runtime_error("truncated zip file");
    std::string b(n, '\0');
    read(at, b.data(), n);
    return b;
  }

 private:
  std::ifstream in_;
  uint64_t size_;
};

// The records of the zip central directory, by name ("<archive name>/<name>"). miniz as LibTorch
// builds it does not check CRCs: load_archive and check_archive do. Throws std::runtime_error for
// a damaged directory.
std::map<std::string, ZipEntry> zip_directory(FileRanges& file) {
  const uint64_t size = file.size();
  const uint64_t tail_size = std::min<uint64_t>(size, 22 + 65535);
  const std::string tail = file.read(size - tail_size, tail_size);
  const size_t eocd = tail.rfind(std::string("PK\x05\x06", 4));
  if (eocd == std::string::npos || eocd + 22 > tail.size())
    throw std::runtime_error("no zip end of central directory");
  uint64_t entries = little(tail, eocd + 10, 2);
  uint64_t cd_size = little(tail, eocd + 12, 4);
  uint64_t cd_offset = little(tail, eocd + 16, 4);
  if (entries == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_offset == 0xFFFFFFFFu) {  // zip64
    const std::string l = file.read(size - tail_size + eocd - 20, 20);
    if (little(l, 0, 4) != 0x07064b50u) throw std::runtime_error("no zip64 locator");
    const std::string z = file.read(little(l, 8, 8), 56);
    if (little(z, 0, 4) != 0x06064b50u) throw std::runtime_error("no zip64 end of directory");
    entries = little(z, 32, 8);
    cd_size = little(z, 40, 8);
    cd_offset = little(z, 48, 8);
  }
  const std::string cd = file.read(cd_offset, cd_size);
  std::map<std::string, ZipEntry> out;
  size_t at = 0;
  for (uint64_t e = 0; e < entries; ++e) {
    if (little(cd, at, 4) != 0x02014b50u) throw std::runtime_error("damaged zip directory");
    const size_t name = little(cd, at + 28, 2), extra = little(cd, at + 30, 2),
                 comment = little(cd, at + 32, 2);
    if (at + 46 + name + extra > cd.size()) throw std::runtime_error("truncated zip directory");
    ZipEntry entry;
    entry.crc = static_cast<uint32_t>(little(cd, at + 16, 4));
    entry.size = little(cd, at + 24, 4);
    entry.local_header = little(cd, at + 42, 4);
    // Zip64: the fields that overflowed, in this order, in extra field 0x0001.
    for (size_t x = at + 46 + name; x + 4 <= at + 46 + name + extra;) {
      const uint64_t id = little(cd, x, 2), n = little(cd, x + 2, 2);
      if (id == 0x0001) {
        size_t y = x + 4;
        if (entry.size == 0xFFFFFFFFu) entry.size = little(cd, y, 8), y += 8;
        if (little(cd, at + 20, 4) == 0xFFFFFFFFu) y += 8;  // compressed size
        if (entry.local_header == 0xFFFFFFFFu) entry.local_header = little(cd, y, 8);
      }
      x += 4 + n;
    }
    out[cd.substr(at + 46, name)] = entry;
    at += 46 + name + extra + comment;
  }
  return out;
}

// The directory's archive-name prefix ("archive/").
std::string record_prefix(const std::map<std::string, ZipEntry>& directory) {
  if (directory.empty()) return "";
  const std::string& first = directory.begin()->first;
  return first.substr(0, first.find('/') + 1);
}

}  // namespace

c10::IValue load_archive(const fs::path& path) {
  require_regular_file(path);
  try {
    caffe2::serialize::PyTorchStreamReader reader(path.string());
    FileRanges file(path);
    const std::map<std::string, ZipEntry> directory = zip_directory(file);
    const std::string prefix = record_prefix(directory);
    auto read = [&](const std::string& name) {
      if (!reader.hasRecord(name)) throw std::runtime_error("has no record " + name);
      auto [data, size] = reader.getRecord(name);  // CPU allocator memory
      auto entry = directory.find(prefix + name);
      if (entry == directory.end())
        throw std::runtime_error("the zip directory does not list " + name);
      if (crc32_update(0, static_cast<const char*>(data.get()), size) != entry->second.crc)
        throw std::runtime_error("record " + name + " fails its CRC-32 check: damaged");
      return c10::Storage(c10::Storage::use_byte_size_t(), size, std::move(data),
                          /*allocator=*/nullptr, /*resizable=*/false);
    };
    const c10::Storage pickle = read("data.pkl");
    return internal::read_pickle(
        std::string(static_cast<const char*>(pickle.data()), pickle.nbytes()),
        [&](const std::string& key) { return read("data/" + key); });
  } catch (const std::exception& e) {
    throw unreadable(path, e);
  }
}

c10::IValue check_archive(const fs::path& path) {
  require_regular_file(path);
  try {
    FileRanges file(path);
    const std::map<std::string, ZipEntry> directory = zip_directory(file);
    const std::string prefix = record_prefix(directory);
    std::vector<char> chunk(4 << 20);
    std::string pickle;
    for (const auto& [name, entry] : directory) {
      const std::string local = file.read(entry.local_header, 30);
      if (little(local, 0, 4) != 0x04034b50u)
        throw std::runtime_error("record " + name + ": damaged local header");
      if (little(local, 8, 2) != 0) throw std::runtime_error("record " + name + " is compressed");
      const uint64_t data = entry.local_header + 30 + little(local, 26, 2) + little(local, 28, 2);
      uint32_t crc = 0;
      for (uint64_t done = 0; done < entry.size;) {
        const uint64_t n = std::min<uint64_t>(chunk.size(), entry.size - done);
        file.read(data + done, chunk.data(), n);
        crc = crc32_update(crc, chunk.data(), n);
        done += n;
      }
      if (crc != entry.crc)
        throw std::runtime_error("record " + name.substr(prefix.size()) +
                                 " fails its CRC-32 check: damaged");
      if (name == prefix + "data.pkl") pickle = file.read(data, entry.size);
    }
    if (pickle.empty() && directory.count(prefix + "data.pkl") == 0)
      throw std::runtime_error("has no record data.pkl");
    // Storages of the right size that hold no memory: shapes, strides and dtypes only.
    return internal::read_pickle(
        pickle,
        [&](const std::string& key) {
          auto entry = directory.find(prefix + "data/" + key);
          if (entry == directory.end()) throw std::runtime_error("has no record data/" + key);
          return c10::Storage(c10::Storage::use_byte_size_t(), entry->second.size,
                              at::DataPtr(nullptr, at::kCPU), /*allocator=*/nullptr,
                              /*resizable=*/false);
        },
        /*metadata_only=*/true);
  } catch (const std::exception& e) {
    throw unreadable(path, e);
  }
}

}  // namespace fabric
