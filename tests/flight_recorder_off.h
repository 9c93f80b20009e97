// For tests that run several ranks as threads of one process (process groups over one HashStore):
// PyTorch's collective flight recorder, on by default (TORCH_FR_BUFFER_SIZE 2000 entries), adds a
// new process group's status to a process-wide map before it takes its lock
// (FlightRecorder::recordWithResetEnabled, torch 2.11), so two groups' first collectives at the
// same moment can corrupt the map: a SIGSEGV in about 1 of 270 runs of llama_test's tp case on 2
// vCPUs under load (core dump: std::_Rb_tree_insert_and_rebalance inside it). Including this turns
// the recorder off for the test process, before main and so before the recorder exists, unless
// TORCH_FR_BUFFER_SIZE is set. One rank per process (Fabric's launchers) never shares the map.
#ifndef TESTS_FLIGHT_RECORDER_OFF_H_
#define TESTS_FLIGHT_RECORDER_OFF_H_

#include <cstdlib>

namespace fabric::testing {

[[maybe_unused]] static const bool kFlightRecorderOff = [] {
  setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0);
  return true;
}();

}  // namespace fabric::testing

#endif  // TESTS_FLIGHT_RECORDER_OFF_H_
