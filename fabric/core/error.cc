#include "fabric/core/error.h"

#include <cstdio>
#include <filesystem>

namespace fabric {

std::string one_line(const std::string& text, std::size_t max_chars) {
  std::string out;
  std::size_t i = 0;
  for (; i < text.size() && out.size() < max_chars; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (i < text.size()) out += "...";
  return out;
}

std::string describe(const std::exception& e) {
  const auto* fs_error = dynamic_cast<const std::filesystem::filesystem_error*>(&e);
  if (fs_error == nullptr) return e.what();
  // what(): "filesystem error: <operation>: <reason> [path1] [path2]".
  std::string operation = fs_error->what();
  const std::string prefix = "filesystem error: ";
  if (operation.rfind(prefix, 0) == 0) operation.erase(0, prefix.size());
  operation = operation.substr(0, operation.find(": "));
  std::string paths = fs_error->path1().string();
  if (!fs_error->path2().empty()) paths += " -> " + fs_error->path2().string();
  return operation + " " + paths + ": " + fs_error->code().message();
}

void check_kernel_launch(int status, const std::string& what, const std::string& kernel) {
  if (status == 0) return;
  throw Error(what + ": the CUDA kernel (" + kernel + ") failed to launch (cudaError " +
              std::to_string(status) + "); was Fabric++ built for this GPU's architecture?");
}

}  // namespace fabric
