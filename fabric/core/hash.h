// fabric::fnv1a64: a small, stable, non-cryptographic hash (64-bit FNV-1a) of bytes, for names
// and fingerprints that must not change between builds or machines (config hashes, sweep run ids).
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

}  // namespace fabric

#endif  // FABRIC_CORE_HASH_H_
