#include "fabric/core/files.h"

#include <cerrno>
#include <cstring>

#include "fabric/core/error.h"

namespace fs = std::filesystem;

namespace fabric {
namespace {

// Absolute, with `.`/`..` and symbolic links resolved as far as the path exists.
fs::path resolved(const fs::path& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? fs::absolute(path, ec).lexically_normal() : p;
}

// The same existing file (hard links included).
bool same_file(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  const bool same = fs::equivalent(a, b, ec);
  return !ec && same;
}

}  // namespace

std::string file_kind(const fs::path& path) {
  std::error_code ec;
  switch (fs::status(path, ec).type()) {
    case fs::file_type::regular:
      return "a regular file";
    case fs::file_type::directory:
      return "a folder";
    case fs::file_type::fifo:
      return "a FIFO (named pipe)";
    case fs::file_type::character:
      return "a character device";
    case fs::file_type::block:
      return "a block device";
    case fs::file_type::socket:
      return "a socket";
    case fs::file_type::not_found:
      return "missing";
    default:
      return ec ? "unreadable (" + ec.message() + ")" : "not a regular file";
  }
}

void require_regular_file(const fs::path& path) {
  std::error_code ec;
  const fs::file_type type = fs::status(path, ec).type();
  if (type == fs::file_type::regular) return;
  if (type == fs::file_type::not_found)
    throw Error(path.string() + ": cannot open (" + std::strerror(ENOENT) + ")");
  if (type == fs::file_type::directory)
    throw Error(path.string() + ": cannot open (a folder, not a file)");
  throw Error(path.string() + ": cannot open (" + file_kind(path) + ", not a regular file)");
}

bool path_within(const fs::path& inner, const fs::path& outer) {
  const fs::path i = resolved(inner), o = resolved(outer);
  auto a = i.begin(), b = o.begin();
  for (; b != o.end(); ++a, ++b) {
    if (b->empty() && std::next(b) == o.end()) break;  // a trailing separator
    if (a == i.end() || *a != *b) return false;
  }
  return true;
}

void check_output_path(const fs::path& output, const std::string& output_what,
                       const std::vector<InputPath>& inputs) {
  const std::string out = output.string();
  const std::string fix = "; choose another " + output_what;
  std::error_code ec;
  const bool exists = fs::exists(output, ec);
  // A FIFO, device or socket is never written over: the writer's rename would replace the node
  // itself (as root, /dev/null with a regular file).
  if (const fs::file_type type = fs::status(output, ec).type();
      exists && type != fs::file_type::regular && type != fs::file_type::directory)
    throw Error(out + ": is " + file_kind(output) + ", not a file; choose another " + output_what);
  for (const InputPath& input : inputs) {
    if (input.path.empty()) continue;
    const std::string in = input.path.string() + " (" + input.what + ")";
    const bool folder = fs::is_directory(input.path, ec);
    if (!folder && (same_file(output, input.path) || resolved(output) == resolved(input.path)))
      throw Error(out + ": is the input " + in + ", which writing would replace" + fix);
    if (!folder || !path_within(output, input.path)) continue;
    if (input.read_whole)
      throw Error(out + (resolved(output) == resolved(input.path) ? ": is" : ": lies inside") +
                  " the input folder " + in +
                  ", whose every file is read: a later run would read this output as input" + fix +
                  " outside it");
    if (exists && !fs::is_directory(output, ec))
      throw Error(out + ": is an existing file inside the input folder " + in +
                  ", which writing would replace" + fix);
  }
}

}  // namespace fabric
