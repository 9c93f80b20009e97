// The two checks every file a program touches goes through.
//
// Readers: require_regular_file() before opening or sniffing a format. A FIFO, a device or a
// socket given as a weights file would block open() forever (a FIFO waits for a writer) or read
// an endless stream; a folder is not a file. The error says what the path is.
//
// Writers: check_output_path() before any work. An output never replaces one of the run's
// inputs (the same file, also through a symbolic or hard link), never lies inside an input
// folder that is read whole (tools/prepare_text's --input folder: the next run would read its
// own output), and never replaces an existing file inside an input folder that is read in part
// (data.root: new files there are fine, its train.bin is not). The checkpoint side (a .ckpt
// name, a sharded checkpoint's files, a checkpoint folder's `latest`) is
// fabric/checkpoint/output_check.h, which calls this.
#ifndef FABRIC_CORE_FILES_H_
#define FABRIC_CORE_FILES_H_

#include <filesystem>
#include <string>
#include <vector>

namespace fabric {

// Throws fabric::Error "PATH: cannot open (...)" unless `path` is a regular file (links followed):
// "No such file or directory", "a folder, not a file", "a FIFO (named pipe), not a regular file",
// ...
void require_regular_file(const std::filesystem::path& path);

// What `path` is, in words, for messages: "a regular file", "a folder", "a FIFO (named pipe)",
// "a character device", "a block device", "a socket", "missing".
std::string file_kind(const std::filesystem::path& path);

// An input of a run as check_output_path sees it.
struct InputPath {
  std::filesystem::path path;
  std::string what;        // for the message, e.g. "--input", "model.init_weights"
  bool read_whole = true;  // a folder whose every file is read (else: only files it names)
};

// Throws fabric::Error "OUTPUT: <what it would overwrite>; <fix>" when writing `output` would
// overwrite or mix with an input (see above), or when `output` is a FIFO, a device or a socket
// (a writer renaming its file over /dev/null would replace the device node). `output_what` names
// the flag or key that gave it.
void check_output_path(const std::filesystem::path& output, const std::string& output_what,
                       const std::vector<InputPath>& inputs);

// True when `inner` is `outer` or lies inside it (both made absolute and links resolved as far
// as they exist).
bool path_within(const std::filesystem::path& inner, const std::filesystem::path& outer);

}  // namespace fabric

#endif  // FABRIC_CORE_FILES_H_
