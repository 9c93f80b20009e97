#include "fabric/logging/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "fabric/core/error.h"

namespace fabric {
namespace {

// Protocol buffer wire format: (field << 3) | wire type, then the payload.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, uint32_t field, WireType type) { varint(out, (field << 3) | type); }
void little_endian(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void fixed64_double(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  key(out, field, kFixed64);
  little_endian(out, bits, 8);
}
void fixed32_float(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  key(out, field, kFixed32);
  little_endian(out, bits, 4);
}
void bytes_field(std::string& out, uint32_t field, std::string_view bytes) {
  key(out, field, kBytes);
  varint(out, bytes.size());
  out.append(bytes);
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event fields (event.proto): wall_time = 1 (double), step = 2 (int64), file_version = 3
// (string), summary = 5 (Summary). Summary: value = 1 (repeated Value). Value: tag = 1 (string),
// simple_value = 2 (float).
std::string event(double wall_time, int64_t step, const std::string& file_version,
                  const std::map<std::string, double>& scalars) {
  std::string e;
  fixed64_double(e, 1, wall_time);
  if (step != 0) {
    key(e, 2, kVarint);
    varint(e, static_cast<uint64_t>(step));
  }
  if (!file_version.empty()) bytes_field(e, 3, file_version);
  if (!scalars.empty()) {
    std::string summary;
    for (const auto& [tag, v] : scalars) {
      std::string value;
      bytes_field(value, 1, tag);
      fixed32_float(value, 2, static_cast<float>(v));
      bytes_field(summary, 1, value);
    }
    bytes_field(e, 5, summary);
  }
  return e;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

}  // namespace

uint32_t crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char ch : data) crc = table[(crc ^ ch) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

TensorBoardScalars::TensorBoardScalars(const std::filesystem::path& dir) {
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  const double now = unix_seconds();
  path_ = dir / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + host +
                 "." + std::to_string(::getpid()) + ".0");
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) throw Error("cannot write " + path_.string() + ": " + std::strerror(errno));
  write_record(event(now, 0, "brain.Event:2", {}));
}

TensorBoardScalars::~TensorBoardScalars() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardScalars::log(const std::map<std::string, double>& values, int64_t step) {
  if (values.empty()) return;
  write_record(event(unix_seconds(), step, "", values));
}

void TensorBoardScalars::write_record(std::string_view data) {
  std::string header;
  little_endian(header, data.size(), 8);
  std::string record = header;
  little_endian(record, masked(crc32c(header)), 4);
  record.append(data);
  little_endian(record, masked(crc32c(data)), 4);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0)
    throw Error("cannot write " + path_.string() + ": " + std::strerror(errno));
}

}  // namespace fabric
