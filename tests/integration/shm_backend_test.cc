// The shared-memory all-reduce backend (fabric/distributed/shm_backend.h): real processes (2, 3
// and 4 ranks, self-launched) compare it bitwise with the same reduction done by hand in rank
// order and with Gloo's all-reduce; a rank left alone fails with an error naming the wait; in one
// process, a segment that cannot be had is reported, not crashed on.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <filesystem>
#include <string>

#include "fabric/distributed/shm_backend.h"
#include "tests/run_command.h"

namespace {

using fabric::testing::CommandResult;

CommandResult run_job(int world, const std::string& mode) {
  const std::string exe = fabric::testing::helper_binary("//tests/integration:shm_backend_helper");
  return fabric::testing::run_command(exe + " " + std::to_string(world) + " " + mode);
}

TEST(ShmBackendTest, MatchesTheRankOrderReductionAndGlooOnTwoThreeAndFourRanks) {
  for (int world : {2, 3, 4}) {
    CommandResult r = run_job(world, "parity");
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("rank 0 backends: fabric_shm gloo"), std::string::npos) << r.out;
    // CUDA tensors of ranks sharing a GPU go through the host; CPU ones and a CPU group's not.
    EXPECT_NE(r.out.find("rank 0 host wire: 1 0 0"), std::string::npos) << r.out;
    EXPECT_EQ(fabric::testing::ranks_missing_report(r.out, world,
                                                    " of " + std::to_string(world) + ": ok"),
              std::vector<int>{})
        << r.out;
  }
}

// Tensors of different sizes on different ranks: each rank split its own count into chunks and
// read the others' stale bytes (no error, garbage); now every rank fails at once naming both.
TEST(ShmBackendTest, DifferentSizesOnDifferentRanksFailOnEveryRank) {
  CommandResult r = run_job(2, "mismatch");
  EXPECT_EQ(r.code, 0) << r.out;
  for (const char* rank : {"rank 0 error: shared-memory all_reduce on rank 0: ",
                           "rank 1 error: shared-memory all_reduce on rank 1: "})
    EXPECT_NE(r.out.find(std::string(rank) +
                         "the ranks passed different tensors (rank 0: 4 Float elements, sum; "
                         "rank 1: 8 Float elements, sum): every rank must all-reduce a tensor of "
                         "the same size and dtype with the same op"),
              std::string::npos)
        << r.out;
  EXPECT_EQ(r.out.find("all_reduce returned"), std::string::npos) << r.out;
}

TEST(ShmBackendTest, ARankLeftAloneFailsNamingTheWaitAndStaysFailed) {
  CommandResult r = run_job(2, "timeout");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rank 0 error 0: shared-memory all_reduce on rank 0: timed out after 2000 "
                       "ms waiting for the other ranks"),
            std::string::npos)
      << r.out;
  // The segment's rounds are out of step after a timeout: later all-reduces fail too.
  EXPECT_NE(r.out.find("rank 0 error 1: shared-memory all_reduce on rank 0: timed out"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("all_reduce returned"), std::string::npos) << r.out;
}

TEST(ShmBackendTest, OneRankReducesToItself) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto backend = fabric::distributed::make_shm_backend(store, {}, {});
  ASSERT_TRUE(backend);
  EXPECT_EQ(backend->getBackendName(), "fabric_shm");
  const torch::Tensor x = torch::randn({100000});
  std::vector<torch::Tensor> t = {x.clone()};
  backend->allreduce(t)->wait();
  EXPECT_TRUE(torch::equal(t[0], x));
}

TEST(ShmBackendTest, ASegmentThatCannotBeHadIsReportedNotCrashedOn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  fabric::distributed::ShmBackendOptions options;
  options.chunk_bytes = int64_t{1} << 50;  // 3 PiB of /dev/shm
  std::string why;
  auto backend = fabric::distributed::make_shm_backend(store, {}, options, &why);
  EXPECT_FALSE(backend);
  EXPECT_NE(why.find("rank 0: cannot "), std::string::npos) << why;
  EXPECT_NE(why.find("/dev/shm"), std::string::npos) << why;
}

}  // namespace
