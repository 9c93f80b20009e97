#include "fabric/main.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <regex>

#include "fabric/core/output.h"

namespace fabric {
namespace {

// LibTorch messages carry a C++ stack trace after the first lines; keep what a user can act on.
std::string without_backtrace(const c10::Error& e) {
  std::string msg = e.what_without_backtrace();
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  return msg;
}

std::string& error_site() {
  static std::string site;
  return site;
}

bool debugging() {
  const char* v = std::getenv("FABRIC_DEBUG");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

// " (SITE)" when Fabric::launch recorded where the error happened.
std::string site_suffix() {
  return error_site().empty() ? std::string() : " (" + error_site() + ")";
}

}  // namespace

std::string explain_torch_error(const std::string& message) {
  // The CPU allocator's words for a size no machine holds (model.vocab_size=1e9, say).
  static const std::regex allocation(
      "DefaultCPUAllocator: (?:not enough memory|can't allocate "
      "memory): you tried to allocate ([0-9]+) bytes");
  std::smatch m;
  if (std::regex_search(message, m, allocation)) {
    const double gib = std::stod(m[1].str()) / (1024.0 * 1024 * 1024);
    char size[64];
    std::snprintf(size, sizeof size, "%.1f GiB", gib);
    return std::string("out of memory: a tensor of ") + size +
           " did not fit in this machine's memory; lower the sizes in the config "
           "(data.batch_size; the model's sizes: its model.* keys, or a smaller model.pretrained) "
           "or "
           "see what a run needs with //tools:estimate_memory";
  }
  if (message.find("index out of range in self") != std::string::npos)
    return "index out of range in an embedding: an id (a token, a class) at or above the table's "
           "size; check model.vocab_size (or the number of classes) against the data's ids";
  if (message.find("probability tensor contains either `inf`, `nan` or element < 0") !=
      std::string::npos)
    return "sampling from a distribution with inf/nan probabilities (the model's outputs are not "
           "finite: a diverged run, or a temperature too close to 0)";
  return message;
}

void set_error_site(const std::string& site) { error_site() = site; }

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
    write_to_terminal("error" + rank_suffix() + ": " + e.what() + site_suffix());
    return 1;
  } catch (const c10::Error& e) {
    write_to_terminal(
        "error" + rank_suffix() + ": " + explain_torch_error(without_backtrace(e)) + site_suffix() +
        (debugging() ? "\nFABRIC_DEBUG: LibTorch's whole message, with the C++ stack where it "
                       "threw:\n" +
                           std::string(e.what())
                     : std::string()));
    return 1;
  } catch (const std::exception& e) {
    write_to_terminal("error" + rank_suffix() + ": " + describe(e) + site_suffix());
    return 1;
  }
}

}  // namespace fabric
