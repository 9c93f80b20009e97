// The connector's steps shared by its files (fabric/connector.h): connector.cc resolves the
// accelerator, devices, launch and threads; connector_strategy.cc the strategy and its options;
// connector_precision.cc the precision and the fp8 keys. Not part of the API.
#ifndef FABRIC_CONNECTOR_STEPS_H_
#define FABRIC_CONNECTOR_STEPS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fabric/config/config.h"
#include "fabric/connector.h"

namespace fabric::detail {

// "a, b,,c" → {"a", "b", "c"}: the items of a comma-separated key, trimmed, empty ones dropped.
std::vector<std::string> comma_separated(const std::string& text);
// "1 node", "3 processes".
std::string plural(int64_t n, const std::string& word);

// A choice key's value as its enum; the schema admits only the choices, so a miss is a bug here.
template <typename Enum>
Enum parsed(const Config& c, const std::string& key,
            std::optional<Enum> (*parse)(const std::string&)) {
  const std::string value = c.get_string(key);
  if (auto e = parse(value)) return *e;
  throw c.error_at(key, "'" + value + "' is not one of its choices (connector out of date)");
}

// Step 3, once the world is known: s.strategy and its options (fabric.fsdp.*,
// fabric.model_parallel.*, dp's fallback), warnings for keys that configure another strategy.
void resolve_strategy_options(const Config& c, const std::string& want, int64_t world,
                              ResolvedSetup& s);
// The fabric.ddp.* keys (also the process group settings of fsdp and model_parallel), once the
// strategy and device are known.
void resolve_ddp_options(const Config& c, ResolvedSetup& s);

// Step 4: s.precision (with CPU fallbacks and GPU requirements), s.fp8_exclude, s.fp8_rowwise,
// s.fp8_amax_history, s.fp8_fast_accumulation; warnings for fp8 keys under another precision.
void resolve_precision_options(const Config& c, const MachineFacts& m, ResolvedSetup& s);

}  // namespace fabric::detail

#endif  // FABRIC_CONNECTOR_STEPS_H_
