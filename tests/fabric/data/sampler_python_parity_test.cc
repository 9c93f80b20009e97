// fabric::DistributedSampler against torch.utils.data.DistributedSampler from the Python torch the
// setup installs (tools/setup.sh): same indices, same order, same padding, for every rank, across
// shuffle/seed/epoch/drop_last and sizes that do and do not divide by the number of ranks. A run
// ported from Python therefore sees the same samples on the same ranks.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fabric/data/sampler.h"
#include "tests/run_command.h"

namespace {

struct Case {
  int64_t size, replicas, rank;
  bool shuffle;
  uint64_t seed;
  int64_t epoch;
  bool drop_last;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int64_t size : {1, 7, 10, 12, 100})
    for (int64_t replicas : {1, 3, 4})
      for (int64_t rank = 0; rank < replicas; ++rank)
        for (bool drop_last : {false, true}) {
          if (drop_last && size < replicas) continue;
          out.push_back({size, replicas, rank, true, 42, 0, drop_last});
          out.push_back({size, replicas, rank, true, 7, 3, drop_last});
          out.push_back({size, replicas, rank, false, 0, 1, drop_last});
        }
  return out;
}

// One line per case from Python: the indices, space separated.
std::string python_program(const std::vector<Case>& cs) {
  std::ostringstream py;
  py << "import torch.utils.data as d\n"
        "for n, r, k, sh, seed, ep, dl in [";
  for (const auto& c : cs)
    py << "(" << c.size << "," << c.replicas << "," << c.rank << ","
       << (c.shuffle ? "True" : "False") << "," << c.seed << "," << c.epoch << ","
       << (c.drop_last ? "True" : "False") << "),";
  py << "]:\n"
        "    s = d.DistributedSampler(range(n), num_replicas=r, rank=k, shuffle=sh, seed=seed,"
        " drop_last=dl)\n"
        "    s.set_epoch(ep)\n"
        "    print('idx', *list(iter(s)))\n";
  return py.str();
}

TEST(SamplerPythonParityTest, SameIndicesAsTorchDistributedSampler) {
  const auto cs = cases();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string script = std::string(tmp ? tmp : "/tmp") + "/sampler_parity.py";
  std::ofstream(script) << python_program(cs);
  auto [code, out] =
      fabric::testing::run_command(fabric::testing::python_interpreter() + " " + script);
  ASSERT_EQ(code, 0) << "python with torch (tools/setup.sh installs it) failed:\n" << out;
  std::istringstream lines(out);
  std::string line;
  size_t i = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("idx", 0) != 0) continue;
    ASSERT_LT(i, cs.size());
    std::istringstream fields(line.substr(3));
    std::vector<int64_t> expected;
    for (int64_t v; fields >> v;) expected.push_back(v);
    const Case& c = cs[i++];
    fabric::DistributedSampler s(c.size, c.replicas, c.rank, c.shuffle, c.seed, c.drop_last);
    s.set_epoch(c.epoch);
    EXPECT_EQ(s.indices(), expected)
        << "size " << c.size << " replicas " << c.replicas << " rank " << c.rank << " shuffle "
        << c.shuffle << " seed " << c.seed << " epoch " << c.epoch << " drop_last " << c.drop_last;
  }
  EXPECT_EQ(i, cs.size()) << out;
}

}  // namespace
