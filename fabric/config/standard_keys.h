// The standard key catalogue: the schemas of the keys Fabric itself reads. The mechanism
// (KeySpec, ConfigSchema) is fabric/config/schema.h; configs/README.md lists these keys with their
// defaults.
#ifndef FABRIC_CONFIG_STANDARD_KEYS_H_
#define FABRIC_CONFIG_STANDARD_KEYS_H_

#include "fabric/config/schema.h"

namespace fabric {

// The `fabric:` section (accelerator, devices, strategy, precision, sync_batchnorm, ddp options,
// ...) and `logging:`.
ConfigSchema default_schema();

// default_schema() plus the sections a training program usually has and the examples use:
// `trainer:`, `data:`, `optimizer:`, `scheduler:`, `checkpoint:`.
ConfigSchema training_schema();

// The `profiler:` section (training_schema() has it; a program that only generates adds it).
void add_profiler_keys(ConfigSchema& s);

}  // namespace fabric

#endif  // FABRIC_CONFIG_STANDARD_KEYS_H_
