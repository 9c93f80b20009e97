// fabric::run_main: the main() of a Fabric program, with the exit statuses users can rely on.
//
//   int main(int argc, char** argv) {
//     return fabric::run_main(argc, argv, fabric::training_schema(), [](const fabric::Config& c) {
//       ...; return 0;
//     });
//   }
//
// It parses the command line (fabric/config/config.h: --config=FILE, --print_config, --help,
// key=value overrides), loads and validates the config, then calls `body`. Errors print one line to
// stderr, never a stack trace or a core dump:
//   exit 0  body returned 0, or --help / --print_config
//   exit 2  configuration or usage error (fabric::ConfigError), e.g.
//           configs/x.yaml:7:14: fabric.precision: '16-mixd' is not a precision; did you mean
//           '16-mixed'?
//   exit 1  any other error (fabric::Error, LibTorch errors, std::exception), printed as "error:
//           ..." and, for an error from inside Fabric::launch, where in the loop it happened
//           (set_error_site below; FABRIC_DEBUG=1 adds a LibTorch error's C++ stack)
//   other   whatever body returns.
#ifndef FABRIC_MAIN_H_
#define FABRIC_MAIN_H_

#include <functional>
#include <string>

#include "fabric/config/config.h"

namespace fabric {

using MainBody = std::function<int(const Config& config)>;

int run_main(int argc, char** argv, const ConfigSchema& schema, const MainBody& body);

// Where in a training loop the error now leaving Fabric::launch happened, e.g. "in backward,
// after 12 optimizer steps of this process": Fabric::launch records it and run_main appends it to
// the line it prints ("error: ... (in backward, after 12 optimizer steps of this process)"). With
// FABRIC_DEBUG=1 in the environment run_main also prints a LibTorch error's C++ stack (the one
// LibTorch recorded where it threw). "" forgets the site.
void set_error_site(const std::string& site);

// A LibTorch error's first line in the project's terms where LibTorch's own words do not say
// what to change: an allocation no machine holds ("out of memory: a tensor of 3725.3 GiB did not
// fit ...; lower the sizes ..."), an embedding index out of range, sampling from inf/nan
// probabilities. Other messages come back unchanged. run_main prints LibTorch errors through it.
std::string explain_torch_error(const std::string& message);

}  // namespace fabric

#endif  // FABRIC_MAIN_H_
