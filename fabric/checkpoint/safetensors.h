// Hugging Face's .safetensors files: an 8-byte little-endian header length, a JSON header (each
// tensor's dtype, shape and byte range; optional "__metadata__" of strings), then the raw
// little-endian data, row-major. Python's `safetensors` package reads what save_safetensors writes
// and load_safetensors reads what it writes, bit for bit (tests/fabric/checkpoint/
// safetensors_test.cc checks both ways).
//
// Dtypes: BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F16, BF16, F32, F64, C64, F8_E4M3, F8_E5M2,
// F8_E8M0 (torch's kBool ... kFloat8_e8m0fnu). The sub-byte F4/F6 formats have no torch dtype and
// are refused with an error naming the tensor.
#ifndef FABRIC_CHECKPOINT_SAFETENSORS_H_
#define FABRIC_CHECKPOINT_SAFETENSORS_H_

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fabric {

struct SafetensorsFile {
  // In the file's data order. CPU tensors that view the memory-mapped file (copy-on-write: writing
  // to one changes this process's copy only); the mapping lives as long as any of them.
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// Writes `tensors` (any device, any strides; saved as contiguous CPU data) to `path`, crash-safe
// (fabric/core/atomic_file.h). Data are laid out by element size, largest first, so that each
// tensor starts at a multiple of its element size in the file (the header is padded with spaces to
// 8 bytes, as Python's writer does). Throws fabric::Error "cannot write PATH: ..." naming the
// tensor for a duplicate name or an unsupported dtype.
void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads `path` memory-mapped (no copy of the data unless a tensor's bytes are misaligned for its
// dtype). Throws fabric::Error "PATH: ..." for a file that is not a valid safetensors file, with
// what is wrong: a truncated header, a header that is not JSON, an unknown dtype, a byte range
// that does not match the shape, or ranges that overlap, leave a gap or miss the end of the file.
SafetensorsFile load_safetensors(const std::filesystem::path& path);

// True when `bytes` (a file's first 9 bytes or more) start like a safetensors file: a header
// length, then '{'. A torch.save zip starts with "PK\3\4".
bool looks_like_safetensors(std::string_view first_bytes);
// The same for the file at `path` (false for a folder or a file that cannot be read).
bool is_safetensors_file(const std::filesystem::path& path);

}  // namespace fabric

#endif  // FABRIC_CHECKPOINT_SAFETENSORS_H_
