// The search space of `search: random` sweeps (tools/sweep/spec.h): a distribution per
// config key, and the points drawn from it.
#ifndef TOOLS_SWEEP_SPACE_H_
#define TOOLS_SWEEP_SPACE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fabric::sweep {

// The distribution names a sweep file may use.
extern const std::vector<std::string> kDistributions;  // uniform, loguniform, int, choice

struct Distribution {
  std::string kind;                 // one of kDistributions
  double low = 0, high = 0;         // uniform, loguniform, int (inclusive)
  std::vector<std::string> values;  // choice: value texts
};

// The text of `v`, a value of the uniform or loguniform `d`: four significant digits, more when the
// range is narrow (so that it holds about 1000 distinct texts or more), and never outside [low,
// high] (a value that rounds outside is the bound).
std::string number_in(const Distribution& d, double v);

// Up to `trials` distinct points of `space` (key, distribution), each the value texts in the
// order of `space`: uniform and loguniform values as number_in writes them (the text is what
// the run gets), integers, or one of the choices. A value is a function of (random_seed, key,
// draw number) alone, computed with a portable generator, so the same points come out on every
// machine and standard library, and raising `trials` keeps the points already drawn. A repeated
// point is drawn again; fewer than `trials` points come back when the space holds fewer.
std::vector<std::vector<std::string>> draw_points(
    const std::vector<std::pair<std::string, Distribution>>& space, int64_t trials,
    uint64_t random_seed);

}  // namespace fabric::sweep

#endif  // TOOLS_SWEEP_SPACE_H_
