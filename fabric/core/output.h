// Where a process's output goes. In a multi-process job only global rank 0 writes to the terminal;
// the other ranks send stdout and stderr to a per-rank log file in the run directory
// (rank_N.log), so LibTorch warnings and prints from every rank are kept, not interleaved. Error
// lines (fabric::run_main) still reach the terminal from every rank, tagged with the rank.
#ifndef FABRIC_CORE_OUTPUT_H_
#define FABRIC_CORE_OUTPUT_H_

#include <string>

namespace fabric {

// Sends this process's stdout and stderr (file descriptors 1 and 2) to `file` (appended, created
// if needed). Throws fabric::Error naming the file when it cannot be opened. The terminal's
// stderr is kept for write_to_terminal.
void redirect_output_to_file(const std::string& file);

// Writes `line` and a newline to the terminal's stderr, also when output is redirected (then it
// is written to the log file too).
void write_to_terminal(const std::string& line);

}  // namespace fabric

#endif  // FABRIC_CORE_OUTPUT_H_
