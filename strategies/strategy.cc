#include "strategies/strategy.h"

#include "fabric/checkpoint/archive.h"
#include "strategies/collectives.h"

namespace fabric {

void Strategy::save_checkpoint(const std::filesystem::path& file,
                               const std::function<c10::IValue()>& contents) {
  // Every rank holds the same state: one writer.
  on_global_zero(*this, [&] { save_archive(file, contents()); });
}

c10::IValue Strategy::load_checkpoint(const std::filesystem::path& file) {
  return load_archive(file);
}

}  // namespace fabric
