#include "fabric/main.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "fabric/core/output.h"

namespace fabric {
namespace {

// LibTorch messages carry a C++ stack trace after the first lines; keep what a user can act on.
std::string without_backtrace(const c10::Error& e) {
  std::string msg = e.what_without_backtrace();
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  return msg;
}

}  // namespace

// " (rank N)" in processes of a multi-process job, so an error names where it happened.
std::string rank_suffix() {
  for (const char* var :
       {"RANK", "FABRIC_LOCAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    if (const char* v = std::getenv(var)) return std::string(" (rank ") + v + ")";
  }
  return "";
}

int run_main(int argc, char** argv, const ConfigSchema& schema, const MainBody& body) {
  const std::string program =
      argc > 0 ? std::filesystem::path(argv[0]).filename().string() : std::string("program");
  try {
    const CommandLine cl = parse_command_line(argc, argv);
    if (cl.help) {
      std::cout << describe_schema(schema, program);
      return 0;
    }
    const Config config = cl.config_file.empty()
                              ? Config::defaults(schema, cl.overrides)
                              : Config::load(cl.config_file, cl.overrides, schema);
    if (cl.print_config) {
      std::cout << "# resolved config (hash " << config.hash() << ")\n" << config.to_yaml();
      return 0;
    }
    return body(config);
  } catch (const ConfigError& e) {
    write_to_terminal(e.what());
    return 2;
  } catch (const Error& e) {
    write_to_terminal("error" + rank_suffix() + ": " + e.what());
    return 1;
  } catch (const c10::Error& e) {
    write_to_terminal("error" + rank_suffix() + ": " + without_backtrace(e));
    return 1;
  } catch (const std::exception& e) {
    write_to_terminal("error" + rank_suffix() + ": " + describe(e));
    return 1;
  }
}

}  // namespace fabric
