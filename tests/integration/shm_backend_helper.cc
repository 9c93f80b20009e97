// Test helper for shm_backend_test: a self-launched job of WORLD processes.
//   shm_backend_helper WORLD parity   all-reduces, reduce-scatters and all-gathers through shared
//                                     memory (cpu_backend shm) against the same results computed
//                                     by hand in rank order (bitwise) and the all-reduce against
//                                     Gloo's; prints "rank R of W: ok"
//   shm_backend_helper WORLD timeout  rank 0 all-reduces alone (2 s timeout); prints its error,
//                                     then releases the other ranks through the store
//   shm_backend_helper WORLD mismatch rank R all-reduces 4 + 4R elements; each prints its error
// Exit 0 when every check passed. The checks are the test's; this binary only reports.
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "fabric/distributed/process_group.h"
#include "fabric/distributed/shm_backend.h"
#include "fabric/environments/environments.h"
#include "fabric/launchers/subprocess_launcher.h"

namespace {

using c10d::ReduceOp;
namespace distributed = fabric::distributed;

struct Case {
  const char* name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
  ReduceOp::RedOpType op;
  bool transpose = false;  // a non-contiguous view
};

torch::Tensor input(const Case& c, int64_t rank, int64_t index) {
  auto gen = at::detail::createCPUGenerator(1000 * rank + index);
  torch::Tensor x;
  if (c.dtype == torch::kInt64 || c.dtype == torch::kInt32) {
    x = at::randint(-3, 4, c.shape, gen, torch::TensorOptions().dtype(c.dtype));
  } else {
    x = at::randn(c.shape, gen).to(c.dtype);
  }
  return c.transpose ? x.t() : x;
}

torch::Tensor reduce_in_rank_order(const std::vector<torch::Tensor>& all, ReduceOp::RedOpType op) {
  torch::Tensor out = all[0].clone();
  for (size_t r = 1; r < all.size(); ++r) {
    switch (op) {
      case ReduceOp::SUM:
        out = out + all[r];
        break;
      case ReduceOp::PRODUCT:
        out = out * all[r];
        break;
      case ReduceOp::MIN:
        out = torch::minimum(out, all[r]);
        break;
      default:
        out = torch::maximum(out, all[r]);
        break;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const int64_t world = std::atoll(argv[1]);
  const std::string mode = argv[2];
  auto env = fabric::detect_environment(fabric::process_environment(), world);
  const int64_t rank = env->global_rank();
  c10::intrusive_ptr<c10d::Store> store;
  std::unique_ptr<fabric::SubprocessLauncher> launcher;
  if (rank == 0) {
    store = distributed::make_store({"127.0.0.1", 0, true, world, std::chrono::seconds(60)});
    launcher = std::make_unique<fabric::SubprocessLauncher>(
        fabric::LaunchOptions{world, distributed::store_port(store)},
        std::vector<std::string>(argv, argv + argc));
  } else {
    store = distributed::make_store(
        {"127.0.0.1", env->main_port(), false, world, std::chrono::seconds(60)});
  }
  // The backend alone (no Gloo underneath: only all-reduce is called), `wait` to wait.
  const auto shm_alone = [&](std::chrono::seconds wait) {
    distributed::ShmBackendOptions shm_options;
    shm_options.rank = rank;
    shm_options.world_size = world;
    shm_options.timeout = wait;
    return distributed::make_shm_backend(store, {}, shm_options);
  };
  if (mode == "mismatch") {
    auto backend = shm_alone(std::chrono::seconds(20));
    std::vector<torch::Tensor> t = {torch::ones({4 + 4 * rank})};
    try {
      backend->allreduce(t)->wait();
      std::printf("rank %lld: all_reduce returned\n", static_cast<long long>(rank));
    } catch (const std::exception& e) {
      std::printf("rank %lld error: %s\n", static_cast<long long>(rank), e.what());
    }
    std::fflush(stdout);
    return launcher ? launcher->wait() : 0;
  }
  if (mode == "timeout") {
    auto backend = shm_alone(std::chrono::seconds(2));
    if (rank == 0) {
      std::vector<torch::Tensor> t = {torch::ones({4})};
      for (int attempt = 0; attempt < 2; ++attempt) {
        try {
          backend->allreduce(t)->wait();
          std::printf("rank 0: all_reduce returned\n");
        } catch (const std::exception& e) {
          std::printf("rank 0 error %d: %s\n", attempt, e.what());
        }
      }
      store->set("released", std::vector<uint8_t>{1});
    } else {
      store->get("released");
    }
    std::fflush(stdout);
    return launcher ? launcher->wait() : 0;
  }

  distributed::ProcessGroupOptions options;
  options.rank = rank;
  options.world_size = world;
  options.timeout = std::chrono::seconds(60);
  options.cpu_backend = distributed::CpuBackend::kShm;
  auto pg = distributed::make_process_group(store, options);
  options.cpu_backend = distributed::CpuBackend::kGloo;
  auto gloo = distributed::make_process_group(c10::make_intrusive<c10d::PrefixStore>("gloo", store),
                                              options);
  std::printf("rank %lld backends: %s %s\n", static_cast<long long>(rank),
              distributed::active_cpu_backend(*pg).c_str(),
              distributed::active_cpu_backend(*gloo).c_str());
  // Ranks sharing one GPU (cuda_with_gloo): the CUDA entry is the CPU backend, here fabric_shm,
  // and point-to-point sends of CUDA tensors must stage through the host (on an H200 the
  // pipeline runner, which looked for the name "gloo", handed Gloo device pointers).
  options.cpu_backend = distributed::CpuBackend::kShm;
  options.cuda = true;
  options.cuda_with_gloo = true;
  auto shared_gpu = distributed::make_process_group(
      c10::make_intrusive<c10d::PrefixStore>("shared_gpu", store), options);
  const c10::Device cuda(c10::DeviceType::CUDA, 0), cpu(c10::DeviceType::CPU);
  std::printf("rank %lld host wire: %d %d %d\n", static_cast<long long>(rank),
              distributed::sends_through_host(*shared_gpu, cuda) ? 1 : 0,
              distributed::sends_through_host(*shared_gpu, cpu) ? 1 : 0,
              distributed::sends_through_host(*pg, cuda) ? 1 : 0);

  const std::vector<Case> cases = {
      {"float32 5000003 sum (several chunks)", torch::kFloat32, {5000003}, ReduceOp::SUM},
      {"float32 300007 sum (several rounds)", torch::kFloat32, {300007}, ReduceOp::SUM},
      {"float64 1000 sum", torch::kFloat64, {1000}, ReduceOp::SUM},
      {"bfloat16 4099 sum", torch::kBFloat16, {4099}, ReduceOp::SUM},
      {"float16 17 max", torch::kFloat16, {17}, ReduceOp::MAX},
      {"int64 777 product", torch::kInt64, {777}, ReduceOp::PRODUCT},
      {"int32 33 min", torch::kInt32, {33}, ReduceOp::MIN},
      {"float32 33x64 transposed sum", torch::kFloat32, {33, 64}, ReduceOp::SUM, true},
      {"float32 scalar sum", torch::kFloat32, {}, ReduceOp::SUM},
      {"float32 empty sum", torch::kFloat32, {0}, ReduceOp::SUM},
  };
  int failures = 0;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::fprintf(stderr, "rank %lld: %s failed\n", static_cast<long long>(rank), what.c_str());
      ++failures;
    }
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const torch::Tensor x = input(c, rank, static_cast<int64_t>(i));
    std::vector<torch::Tensor> shm = {x.clone()}, by_gloo = {x.contiguous().clone()};
    c10d::AllreduceOptions op;
    op.reduceOp = c.op;
    pg->allreduce(shm, op)->wait();
    gloo->allreduce(by_gloo, op)->wait();
    std::vector<torch::Tensor> everyone;
    for (int64_t r = 0; r < world; ++r) everyone.push_back(input(c, r, static_cast<int64_t>(i)));
    const torch::Tensor expected = reduce_in_rank_order(everyone, c.op);
    check(torch::equal(shm[0], expected), std::string(c.name) + ": shm == rank-order reduction");
    const bool exact = world == 2 || c.op != ReduceOp::SUM;
    const double tol = c.dtype == torch::kBFloat16 ? 5e-2 : 1e-5;
    check(exact
              ? torch::equal(shm[0], by_gloo[0])
              : torch::allclose(shm[0].to(torch::kDouble), by_gloo[0].to(torch::kDouble), tol, tol),
          std::string(c.name) + (exact ? ": shm == gloo" : ": shm ~ gloo"));
    const auto results = distributed::all_gather(*gloo, shm[0].contiguous(), "all_gather");
    for (const auto& other : results)
      check(torch::equal(other, results[0]), std::string(c.name) + ": same on every rank");

    // Reduce-scatter: every rank contributes world pieces the shape of the case (the flat input
    // of world * k elements); rank r keeps the rank-order reduction of piece r.
    if (c.shape.size() == 1 && c.shape[0] <= 400000) {
      Case scattered = c;
      scattered.shape = {world * c.shape[0]};
      scattered.transpose = false;
      std::vector<torch::Tensor> pieces;
      for (int64_t r = 0; r < world; ++r)
        pieces.push_back(input(scattered, r, static_cast<int64_t>(i) + 100));
      torch::Tensor in = pieces[rank].clone();
      torch::Tensor out = torch::full({c.shape[0]}, 7, torch::TensorOptions().dtype(c.dtype));
      c10d::ReduceScatterOptions rs;
      rs.reduceOp = c.op;
      pg->_reduce_scatter_base(out, in, rs)->wait();
      const torch::Tensor want =
          reduce_in_rank_order(pieces, c.op).narrow(0, rank * c.shape[0], c.shape[0]);
      check(torch::equal(out, want), std::string(c.name) + ": reduce_scatter == rank-order slice");
      check(torch::equal(in, pieces[rank]), std::string(c.name) + ": reduce_scatter input kept");
    }
    // All-gather, flat and as a list of the case's shape (what Fabric::all_gather issues).
    std::vector<torch::Tensor> contributions;
    for (int64_t r = 0; r < world; ++r)
      contributions.push_back(input(c, r, static_cast<int64_t>(i)).contiguous());
    const torch::Tensor everything = torch::cat(
        [&] {
          std::vector<torch::Tensor> flat;
          for (const auto& t : contributions) flat.push_back(t.reshape({-1}));
          return flat;
        }(),
        0);
    torch::Tensor gathered = torch::empty({everything.numel()}, x.options());
    torch::Tensor mine = x.clone();
    pg->_allgather_base(gathered, mine)->wait();
    check(torch::equal(gathered, everything), std::string(c.name) + ": flat all_gather");
    const auto listed = distributed::all_gather(*pg, x, "all_gather");
    bool same = static_cast<int64_t>(listed.size()) == world;
    for (int64_t r = 0; same && r < world; ++r) same = torch::equal(listed[r], contributions[r]);
    check(same, std::string(c.name) + ": list all_gather");
  }
  // Several in flight at once complete in issue order, each with its own result.
  std::vector<std::vector<torch::Tensor>> batch;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (int k = 0; k < 8; ++k) {
    batch.push_back({torch::full({1000 + k}, static_cast<float>(k + rank))});
    works.push_back(pg->allreduce(batch.back()));
  }
  for (int k = 0; k < 8; ++k) {
    works[k]->wait();
    const float want = static_cast<float>(world * k + world * (world - 1) / 2);
    check(torch::equal(batch[k][0], torch::full({1000 + k}, want)),
          "in flight #" + std::to_string(k));
  }
  pg->barrier()->wait();
  std::printf("rank %lld of %lld: %s\n", static_cast<long long>(rank),
              static_cast<long long>(world), failures == 0 ? "ok" : "FAILED");
  std::fflush(stdout);
  if (failures) return 1;
  return launcher ? launcher->wait() : 0;
}
