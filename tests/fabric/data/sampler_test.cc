#include "fabric/data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "fabric/core/error.h"

namespace {

using fabric::DistributedSampler;

TEST(DistributedSamplerTest, SameSeedAndEpochGiveTheSameOrderOnEveryCall) {
  DistributedSampler a(100, 1, 0, true, 7), b(100, 1, 0, true, 7);
  a.set_epoch(3);
  b.set_epoch(3);
  EXPECT_EQ(a.indices(), b.indices());
  b.set_epoch(4);
  EXPECT_NE(a.indices(), b.indices());
  DistributedSampler c(100, 1, 0, true, 8);
  c.set_epoch(3);
  EXPECT_NE(a.indices(), c.indices());
}

TEST(DistributedSamplerTest, ShuffledEpochIsAPermutation) {
  DistributedSampler s(257, 1, 0, true, 1);
  auto idx = s.indices();
  std::sort(idx.begin(), idx.end());
  for (int64_t i = 0; i < 257; ++i) EXPECT_EQ(idx[static_cast<size_t>(i)], i);
}

TEST(DistributedSamplerTest, RanksPartitionTheEpochAndPadByWrapping) {
  for (int64_t size : {12, 13, 15}) {
    const int64_t replicas = 4;
    std::map<int64_t, int> seen;
    std::set<size_t> per_rank_sizes;
    for (int64_t r = 0; r < replicas; ++r) {
      DistributedSampler s(size, replicas, r, true, 5);
      s.set_epoch(2);
      auto idx = s.indices();
      per_rank_sizes.insert(idx.size());
      EXPECT_EQ(static_cast<int64_t>(idx.size()), s.num_samples());
      for (auto i : idx) ++seen[i];
    }
    EXPECT_EQ(per_rank_sizes.size(), 1u)
        << "every rank gets as many examples (size " << size << ")";
    EXPECT_EQ(static_cast<int64_t>(seen.size()), size) << "every example is covered";
    const int64_t padded = (size + replicas - 1) / replicas * replicas - size;
    int duplicates = 0;
    for (auto& [i, n] : seen) duplicates += n - 1;
    EXPECT_EQ(duplicates, padded);
  }
}

TEST(DistributedSamplerTest, DropLastTruncatesToAMultipleOfTheRanks) {
  std::set<int64_t> all;
  for (int64_t r = 0; r < 4; ++r) {
    DistributedSampler s(15, 4, r, true, 5, /*drop_last=*/true);
    EXPECT_EQ(s.num_samples(), 3);
    for (auto i : s.indices()) EXPECT_TRUE(all.insert(i).second) << "no duplicates";
  }
  EXPECT_EQ(all.size(), 12u);
}

TEST(DistributedSamplerTest, UnshuffledRanksTakeStridedPositions) {
  DistributedSampler s(10, 3, 1, false);
  EXPECT_EQ(s.indices(), (std::vector<int64_t>{1, 4, 7, 0}));  // 0 pads (wraps around)
}

TEST(DistributedSamplerTest, RealSamplesExcludeThePaddingAndCoverTheDatasetOnce) {
  for (int64_t size : {0, 1, 2, 10, 11, 12}) {
    std::multiset<int64_t> real;
    for (int64_t r = 0; r < 3; ++r) {
      DistributedSampler s(size, 3, r, true, 9);
      const auto idx = s.indices();
      real.insert(idx.begin(), idx.begin() + s.num_real_samples());
    }
    std::multiset<int64_t> expected;
    for (int64_t i = 0; i < size; ++i) expected.insert(i);
    EXPECT_EQ(real, expected) << size << " examples";
  }
}

TEST(DistributedSamplerTest, RejectsImpossibleRanks) {
  EXPECT_THROW(DistributedSampler(10, 2, 2), fabric::Error);
  EXPECT_THROW(DistributedSampler(10, 0, 0), fabric::Error);
}

}  // namespace
