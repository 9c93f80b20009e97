#include "fabric/data/data_loader.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

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

}  // namespace
