// NumPy arrays (.npy, .npz) as tensors, memory-mapped where the file allows it, and a Dataset of
// two of them (data.format: npy).
//
// load_npy(): the header (format versions 1, 2 and 3) gives dtype, order and shape; the data is
// mapped copy-on-write (writes to the tensor never reach the file), so opening a 50 GB array costs
// nothing until its rows are read. Supported dtypes: bool, int8/16/32/64, uint8, uint16 and uint32
// (widened to int32 / int64 on load, as LibTorch computes little with them), float16/32/64,
// complex64/128; either byte order (big-endian data is swapped into memory); C or Fortran order (a
// Fortran array is a strided view of the mapping). Refused with one line naming the file: object
// arrays (pickled Python objects: `np.save(f, a.astype(np.float32))` makes a numeric one),
// structured and string dtypes, uint64, a header that is not NumPy's, data shorter than the shape.
//
// load_npz(): every member of an .npz (np.savez / np.savez_compressed) by name without ".npy";
// stored members are mapped like .npy files (copied when their data is not aligned for the dtype),
// deflated ones are decompressed into memory.
//
// Example:
//   auto images = fabric::load_npy("train/inputs.npy");   // e.g. uint8 [60000, 1, 28, 28]
//   auto arrays = fabric::load_npz("mnist.npz");           // {"x_train": ..., "y_train": ...}
#ifndef FABRIC_DATA_NPY_H_
#define FABRIC_DATA_NPY_H_

#include <torch/types.h>

#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "fabric/data/dataset.h"

namespace fabric {

// Throws fabric::Error "PATH: ..." for an unreadable or malformed file.
torch::Tensor load_npy(const std::string& path);
std::map<std::string, torch::Tensor> load_npz(const std::string& path);

// The array in `bytes` (a whole .npy file); `name` stands for it in errors. The tensor views
// `bytes` when it can (keeping `owner` alive), else owns a copy. For fuzzing and .npz members.
torch::Tensor parse_npy(const char* bytes, size_t size, const std::string& name,
                        std::shared_ptr<const void> owner);
// The members of the .npz archive in `bytes`, as load_npz() gives them.
std::map<std::string, torch::Tensor> parse_npz(const char* bytes, size_t size,
                                               const std::string& name,
                                               std::shared_ptr<const void> owner);

// Examples are rows of `inputs` ([N, ...], any dtype) with `targets` ([N] or [N, ...]); integer
// and bool targets are delivered as int64 (class labels). Batches are gathered from the (mapped)
// tensors: rows are read from disk as they are first used.
class NpyDataset : public Dataset {
 public:
  // Throws fabric::Error naming both sources when the row counts differ or an array is 0-d.
  NpyDataset(torch::Tensor inputs, torch::Tensor targets, std::string inputs_name,
             std::string targets_name);
  // From two .npy files.
  static std::shared_ptr<NpyDataset> open(const std::string& inputs_path,
                                          const std::string& targets_path);
  int64_t size() const override { return inputs_.size(0); }
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  const torch::Tensor& inputs() const { return inputs_; }
  const torch::Tensor& targets() const { return targets_; }
  // The sources as given ("DIR/train/targets.npy", "DIR/train.npz:targets"), for messages.
  const std::string& inputs_name() const { return inputs_name_; }
  const std::string& targets_name() const { return targets_name_; }

 private:
  torch::Tensor inputs_, targets_;
  std::string inputs_name_, targets_name_;
};

}  // namespace fabric

#endif  // FABRIC_DATA_NPY_H_
