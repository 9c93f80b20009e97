#include "strategies/ddp_options.h"

namespace fabric::strategies {

const char* comm_hook_name(CommHook hook) {
  switch (hook) {
    case CommHook::kFp16:
      return "fp16";
    case CommHook::kBf16:
      return "bf16";
    case CommHook::kNone:
      break;
  }
  return "none";
}

std::optional<CommHook> parse_comm_hook(const std::string& name) {
  for (CommHook h : {CommHook::kNone, CommHook::kFp16, CommHook::kBf16})
    if (name == comm_hook_name(h)) return h;
  return std::nullopt;
}

}  // namespace fabric::strategies
