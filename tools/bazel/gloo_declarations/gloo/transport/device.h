// Fabric++: see tools/bazel/gloo_declarations/README.md.
#pragma once

namespace gloo::transport {
class Device;
class UnboundBuffer;
}  // namespace gloo::transport
