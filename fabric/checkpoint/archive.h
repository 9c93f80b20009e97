// Files in torch.save's zip layout holding a tree of plain data: dicts with string (or int) keys,
// lists, tuples, strings, ints, doubles, bools, None and tensors. Python reads them with
// torch.load(path, weights_only=True); reading here never runs code from the file (see
// torch_pickle.h). Checkpoints (Fabric::save) and weight files (save_state_dict) are archives.
#ifndef FABRIC_CHECKPOINT_ARCHIVE_H_
#define FABRIC_CHECKPOINT_ARCHIVE_H_

#include <ATen/core/ivalue.h>

#include <filesystem>
#include <string>

#include "fabric/core/error.h"

namespace fabric {

// What load_archive and check_archive throw for a file that is there but is no readable archive
// (truncated, damaged, foreign): callers that chose the file can say what to give instead.
class UnreadableArchive : public Error {
 public:
  using Error::Error;
};

// The archive's bytes. Tensors (on any device) are stored as CPU tensors.
std::string archive_bytes(const c10::IValue& value);

// Writes archive_bytes(value) to `path` crash-safe (fabric/core/atomic_file.h). Throws
// fabric::Error "cannot write PATH: <reason>"; an existing file at `path` is then untouched.
void save_archive(const std::filesystem::path& path, const c10::IValue& value);

// Reads an archive (ours or Python's torch.save of plain data). Throws fabric::Error
// "PATH: cannot open (...)" for a missing file, UnreadableArchive "PATH: not a readable PyTorch
// file (<first problem>)" for a truncated, corrupted (CRC) or foreign one.
c10::IValue load_archive(const std::filesystem::path& path);

// Checks every byte of an archive as load_archive would read it (each record against its CRC-32,
// read in 4 MiB chunks) without holding it in memory, and returns its value with tensors that
// have shapes, strides and dtypes but no memory: never read their values. Throws as load_archive.
c10::IValue check_archive(const std::filesystem::path& path);

// An empty dict with string keys and values of any type: the node of every tree saved here.
c10::impl::GenericDict new_dict();

}  // namespace fabric

#endif  // FABRIC_CHECKPOINT_ARCHIVE_H_
