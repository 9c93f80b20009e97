#include "fabric/distributed/rendezvous.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <utility>

#include "fabric/core/output.h"
#include "fabric/distributed/collective_check.h"
#include "fabric/distributed/heartbeat.h"
#include "fabric/launchers/subprocess_launcher.h"

namespace fabric::distributed {
namespace {

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1";
}

}  // namespace

Rendezvous::Rendezvous(std::shared_ptr<ClusterEnvironment> environment, RendezvousOptions options)
    : env_(std::move(environment)), options_(std::move(options)) {
  const int64_t world = env_->world_size();
  const int64_t rank = env_->global_rank();
  const bool self_launch = !env_->creates_processes_externally();
  // Ranks the restart agent started: the agent hosts the store and supervises every rank.
  const bool agent = self_launch && env_->store_hosted_by_launcher();
  StoreOptions store;
  store.host = env_->main_address();
  store.port = env_->main_port();
  // Under torchrun's agent store every rank is a client of the agent's store.
  store.is_server = rank == 0 && !env_->store_hosted_by_launcher();
  store.prefix = env_->store_prefix();
  store.world_size = world;
  store.timeout = options_.timeout;
  // A job on one machine keeps its store on loopback; one spanning nodes must accept them all.
  const bool single_node = self_launch || is_loopback(env_->main_address());
  if (!single_node) store.listen_address = "";
  if (env_->main_address() == "::1") store.listen_address = "::1";
  store_ = make_store(store);
  if (self_launch && !agent && rank == 0 && world > 1) {
    // Rank 0 bound an ephemeral port; the children learn it from FABRIC_MASTER_PORT.
    LaunchOptions launch;
    launch.world_size = world;
    launch.master_port = store_port(store_);
    launcher_ = std::make_unique<SubprocessLauncher>(launch, options_.argv);
  }
  ProcessGroupOptions pg;
  pg.rank = rank;
  pg.world_size = world;
  pg.timeout = options_.timeout;
  pg.cuda = options_.cuda;
  pg.cuda_device = options_.cuda_device;
  pg.cuda_with_gloo = options_.cuda_with_gloo;
  pg.single_node = single_node;
  pg.cpu_backend = options_.cpu_backend;
  group_options_ = pg;
  pg_ = make_process_group(store_, pg);
  if (options_.debug_collectives && world > 1)
    checker_ = std::make_unique<CollectiveChecker>(store_, rank, world, options_.timeout);
  if ((!self_launch || agent) && world > 1 && options_.heartbeat_timeout.count() > 0) {
    HeartbeatOptions hb;
    hb.host = env_->main_address();
    hb.port = store_port(store_);
    hb.prefix = env_->store_prefix();
    hb.rank = rank;
    hb.world_size = world;
    hb.timeout = options_.heartbeat_timeout;
    hb.interval = std::min(std::chrono::milliseconds(1000), options_.heartbeat_timeout / 5);
    heartbeat_ = std::make_unique<Heartbeat>(hb, [rank](const std::string& why) {
      // The main thread may be blocked in a collective that will never complete: like the
      // self-launcher, this is a place where Fabric ends the process itself.
      write_to_terminal("error (rank " + std::to_string(rank) + "): " + why +
                        "; stopping this rank (fabric.ddp.heartbeat_timeout_s)");
      std::_Exit(1);
    });
  }
}

Rendezvous::~Rendezvous() = default;

std::string Rendezvous::begin_collective(const std::string& kind, const at::Tensor* tensor) {
  const int64_t seq = ++collectives_;
  const std::string signature = collective_signature(kind, tensor);
  if (checker_) checker_->check(seq, signature);
  return kind + " #" + std::to_string(seq) +
         (tensor != nullptr ? " (" + signature.substr(kind.size() + 1) + ")" : "");
}

void Rendezvous::finish() {
  pg_->barrier()->wait();  // nobody leaves while others still need the store (rank 0 hosts it)
  if (heartbeat_) {
    heartbeat_->stop();
    heartbeat_->finish();  // rank 0 keeps the store until every rank has stopped beating
  }
  pg_->shutdown();
  if (launcher_) launcher_->wait();
}

void Rendezvous::end_after_error() {
  if (heartbeat_) {
    heartbeat_->report_failure("rank " + std::to_string(env_->global_rank()) +
                               " failed (its own error line says why)");
  }
  launcher_.reset();  // stops the other ranks of a self-launched job
  try {
    pg_->abort();  // c10d: cancels pending communication; the process itself carries on
  } catch (const std::exception&) {
    // Best effort: the process is about to report its error and exit.
  }
}

}  // namespace fabric::distributed
