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

namespace stream {

using fabric::StreamSampler;

// Uneven shards: 7 of sizes 5..35 (T = 140).
std::vector<int64_t> shard_sizes() { return {5, 30, 12, 35, 20, 8, 30}; }

// Which shard index `i` falls in.
int64_t shard_of(int64_t i) {
  int64_t s = 0;
  for (int64_t size : shard_sizes()) {
    if (i < size) return s;
    i -= size;
    ++s;
  }
  return -1;
}

int64_t start_of(int64_t shard) {
  int64_t start = 0;
  for (int64_t s = 0; s < shard; ++s) start += shard_sizes()[static_cast<size_t>(s)];
  return start;
}

TEST(StreamSamplerTest, RanksTakeEqualContiguousPartsOfTheEpochsShardOrder) {
  for (int64_t replicas : {1, 2, 3, 4}) {
    for (bool drop_last : {false, true}) {
      std::map<int64_t, int> seen;
      std::vector<int64_t> whole;  // the ranks' streams, rank after rank
      for (int64_t r = 0; r < replicas; ++r) {
        StreamSampler s(shard_sizes(), replicas, r, true, 9, drop_last, 16);
        s.set_epoch(3);
        const auto idx = s.indices();
        const auto stream = s.stream();
        ASSERT_EQ(static_cast<int64_t>(idx.size()), s.num_samples());
        EXPECT_EQ(s.num_samples(), drop_last ? 140 / replicas : (140 + replicas - 1) / replicas);
        ASSERT_EQ(static_cast<int64_t>(stream.size()), s.num_real_samples());
        // The emitted real examples are the stream's, shuffled.
        std::vector<int64_t> real(idx.begin(), idx.begin() + s.num_real_samples());
        EXPECT_NE(real, stream) << "shuffled through the buffer";
        std::sort(real.begin(), real.end());
        std::vector<int64_t> sorted = stream;
        std::sort(sorted.begin(), sorted.end());
        EXPECT_EQ(real, sorted);
        for (auto i : idx) ++seen[i];
        whole.insert(whole.end(), stream.begin(), stream.end());
      }
      // Concatenated, the ranks' streams read each shard front to back, one shard after another.
      std::set<int64_t> finished;
      for (size_t k = 0; k < whole.size(); ++k) {
        if (k > 0 && shard_of(whole[k]) == shard_of(whole[k - 1])) {
          EXPECT_EQ(whole[k], whole[k - 1] + 1) << "within a shard, in order";
        } else {
          EXPECT_TRUE(finished.insert(shard_of(whole[k])).second) << "a shard is read once";
          EXPECT_EQ(whole[k], start_of(shard_of(whole[k]))) << "from its first example";
        }
      }
      if (drop_last) {
        EXPECT_EQ(static_cast<int64_t>(seen.size()), 140 / replicas * replicas);
        for (auto& [i, n] : seen) EXPECT_EQ(n, 1);
      } else {
        EXPECT_EQ(static_cast<int64_t>(seen.size()), 140) << "every example, " << replicas;
        int duplicates = 0;
        for (auto& [i, n] : seen) duplicates += n - 1;
        EXPECT_EQ(duplicates, (140 + replicas - 1) / replicas * replicas - 140);
      }
    }
  }
}

TEST(StreamSamplerTest, AnExampleLeavesTheBufferAtMostBufferMinusOnePlacesBeforeItIsRead) {
  for (int64_t buffer : {2, 7, 50, 1000}) {
    StreamSampler s(shard_sizes(), 2, 1, true, 4, false, buffer);
    s.set_epoch(1);
    const auto idx = s.indices();
    const auto stream = s.stream();
    std::map<int64_t, int64_t> read_at;
    for (size_t k = 0; k < stream.size(); ++k) read_at[stream[k]] = static_cast<int64_t>(k);
    int64_t latest = 0;  // how far the stream must have been read
    for (int64_t e = 0; e < s.num_real_samples(); ++e) {
      latest = std::max(latest, read_at.at(idx[static_cast<size_t>(e)]) + 1);
      EXPECT_LE(read_at.at(idx[static_cast<size_t>(e)]), e + buffer - 1) << buffer;
      EXPECT_LE(latest, s.stream_read(e + 1)) << "stream_read covers what left, buffer " << buffer;
    }
    EXPECT_EQ(s.stream_read(0), 0);
    EXPECT_EQ(s.stream_read(s.num_samples()), s.num_real_samples());
  }
}

// What the DataLoader reads ahead in: a stream sampler's reading order, fixed at the epoch it was
// asked in; a distributed sampler reads as it hands out (no order of its own).
TEST(StreamSamplerTest, ReadOrderIsTheStreamOfThatEpoch) {
  StreamSampler s(shard_sizes(), 2, 1, true, 4, false, 7);
  s.set_epoch(1);
  const auto order = s.read_order();
  ASSERT_TRUE(order.has_value());
  EXPECT_EQ(order->examples, s.stream());
  std::vector<int64_t> read;
  for (int64_t e = 0; e <= s.num_samples(); ++e) read.push_back(s.stream_read(e));
  s.set_epoch(2);  // the order keeps epoch 1
  EXPECT_NE(s.stream(), order->examples);
  for (int64_t e = 0; e <= static_cast<int64_t>(read.size()) - 1; ++e)
    EXPECT_EQ(order->read_when(e), read[static_cast<size_t>(e)]) << e;
  EXPECT_FALSE(DistributedSampler(100, 2, 1, true, 4).read_order().has_value());
}

TEST(StreamSamplerTest, OrderIsAFunctionOfSeedEpochAndRankOnly) {
  StreamSampler a(shard_sizes(), 2, 0, true, 7, false, 20),
      b(shard_sizes(), 2, 0, true, 7, false, 20);
  a.set_epoch(5);
  b.set_epoch(5);
  EXPECT_EQ(a.indices(), b.indices());
  b.set_epoch(6);
  EXPECT_NE(a.indices(), b.indices());
  std::set<std::vector<int64_t>> streams;  // the whole epoch's shard order, ten epochs
  StreamSampler whole(shard_sizes(), 1, 0, true, 7, false, 20);
  for (int64_t epoch = 0; epoch < 10; ++epoch) {
    whole.set_epoch(epoch);
    streams.insert(whole.stream());
  }
  EXPECT_EQ(streams.size(), 10u) << "another epoch, another shard order (of 7! = 5040)";
  StreamSampler c(shard_sizes(), 2, 0, true, 8, false, 20);
  c.set_epoch(5);
  EXPECT_NE(a.indices(), c.indices());
}

TEST(StreamSamplerTest, WithoutShuffleOrABufferOfOneTheOrderIsTheStream) {
  StreamSampler plain(shard_sizes(), 3, 2, false, 1, false, 100);
  EXPECT_EQ(plain.indices(),
            (std::vector<int64_t>{94,  95,  96,  97,  98,  99,  100, 101, 102, 103, 104, 105,
                                  106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117,
                                  118, 119, 120, 121, 122, 123, 124, 125, 126, 127, 128, 129,
                                  130, 131, 132, 133, 134, 135, 136, 137, 138, 139, 0}))
      << "rank 2 of 3: positions 94..140, the last wrapping to example 0 (padding)";
  EXPECT_EQ(plain.num_real_samples(), 46);
  StreamSampler one(shard_sizes(), 1, 0, true, 1, false, 1);
  EXPECT_EQ(one.indices(), one.stream());
}

TEST(StreamSamplerTest, BadArgumentsAreErrors) {
  EXPECT_THROW(StreamSampler({3, 4}, 2, 2, true, 0, false, 4), fabric::Error);
  EXPECT_THROW(StreamSampler({3, -1}, 1, 0, true, 0, false, 4), fabric::Error);
  EXPECT_THROW(StreamSampler({3, 4}, 1, 0, true, 0, false, 0), fabric::Error);
  StreamSampler empty({}, 2, 1, true, 0, false, 4);
  EXPECT_TRUE(empty.indices().empty());
}

}  // namespace stream
