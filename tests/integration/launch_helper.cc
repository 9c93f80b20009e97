// Test helper for launcher_test: a self-launched job whose ranks behave as told.
//   launch_helper WORLD BEHAVIOUR PID_DIR
// Every rank writes PID_DIR/rank_R.pid. BEHAVIOUR:
//   ok      every rank exits 0 (rank 0 after waiting for the others)
//   fail    rank 1 exits with code 3; the others block until killed
//   hang    every rank blocks until killed
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "fabric/environments/environments.h"
#include "fabric/launchers/subprocess_launcher.h"

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  const int64_t world = std::atoll(argv[1]);
  const std::string behaviour = argv[2];
  const std::string pid_dir = argv[3];
  auto env = fabric::detect_environment(fabric::process_environment(), world);
  const int64_t rank = env->global_rank();
  {
    std::ofstream tmp(pid_dir + "/rank_" + std::to_string(rank) + ".tmp");
    tmp << getpid() << "\n";
  }
  std::rename((pid_dir + "/rank_" + std::to_string(rank) + ".tmp").c_str(),
              (pid_dir + "/rank_" + std::to_string(rank) + ".pid").c_str());
  auto block = [] {
    for (;;) pause();
  };
  if (rank == 0) {
    std::vector<std::string> args(argv, argv + argc);
    fabric::SubprocessLauncher launcher({world, 0, std::chrono::milliseconds(2000)}, args);
    if (behaviour != "ok") block();
    return launcher.wait();
  }
  if (env->world_size() != world || env->name() != "local") return 4;
  if (behaviour == "fail" && rank == 1) {
    // Fail only once every rank is up, so the test knows all pids it must see stopped.
    for (int tries = 0; tries < 1000; ++tries) {
      int started = 0;
      for (int64_t r = 0; r < world; ++r)
        started += std::ifstream(pid_dir + "/rank_" + std::to_string(r) + ".pid").good() ? 1 : 0;
      if (started == world) break;
      usleep(10000);
    }
    return 3;
  }
  if (behaviour != "ok") block();
  return 0;
}
