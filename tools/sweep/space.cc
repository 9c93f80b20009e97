#include "tools/sweep/space.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "fabric/core/hash.h"

namespace fabric::sweep {

const std::vector<std::string> kDistributions = {"uniform", "loguniform", "int", "choice"};

namespace {

std::string draw_value(const Distribution& d, const std::string& key, uint64_t random_seed,
                       uint64_t draw) {
  const uint64_t bits = splitmix64(splitmix64(random_seed ^ fnv1a64(key)) ^ splitmix64(draw));
  const double u = static_cast<double>(bits >> 11) * 0x1.0p-53;  // [0, 1)
  char buf[32];
  if (d.kind == "choice") {
    const size_t i = std::min(d.values.size() - 1, static_cast<size_t>(u * d.values.size()));
    return d.values[i];
  }
  if (d.kind == "int") {
    const double v = std::min(d.high, d.low + std::floor(u * (d.high - d.low + 1)));
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(v));
    return buf;
  }
  const double v = d.kind == "loguniform"
                       ? std::exp(std::log(d.low) + u * (std::log(d.high) - std::log(d.low)))
                       : d.low + u * (d.high - d.low);
  std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

}  // namespace

std::vector<std::vector<std::string>> draw_points(
    const std::vector<std::pair<std::string, Distribution>>& space, int64_t trials,
    uint64_t random_seed) {
  std::vector<std::vector<std::string>> points;
  std::set<std::vector<std::string>> seen;
  const uint64_t max_draws = 100 * static_cast<uint64_t>(trials) + 1000;
  for (uint64_t draw = 0; points.size() < static_cast<size_t>(trials) && draw < max_draws; ++draw) {
    std::vector<std::string> texts;
    for (const auto& [key, d] : space) texts.push_back(draw_value(d, key, random_seed, draw));
    if (seen.insert(texts).second) points.push_back(std::move(texts));
  }
  return points;
}

}  // namespace fabric::sweep
