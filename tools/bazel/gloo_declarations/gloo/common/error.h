// Fabric++: see tools/bazel/gloo_declarations/README.md.
#pragma once
