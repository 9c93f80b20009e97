#include "fabric/data/data_loader.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <mutex>
#include <set>
#include <stdexcept>
#include <utility>

#include "fabric/core/error.h"

namespace {

using fabric::Batch;
using fabric::DataLoader;
using fabric::DataLoaderOptions;

// Example i has data [i, i] and target i, so batches reveal which examples they hold.
std::shared_ptr<fabric::TensorDataset> numbered(int64_t n) {
  auto ids = torch::arange(n, torch::kLong);
  return std::make_shared<fabric::TensorDataset>(ids.to(torch::kFloat).unsqueeze(1).repeat({1, 2}),
                                                 ids);
}

std::vector<int64_t> targets_of(DataLoader& loader, std::vector<int64_t>* batch_sizes = nullptr) {
  std::vector<int64_t> out;
  for (Batch& b : loader) {
    EXPECT_TRUE(torch::equal(b.data.select(1, 0).to(torch::kLong), b.target));
    if (batch_sizes) batch_sizes->push_back(b.target.size(0));
    for (int64_t i = 0; i < b.target.size(0); ++i) out.push_back(b.target[i].item<int64_t>());
  }
  return out;
}

TEST(DataLoaderTest, BatchesFollowTheSamplerOrderAndDropLast) {
  auto ds = numbered(10);
  DataLoader keep(ds, DataLoaderOptions().batch_size(4));
  std::vector<int64_t> sizes;
  EXPECT_EQ(targets_of(keep, &sizes), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ(keep.size(), 3);

  DataLoader drop(ds, DataLoaderOptions().batch_size(4).drop_last(true));
  sizes.clear();
  EXPECT_EQ(targets_of(drop, &sizes).size(), 8u);
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(drop.size(), 2);
}

TEST(DataLoaderTest, EachPassIsTheNextEpochAndSetEpochReplaysOne) {
  auto ds = numbered(64);
  DataLoader loader(ds, DataLoaderOptions().batch_size(8).shuffle(true).seed(3));
  const auto epoch0 = targets_of(loader);
  const auto epoch1 = targets_of(loader);
  EXPECT_NE(epoch0, epoch1);
  EXPECT_EQ(loader.next_epoch(), 2);
  loader.set_epoch(0);
  EXPECT_EQ(targets_of(loader), epoch0);

  fabric::DistributedSampler sampler(64, 1, 0, true, 3);
  sampler.set_epoch(1);
  EXPECT_EQ(epoch1, sampler.indices());
}

TEST(DataLoaderTest, WorkersKeepOrderAndAugmentationIsIndependentOfThreading) {
  auto ds = numbered(200);
  // A transform whose output depends on its generator and whose cost varies by batch.
  auto transform = [](Batch b, at::Generator& gen) {
    const int64_t spin = b.target[0].item<int64_t>() % 7 * 2000;
    volatile double sink = 0;
    for (int64_t i = 0; i < spin; ++i) sink = sink + 1.0;
    b.data = b.data + torch::rand(b.data.sizes(), gen);
    return b;
  };
  auto run = [&](int64_t workers, int64_t prefetch) {
    DataLoader loader(ds, DataLoaderOptions()
                              .batch_size(7)
                              .shuffle(true)
                              .seed(11)
                              .num_workers(workers)
                              .prefetch(prefetch)
                              .transform(transform));
    std::vector<torch::Tensor> out;
    for (Batch& b : loader) out.push_back(b.data.clone());
    return out;
  };
  const auto inline_batches = run(0, 1);
  for (auto [workers, prefetch] : {std::pair<int64_t, int64_t>{1, 1}, {3, 2}, {4, 8}}) {
    const auto threaded = run(workers, prefetch);
    ASSERT_EQ(threaded.size(), inline_batches.size());
    for (size_t i = 0; i < threaded.size(); ++i)
      EXPECT_TRUE(torch::equal(threaded[i], inline_batches[i]))
          << workers << " workers, batch " << i;
  }
}

TEST(DataLoaderTest, RanksSeeDisjointShards) {
  auto ds = numbered(40);
  std::set<int64_t> all;
  for (int64_t rank = 0; rank < 4; ++rank) {
    DataLoader loader(ds, DataLoaderOptions().batch_size(3).shuffle(true), {4, rank, torch::kCPU});
    for (auto t : targets_of(loader)) EXPECT_TRUE(all.insert(t).second);
  }
  EXPECT_EQ(all.size(), 40u);
}

// A job of `from` ranks reads `batches` batches of epoch 0 on each rank and saves rank 0's loader
// state; a job of `to` ranks (another batch size too) restores it on every rank and reads the rest
// of the epoch, then epoch 1. Every example of epoch 0 is read once across the two jobs (none
// twice, none skipped), and epoch 1 is whole (it is the new shape's own).
void expect_carried_over(int64_t n, int64_t from, int64_t from_bs, int64_t batches, int64_t to,
                         int64_t to_bs, bool drop_last) {
  auto ds = numbered(n);
  const auto options = [&](int64_t bs) {
    return DataLoaderOptions().batch_size(bs).shuffle(true).seed(5).drop_last(drop_last);
  };
  std::multiset<int64_t> epoch0;
  c10::IValue saved;
  for (int64_t rank = 0; rank < from; ++rank) {
    DataLoader first(ds, options(from_bs), {from, rank, torch::kCPU});
    int64_t taken = 0;
    for (Batch& b : first) {
      for (int64_t i = 0; i < b.target.size(0); ++i) epoch0.insert(b.target[i].item<int64_t>());
      if (++taken == batches) break;
    }
    if (rank == 0) saved = first.save_state();
  }
  std::multiset<int64_t> epoch1;
  for (int64_t rank = 0; rank < to; ++rank) {
    DataLoader resumed(ds, options(to_bs), {to, rank, torch::kCPU});
    resumed.prepare_restore(saved, "ckpt")();
    EXPECT_EQ(resumed.state().epoch, 0);
    for (auto t : targets_of(resumed)) epoch0.insert(t);
    for (auto t : targets_of(resumed)) epoch1.insert(t);
  }
  const std::string shape = std::to_string(from) + " ranks x " + std::to_string(from_bs) + " → " +
                            std::to_string(to) + " ranks x " + std::to_string(to_bs);
  // drop_last leaves out what does not fill the split and the ranks' last batches, as in any
  // epoch: of the rest, at most `to` examples and `to` x (to_bs - 1) go unread.
  const int64_t distinct =
      static_cast<int64_t>(std::set<int64_t>(epoch0.begin(), epoch0.end()).size());
  if (drop_last) {
    EXPECT_GE(distinct, n - to - to * (to_bs - 1)) << shape;
  } else {
    EXPECT_EQ(distinct, n) << shape;
  }
  for (int64_t id = 0; id < n; ++id) EXPECT_LE(epoch0.count(id), 1u) << shape << ": id " << id;
  const int64_t whole_epoch = drop_last ? to * (n / to / to_bs * to_bs) : n;
  EXPECT_EQ(std::set<int64_t>(epoch1.begin(), epoch1.end()).size(),
            static_cast<size_t>(whole_epoch))
      << shape;
}

TEST(DataLoaderTest, MidEpochResumeAtAnotherShapeReadsTheRestOfTheEpochOnce) {
  expect_carried_over(60, 2, 4, 3, 3, 4, false);  // 2 → 3 ranks
  expect_carried_over(60, 3, 5, 2, 2, 4, false);  // 3 → 2 ranks, another batch size
  expect_carried_over(61, 2, 4, 5, 3, 3, false);  // an odd count
  expect_carried_over(61, 3, 4, 2, 2, 4, true);   // drop_last
  expect_carried_over(60, 4, 2, 3, 1, 8, false);  // 4 ranks → 1 (tp x dp: dp shrinks)
}

TEST(DataLoaderTest, MidEpochResumeRefusesAnotherOrder) {
  auto ds = numbered(60);
  DataLoader first(ds, DataLoaderOptions().batch_size(4).shuffle(true).seed(5),
                   {2, 0, torch::kCPU});
  int64_t taken = 0;
  for (Batch& b : first) {
    (void)b;
    if (++taken == 2) break;
  }
  const c10::IValue saved = first.save_state();
  DataLoader other(ds, DataLoaderOptions().batch_size(4).shuffle(true).seed(6),
                   {3, 0, torch::kCPU});
  try {
    other.prepare_restore(saved, "ckpt");
    FAIL() << "resumed with another seed";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(e.what(),
                 "ckpt: cannot resume in the middle of epoch 0 (after batch 2 of 8): the data "
                 "order changed (world size 2 → 3, samples per rank 30 → 20, seed 5 → 6); resume "
                 "with the same data and order (dataset, shuffle, seed, drop_last, streaming) or "
                 "from an end-of-epoch checkpoint");
  }
  // Another dataset (data.root changed): the rest of the epoch would be other examples, or
  // none (a smaller one); a world size that changes too cannot carry it over either.
  for (const int64_t world : {2, 3}) {
    DataLoader smaller(numbered(10), DataLoaderOptions().batch_size(4).shuffle(true).seed(5),
                       {world, 0, torch::kCPU});
    try {
      smaller.prepare_restore(saved, "ckpt");
      FAIL() << "resumed on another dataset at world size " << world;
    } catch (const fabric::Error& e) {
      EXPECT_NE(std::string(e.what()).find("examples 60 → 10"), std::string::npos) << e.what();
    }
  }
}

TEST(DataLoaderTest, BreakingEarlyThenStartingAgainWorks) {
  auto ds = numbered(100);
  DataLoader loader(ds, DataLoaderOptions().batch_size(5).num_workers(2).prefetch(4));
  int seen = 0;
  for (Batch& b : loader) {
    (void)b;
    if (++seen == 3) break;
  }
  EXPECT_EQ(targets_of(loader).size(), 100u);  // a full second pass
}

TEST(DataLoaderTest, ErrorsSurfaceAtTheirBatch) {
  auto ds = numbered(20);
  DataLoader loader(ds, DataLoaderOptions().batch_size(5).num_workers(2).transform(
                            [](Batch b, at::Generator&) -> Batch {
                              if (b.target[0].item<int64_t>() == 10)
                                throw std::runtime_error("bad batch 2");
                              return b;
                            }));
  int reached = 0;
  try {
    for (Batch& b : loader) {
      (void)b;
      ++reached;
    }
    FAIL() << "expected the transform's exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "bad batch 2");
  }
  EXPECT_EQ(reached, 2);
}

// The default num_workers is automatic: no thread for a TensorDataset (cheap gathers) without a
// transform on the CPU; one for a transform or a dataset whose batches cost more; explicit
// values are kept; the batches are the same either way.
TEST(DataLoaderTest, AutomaticWorkersSkipTheThreadForCheapInMemoryBatches) {
  struct Slow : fabric::Dataset {  // batches that cost (file reads, decoding)
    int64_t size() const override { return 12; }
    Batch get_batch(const std::vector<int64_t>& indices) const override {
      return numbered(12)->get_batch(indices);
    }
  };
  auto opts = DataLoaderOptions().batch_size(4).shuffle(true);
  EXPECT_EQ(opts.num_workers(), DataLoaderOptions::kAutoWorkers);
  DataLoader cheap(numbered(12), opts);
  EXPECT_EQ(cheap.options().num_workers(), 0);
  DataLoader slow(std::make_shared<Slow>(), opts);
  EXPECT_EQ(slow.options().num_workers(), 1);
  DataLoader augmented(
      numbered(12), DataLoaderOptions(opts).transform([](Batch b, at::Generator&) { return b; }));
  EXPECT_EQ(augmented.options().num_workers(), 1);
  DataLoader explicit_two(numbered(12), DataLoaderOptions(opts).num_workers(2));
  EXPECT_EQ(explicit_two.options().num_workers(), 2);
  EXPECT_EQ(targets_of(cheap), targets_of(slow));
  EXPECT_THROW(DataLoader(numbered(12), DataLoaderOptions(opts).num_workers(-2)), fabric::Error);
}

TEST(DataLoaderTest, BatchesArriveOnTheRequestedDevice) {
  DataLoader loader(numbered(8), DataLoaderOptions().batch_size(4));
  for (Batch& b : loader) {
    EXPECT_TRUE(b.data.device().is_cpu());
    EXPECT_TRUE(b.target.device().is_cpu());
  }
}

// With Fabric's cuDNN benchmarking on, the pass's short final batch is handed out with the
// process-wide benchmark flag off (one step's new shape must not time every convolution), every
// full batch with it on; a loader Fabric did not mark leaves the flag alone.
TEST(DataLoaderTest, ShortFinalBatchRunsWithoutCudnnBenchmarking) {
  auto& ctx = at::globalContext();
  const bool before = ctx.benchmarkCuDNN();
  fabric::LoaderPlacement marked;
  marked.cudnn_benchmark = true;
  for (int64_t workers : {0, 1}) {
    SCOPED_TRACE("num_workers " + std::to_string(workers));
    ctx.setBenchmarkCuDNN(true);
    DataLoader loader(numbered(10), DataLoaderOptions().batch_size(4).num_workers(workers), marked);
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::vector<bool> flags;
      for (Batch& b : loader) {
        (void)b;
        flags.push_back(ctx.benchmarkCuDNN());
      }
      EXPECT_EQ(flags, (std::vector<bool>{true, true, false}));  // 4, 4, then 2 examples
    }
    DataLoader dropping(numbered(10),
                        DataLoaderOptions().batch_size(4).drop_last(true).num_workers(workers),
                        marked);
    for (Batch& b : dropping) {
      (void)b;
      EXPECT_TRUE(ctx.benchmarkCuDNN());
    }
  }
  EXPECT_TRUE(ctx.benchmarkCuDNN());  // the passes are over: back on

  ctx.setBenchmarkCuDNN(false);
  DataLoader unmarked(numbered(10), DataLoaderOptions().batch_size(4));
  for (Batch& b : unmarked) {
    (void)b;
    EXPECT_FALSE(ctx.benchmarkCuDNN());
  }
  ctx.setBenchmarkCuDNN(before);
}

// Streamed loaders (shuffle_buffer > 0) over a numbered dataset cut into uneven shards, recording
// the read-ahead's hints.
class ShardedNumbered : public fabric::TensorDataset {
 public:
  ShardedNumbered(std::vector<int64_t> shards, int64_t n)
      : fabric::TensorDataset(
            torch::arange(n, torch::kLong).to(torch::kFloat).unsqueeze(1).repeat({1, 2}),
            torch::arange(n, torch::kLong)),
        shards_(std::move(shards)) {}
  std::vector<int64_t> shard_sizes() const override { return shards_; }
  // As a dataset that reads files: the loader's read-ahead runs for any order.
  bool cheap_batches() const override { return false; }
  std::pair<int64_t, int64_t> locate(int64_t index) const override {
    return {index / 10, index * 100};
  }
  void will_read(const std::vector<int64_t>& indices) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    hinted_.insert(hinted_.end(), indices.begin(), indices.end());
  }
  std::vector<int64_t> hinted() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return hinted_;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    hinted_.clear();
  }

 private:
  std::vector<int64_t> shards_;
  mutable std::mutex mutex_;
  mutable std::vector<int64_t> hinted_;
};

DataLoaderOptions streamed(int64_t workers) {
  return DataLoaderOptions()
      .batch_size(6)
      .shuffle(true)
      .seed(21)
      .num_workers(workers)
      .shuffle_buffer(25);
}

TEST(DataLoaderTest, StreamedLoaderResumesMidEpochWithTheBatchesOfTheWholeRun) {
  auto ds = std::make_shared<ShardedNumbered>(std::vector<int64_t>{17, 40, 3, 29, 31}, 120);
  for (int64_t replicas : {1, 2}) {
    for (int64_t workers : {0, 2}) {
      for (int64_t rank = 0; rank < replicas; ++rank) {
        const fabric::LoaderPlacement at{replicas, rank, torch::kCPU};
        DataLoader whole(ds, streamed(workers), at);
        std::vector<int64_t> expected = targets_of(whole);  // epoch 0
        const auto epoch1 = targets_of(whole);
        expected.insert(expected.end(), epoch1.begin(), epoch1.end());
        fabric::StreamSampler sampler(ds->shard_sizes(), replicas, rank, true, 21, false, 25);
        EXPECT_EQ(std::vector<int64_t>(expected.begin(), expected.begin() + sampler.num_samples()),
                  sampler.indices());

        // Stopped after 3 batches of epoch 0 (the third in hand), resumed by a new loader.
        DataLoader first(ds, streamed(workers), at);
        std::vector<int64_t> got;
        int64_t batches = 0;
        for (Batch& b : first) {
          for (int64_t i = 0; i < b.target.size(0); ++i) got.push_back(b.target[i].item<int64_t>());
          if (++batches == 3) break;
        }
        const DataLoader::State state = first.state();
        EXPECT_EQ(state.batches, 3);
        DataLoader resumed(ds, streamed(workers), at);
        resumed.load_state(state);
        for (int pass = 0; pass < 2; ++pass) {
          const auto rest = targets_of(resumed);
          got.insert(got.end(), rest.begin(), rest.end());
        }
        EXPECT_EQ(got, expected) << replicas << " ranks, rank " << rank << ", " << workers
                                 << " workers";
      }
    }
  }
}

TEST(DataLoaderTest, StreamedReadAheadHintsTheStreamInReadOrderBoundedAhead) {
  auto ds = std::make_shared<ShardedNumbered>(std::vector<int64_t>{17, 40, 3, 29, 31}, 120);
  for (int64_t workers : {0, 2}) {
    ds->clear();
    const fabric::LoaderPlacement at{2, 1, torch::kCPU};
    DataLoader loader(ds, streamed(workers), at);
    fabric::StreamSampler sampler(ds->shard_sizes(), 2, 1, true, 21, false, 25);
    const int64_t capacity = std::max<int64_t>(2, workers);  // prefetch 2
    int64_t b = 0;
    for (Batch& batch : loader) {
      (void)batch;
      // The reader hints a batch's worth at a time, and only while below this bound.
      EXPECT_LE(static_cast<int64_t>(ds->hinted().size()),
                sampler.stream_read((b + 2 * capacity) * 6) + 6)
          << "batch " << b << ", " << workers << " workers";
      ++b;
    }
    loader.load_state({0, 0});  // joins the pass's threads
    // In read order, each once: a prefix of the stream (the reader may still have been behind
    // when the pass ended: hints do not hold up batches).
    const auto stream = sampler.stream();
    auto hinted = ds->hinted();
    ASSERT_LE(hinted.size(), stream.size());
    EXPECT_EQ(hinted, std::vector<int64_t>(stream.begin(), stream.begin() + hinted.size()))
        << workers << " workers";

    // A resumed pass hints from where the stream stood (the buffer's examples are read on demand).
    ds->clear();
    loader.load_state({1, 4});
    sampler.set_epoch(1);
    for (Batch& batch : loader) (void)batch;
    loader.load_state({0, 0});
    const auto stream1 = sampler.stream();
    const auto from = stream1.begin() + sampler.stream_read(4 * 6);
    hinted = ds->hinted();
    ASSERT_LE(hinted.size(), static_cast<size_t>(stream1.end() - from));
    EXPECT_EQ(hinted, std::vector<int64_t>(from, from + hinted.size()));
  }
}

// A global shuffle of a dataset that reads files: hints in the order batches take the examples.
TEST(DataLoaderTest, GlobalShuffleReadAheadHintsTheBatchOrder) {
  auto ds = std::make_shared<ShardedNumbered>(std::vector<int64_t>{17, 40, 3, 29, 31}, 120);
  for (int64_t workers : {0, 2}) {
    ds->clear();
    DataLoader loader(ds,
                      DataLoaderOptions().batch_size(6).shuffle(true).seed(5).num_workers(workers),
                      {2, 0, torch::kCPU});
    fabric::DistributedSampler sampler(120, 2, 0, true, 5);
    const int64_t capacity = std::max<int64_t>(2, workers);
    int64_t b = 0;
    for (Batch& batch : loader) {
      (void)batch;
      EXPECT_LE(static_cast<int64_t>(ds->hinted().size()), (b + 2 * capacity + 1) * 6)
          << "batch " << b << ", " << workers << " workers";
      ++b;
    }
    loader.load_state({0, 0});
    const auto order = sampler.indices();
    const auto hinted = ds->hinted();
    ASSERT_LE(hinted.size(), order.size());
    EXPECT_EQ(hinted, std::vector<int64_t>(order.begin(), order.begin() + hinted.size()))
        << workers << " workers";
  }
}

TEST(DataLoaderTest, StreamedPositionIsTheNextExampleRank0Reads) {
  auto ds = std::make_shared<ShardedNumbered>(std::vector<int64_t>{17, 40, 3, 29, 31}, 120);
  DataLoader loader(ds, streamed(0), {2, 1, torch::kCPU});
  fabric::StreamSampler rank0(ds->shard_sizes(), 2, 0, true, 21, false, 25);
  rank0.set_epoch(2);
  const int64_t next = rank0.stream()[static_cast<size_t>(rank0.stream_read(3 * 6))];
  EXPECT_EQ(loader.stream_position({2, 3}, 0),
            (std::pair<int64_t, int64_t>{next / 10, next * 100}));
  EXPECT_EQ(loader.stream_position({2, 10}, 0), (std::pair<int64_t, int64_t>{-1, -1}))
      << "rank 0's 60 examples are read after its 10th batch";
  DataLoader global(ds, DataLoaderOptions().batch_size(6));
  EXPECT_THROW(global.stream_position({0, 1}, 0), fabric::Error);
  auto wrong = std::make_shared<ShardedNumbered>(std::vector<int64_t>{17, 40}, 120);
  try {
    DataLoader bad(wrong, streamed(0));
    FAIL() << "shards that do not add up to the dataset";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(e.what(),
                 "DataLoader: the dataset's shard_sizes() add up to 57, its size() is 120");
  }
}

}  // namespace
