// What an example's loop runs of fabric.strategy: model_parallel's mesh, checked before any
// process starts, so that a dimension the loop never uses is a ConfigError at its key (exit 2)
// rather than ranks that each run everything.
#ifndef EXAMPLES_COMMON_PARALLEL_KEYS_H_
#define EXAMPLES_COMMON_PARALLEL_KEYS_H_

#include <string>

#include "fabric/config/config.h"

namespace examples {

// ConfigError at fabric.model_parallel.pipeline_parallel_size / context_parallel_size when either
// is above 1 under fabric.strategy: model_parallel in a program (`program`, e.g.
// "examples:finetune") whose loop neither cuts its model into stages nor splits its sequences:
// every rank would run the whole model on whole sequences (cp's ranks the same data), without a
// word. examples:gpt runs both.
void refuse_pipeline_and_context_parallel(const fabric::Config& c, const std::string& program);

}  // namespace examples

#endif  // EXAMPLES_COMMON_PARALLEL_KEYS_H_
