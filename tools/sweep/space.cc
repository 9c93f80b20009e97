#include "tools/sweep/space.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "fabric/core/hash.h"

namespace fabric::sweep {

const std::vector<std::string> kDistributions = {"uniform", "loguniform", "int", "choice"};

namespace {

std::string g_text(double v, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
  return buf;
}

// The significant digits that give the range of `d` about 1000 distinct values or more: 4 for
// most ranges, more for narrow ones ([0.999, 0.99999]: 7).
int digits_for(const Distribution& d) {
  double steps = 0;
  if (d.kind == "loguniform") {
    // With N digits a value's relative step is at most 10^(1-N).
    steps = std::log(d.high / d.low) * 1e3;
  } else {
    // The step of 4 digits at the largest magnitude in the range (just below a power of ten).
    const double m = std::max(std::fabs(d.low), std::fabs(d.high)) * (1 - 1e-12);
    const double step = m > 0 ? std::pow(10.0, std::floor(std::log10(m)) - 3) : 1e-3;
    steps = (d.high - d.low) / step;
  }
  if (!(steps > 0) || steps >= 1000) return 4;
  return std::min(17, 4 + static_cast<int>(std::ceil(std::log10(1000 / steps))));
}

}  // namespace

std::string number_in(const Distribution& d, double v) {
  const int digits = digits_for(d);
  std::string text = g_text(v, digits);
  // Rounding may step outside [low, high]: then the bound itself, with as many digits as it takes
  // to stay inside.
  for (const double bound : {d.low, d.high}) {
    const double x = std::strtod(text.c_str(), nullptr);
    if ((bound == d.low && x < d.low) || (bound == d.high && x > d.high)) {
      for (int n = digits; n <= 17; ++n) {
        text = g_text(bound, n);
        const double y = std::strtod(text.c_str(), nullptr);
        if (y >= d.low && y <= d.high) break;
      }
    }
  }
  return text;
}

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
  return number_in(d, v);
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
