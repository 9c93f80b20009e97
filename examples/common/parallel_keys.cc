#include "examples/common/parallel_keys.h"

#include <cstdint>

namespace examples {

void refuse_pipeline_and_context_parallel(const fabric::Config& c, const std::string& program) {
  if (c.get_string("fabric.strategy") != "model_parallel") return;
  for (const char* key : {"fabric.model_parallel.pipeline_parallel_size",
                          "fabric.model_parallel.context_parallel_size"})
    if (const int64_t n = c.get_int(key); n > 1)
      throw c.error_at(key, std::to_string(n) + ": " + program +
                                " runs neither pipeline nor context parallelism (its ranks would "
                                "each run the whole model on whole sequences); set it to 1, or "
                                "train with examples:gpt, which runs both");
}

}  // namespace examples
