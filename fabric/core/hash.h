// Small, stable, non-cryptographic hashes whose values must not change between builds, machines
// or standard libraries:
//   fnv1a64     of bytes (64-bit FNV-1a): config hashes, sweep run ids
//   mix64       SplitMix64's finalizer: neighbouring inputs give unrelated outputs
//   splitmix64  SplitMix64's output for state `x` (mix64(x + golden ratio)): seeds and
//               counter-based random draws (the loader's batch generators, the samplers, sweeps)
#ifndef FABRIC_CORE_HASH_H_
#define FABRIC_CORE_HASH_H_

#include <cstdint>
#include <string_view>

namespace fabric {

// Continues from `h` when hashing in pieces: fnv1a64(b, fnv1a64(a)) == fnv1a64(a + b).
inline uint64_t fnv1a64(std::string_view bytes, uint64_t h = 1469598103934665603ULL) {
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ULL;
  return h;
}

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

inline uint64_t splitmix64(uint64_t x) { return mix64(x + 0x9E3779B97F4A7C15ULL); }

}  // namespace fabric

#endif  // FABRIC_CORE_HASH_H_
