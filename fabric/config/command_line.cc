// Command line of Fabric programs: gflags flags, then key=value overrides (see
// fabric/config/config.h).
#include <gflags/gflags.h>

#include <sstream>

#include "fabric/config/config.h"
#include "fabric/core/suggest.h"

DEFINE_string(config, "",
              "config file (YAML); see fabric/config/config.h for where it is looked up");
DEFINE_bool(print_config, false, "print the resolved config and exit");

namespace fabric {
namespace {

[[noreturn]] void fail(const std::string& where, const std::string& message) {
  throw ConfigError(where + ": " + message);
}

// Whether `arg` ("--name=value", "-name", "--noname") names a flag known to gflags.
bool known_flag(const std::string& name, gflags::CommandLineFlagInfo* info) {
  if (gflags::GetCommandLineFlagInfo(name.c_str(), info)) return true;
  if (name.rfind("no", 0) == 0 && gflags::GetCommandLineFlagInfo(name.substr(2).c_str(), info))
    return info->type == "bool";
  return false;
}

}  // namespace

CommandLine parse_command_line(int argc, char** argv) {
  CommandLine cl;
  std::vector<std::string> args(argv + 1, argv + argc);
  std::vector<std::string> gflag_args = {argc > 0 ? argv[0] : "program"};
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);
  std::vector<std::string> names;
  for (const auto& f : all) names.push_back("--" + f.name);

  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {  // everything after is an override
      for (size_t j = i + 1; j < args.size(); ++j) cl.overrides.push_back(args[j]);
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      if (arg.find('=') == std::string::npos || arg.front() == '=') {
        fail("command line",
             "'" + arg + "' is not an override: write key=value (e.g. optimizer.lr=0.2)");
      }
      cl.overrides.push_back(arg);
      continue;
    }
    const std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    const std::string name = body.substr(0, body.find('='));
    if (name == "help" || name == "h" || name == "helpfull") {
      cl.help = true;
      continue;
    }
    gflags::CommandLineFlagInfo info;
    if (!known_flag(name, &info)) {
      fail("command line",
           "unknown flag '--" + name + "'" + did_you_mean("--" + name, names) + " (see --help)");
    }
    gflag_args.push_back(arg);
    if (body.find('=') == std::string::npos && info.type != "bool") {
      if (i + 1 >= args.size())
        fail("command line", "--" + name + " needs a value: --" + name + "=VALUE");
      gflag_args.push_back(args[++i]);
    }
  }

  // gflags parses a copy: the caller's argv stays intact (launchers re-execute it).
  std::vector<char*> ptrs;
  for (auto& s : gflag_args) ptrs.push_back(s.data());
  int n = static_cast<int>(ptrs.size());
  char** p = ptrs.data();
  FLAGS_config.clear();  // each call starts from the defaults
  FLAGS_print_config = false;
  gflags::ParseCommandLineNonHelpFlags(&n, &p, /*remove_flags=*/true);
  cl.config_file = FLAGS_config;
  cl.print_config = FLAGS_print_config;
  return cl;
}

std::string describe_schema(const ConfigSchema& schema, const std::string& program) {
  std::ostringstream out;
  out << "usage: " << program << " [--config=FILE] [--print_config] [key=value ...]\n\n"
      << "  --config=FILE    YAML config (absolute, relative to the working directory, or in "
         "configs/)\n"
      << "  --print_config   print the resolved config and exit\n"
      << "  key=value        override a config key (YAML value), e.g. optimizer.lr=0.2\n\n"
      << "Config keys (default in brackets):\n";
  std::string section;
  for (const auto& path : schema.paths()) {
    const std::string s = path.substr(0, path.find('.'));
    if (s != section) {
      section = s;
      out << "\n" << section << ":";
      const std::string doc = schema.section_documentation(section);
      if (!doc.empty()) out << "  " << doc;
      out << "\n";
    }
    const KeySpec& spec = *schema.find(path);
    out << "  " << path << " [" << spec.default_text() << "] " << spec.type_name();
    if (!spec.doc_text().empty()) out << ": " << spec.doc_text();
    out << "\n";
  }
  return out.str();
}

}  // namespace fabric
