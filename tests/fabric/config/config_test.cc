#include "fabric/config/config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace {

using fabric::Config;
using fabric::ConfigError;

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "config_test_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    schema_ = fabric::training_schema();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }

  // The ConfigError message of `fn`, or "" when it does not throw.
  template <typename Fn>
  std::string error_of(Fn fn) {
    try {
      fn();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }

  std::string load_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
    const std::string path = write("x.yaml", yaml);
    return error_of([&] { Config::load(path, overrides, schema_); });
  }

  fs::path dir_;
  fabric::ConfigSchema schema_;
};

TEST_F(ConfigTest, DefaultsFillEveryKey) {
  Config c = Config::defaults(schema_);
  EXPECT_EQ(c.get_string("fabric.precision"), "32-true");
  EXPECT_TRUE(c.get_devices("fabric.devices").is_auto);
  EXPECT_EQ(c.get_double("optimizer.lr"), 0.1);
  EXPECT_EQ(c.get_int("data.batch_size"), 128);
  EXPECT_EQ(c.get_double_list("optimizer.betas"), (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(c.origin("optimizer.lr"), "default");
}

// data.batch_size takes auto (KeySpec::or_auto): is_auto says so, and get_int refuses to guess.
TEST_F(ConfigTest, AnIntegerKeyThatTakesAutoSaysSo) {
  const Config c = Config::load(write("auto.yaml", "data:\n  batch_size: auto\n"), {}, schema_);
  EXPECT_TRUE(c.is_auto("data.batch_size"));
  EXPECT_THROW(c.get_int("data.batch_size"), fabric::Error);
  const Config given =
      Config::load(write("given.yaml", "data: {}\n"), {"data.batch_size=64"}, schema_);
  EXPECT_FALSE(given.is_auto("data.batch_size"));
  EXPECT_EQ(given.get_int("data.batch_size"), 64);
  EXPECT_EQ(schema_.find("data.batch_size")->type_name(), "an integer or auto");
}

TEST_F(ConfigTest, FileValuesCarryTheirLocation) {
  const std::string path = write("a.yaml", "fabric:\n  precision: bf16\noptimizer:\n  lr: 0.05\n");
  Config c = Config::load(path, {}, schema_);
  EXPECT_EQ(c.get_string("fabric.precision"), "bf16-mixed");  // alias resolved
  EXPECT_EQ(c.get_double("optimizer.lr"), 0.05);
  EXPECT_EQ(c.origin("optimizer.lr"), path + ":4:7");
  EXPECT_EQ(c.file(), path);
}

TEST_F(ConfigTest, BaseIsMergedUnderneathRecursively) {
  write("root.yaml", "data:\n  batch_size: 32\n  shuffle: false\noptimizer:\n  lr: 0.3\n");
  write("mid.yaml", "base: root.yaml\ndata:\n  batch_size: 64\n");
  const std::string top = write("top.yaml", "base: mid.yaml\noptimizer:\n  lr: 0.2\n");
  Config c = Config::load(top, {}, schema_);
  EXPECT_EQ(c.get_double("optimizer.lr"), 0.2);  // top wins
  EXPECT_EQ(c.get_int("data.batch_size"), 64);   // mid over root
  EXPECT_FALSE(c.get_bool("data.shuffle"));      // from root
  EXPECT_EQ(c.origin("data.shuffle"), (dir_ / "root.yaml").string() + ":3:12");
}

TEST_F(ConfigTest, BaseCycleIsAnError) {
  write("p.yaml", "base: q.yaml\n");
  const std::string q = write("q.yaml", "base: p.yaml\n");
  const std::string msg = error_of([&] { Config::load(q, {}, schema_); });
  EXPECT_NE(msg.find("base: cycle"), std::string::npos) << msg;
  EXPECT_NE(msg.find("q.yaml -> " + (dir_ / "p.yaml").string() + " -> " + q), std::string::npos)
      << msg;
}

TEST_F(ConfigTest, MissingBaseListsWhereItLooked) {
  const std::string msg = load_error("base: nothere.yaml\n");
  EXPECT_NE(msg.find(":1:7: base: config file 'nothere.yaml' not found"), std::string::npos) << msg;
  EXPECT_NE(msg.find((dir_ / "nothere.yaml").string()), std::string::npos) << msg;
}

TEST_F(ConfigTest, OverridesAreYamlValuesAndWin) {
  const std::string path = write("a.yaml", "optimizer:\n  lr: 0.05\n");
  Config c = Config::load(path, {"optimizer.lr=0.2", "data.batch_size=128", "fabric.devices=[0,1]"},
                          schema_);
  EXPECT_EQ(c.get_double("optimizer.lr"), 0.2);
  EXPECT_EQ(c.origin("optimizer.lr"), "command line");
  EXPECT_EQ(c.get_devices("fabric.devices").ids, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(c.get_text("fabric.devices"), "[0, 1]");
}

TEST_F(ConfigTest, SectionOverrideTakesAMapping) {
  Config c = Config::defaults(schema_, {"fabric.ddp={timeout_s: 5, static_graph: true}"});
  EXPECT_EQ(c.get_double("fabric.ddp.timeout_s"), 5.0);
  EXPECT_TRUE(c.get_bool("fabric.ddp.static_graph"));
}

// An empty file (a truncated copy, the wrong file) is not silently the defaults.
TEST_F(ConfigTest, EmptyConfigFileIsAnErrorNotTheDefaults) {
  const std::string want = (dir_ / "x.yaml").string() +
                           ": the config file is empty (no sections): give at least one section "
                           "such as 'fabric:', or leave out --config to run with the defaults";
  EXPECT_EQ(load_error(""), want);
  EXPECT_EQ(load_error("# only a comment\n\n"), want);
  write("empty_base.yaml", "");
  EXPECT_NE(load_error("base: empty_base.yaml\n").find("empty_base.yaml: the config file is empty"),
            std::string::npos);
  EXPECT_EQ(load_error("fabric: {}\n"), "");  // an empty section is a deliberate choice
}

TEST_F(ConfigTest, BadValuesNameFileLineColumnKeyAndFix) {
  EXPECT_EQ(load_error("fabric:\n  precision: 16-mixd\n"),
            (dir_ / "x.yaml").string() +
                ":2:14: fabric.precision: '16-mixd' is not a precision; did you mean '16-mixed'? "
                "(one of 32-true, 64-true, 16-mixed, bf16-mixed, 16-true, bf16-true, fp8-mixed)");
  EXPECT_EQ(load_error("data:\n  batch_size: abc\n"),
            (dir_ / "x.yaml").string() + ":2:15: data.batch_size: 'abc' is not an integer or auto");
  EXPECT_EQ(load_error("trainer:\n  max_epochs: auto\n"),
            (dir_ / "x.yaml").string() + ":2:15: trainer.max_epochs: 'auto' is not an integer");
  EXPECT_EQ(load_error("data:\n  batch_size: 0\n"),
            (dir_ / "x.yaml").string() + ":2:15: data.batch_size: 0 is out of range: must be >= 1");
  EXPECT_EQ(load_error("data:\n  batch_size: 1.5\n"),
            (dir_ / "x.yaml").string() + ":2:15: data.batch_size: '1.5' is not an integer or auto");
  EXPECT_EQ(load_error("optimizer:\n  momentum: 1.0\n"),
            (dir_ / "x.yaml").string() +
                ":2:13: optimizer.momentum: 1.0 is out of range: must be >= 0.0 and < 1.0");
  EXPECT_EQ(
      load_error("data:\n  shuffle: maybe\n"),
      (dir_ / "x.yaml").string() + ":2:12: data.shuffle: 'maybe' is not a boolean (true or false)");
  EXPECT_EQ(load_error("optimizer:\n  lr:\n"),
            (dir_ / "x.yaml").string() +
                ":2:3: optimizer.lr: no value given: write a value or delete the key");
}

TEST_F(ConfigTest, UnknownKeysAndSectionsSuggestTheNearestName) {
  EXPECT_EQ(load_error("fabric:\n  precison: 16\n"),
            (dir_ / "x.yaml").string() +
                ":2:3: unknown key 'fabric.precison'; did you mean 'fabric.precision'?");
  const std::string msg = load_error("fabirc:\n  precision: 16\n");
  EXPECT_EQ(msg.rfind((dir_ / "x.yaml").string() + ":1:1: unknown section 'fabirc'; did you mean "
                                                   "'fabric'? (sections: fabric, logging, ",
                      0),
            0u)
      << msg;
  EXPECT_EQ(load_error("data:\n  batch_size: 8\n  batch_size: 9\n"),
            (dir_ / "x.yaml").string() + ":3:3: data.batch_size: duplicate key");
  EXPECT_EQ(
      load_error("data: 5\n"),
      (dir_ / "x.yaml").string() + ":1:7: data: expected a mapping of keys under 'data:', got '5'");
}

TEST_F(ConfigTest, DeviceRequests) {
  EXPECT_EQ(Config::defaults(schema_, {"fabric.devices=-1"}).get_devices("fabric.devices").count,
            -1);
  EXPECT_EQ(Config::defaults(schema_, {"fabric.devices=2"}).get_devices("fabric.devices").count, 2);
  auto err = [&](const std::string& o) {
    return error_of([&] { Config::defaults(schema_, {o}); });
  };
  EXPECT_EQ(err("fabric.devices=[0,0]"),
            "command line: fabric.devices: device id 0 is listed twice");
  EXPECT_EQ(err("fabric.devices=0"),
            "command line: fabric.devices: '0' is not a device request: use auto, a count >= 1, -1 "
            "for all, or a list of device ids like [0, 1]");
  EXPECT_EQ(
      err("fabric.devices=[]"),
      "command line: fabric.devices: an empty device list selects nothing: use auto or list ids");
}

TEST_F(ConfigTest, OverrideErrorsSayCommandLine) {
  auto err = [&](const std::string& o) {
    return error_of([&] { Config::defaults(schema_, {o}); });
  };
  EXPECT_EQ(err("optimzer.lr=0.2"),
            "command line: unknown key 'optimzer.lr'; did you mean 'optimizer.lr'?");
  EXPECT_EQ(err("optimizer.lr=fast"), "command line: optimizer.lr: 'fast' is not a number");
  // An unquoted {run_dir} pattern is a YAML mapping: the error says to quote it.
  EXPECT_EQ(err("checkpoint.dir={run_dir}/ckpts"),
            "command line: checkpoint.dir: expected a string, got a mapping {run_dir: ~}; YAML "
            "reads a value that starts with '{' as a mapping: quote it, "
            "'\"{run_dir}/weights.pt\"' (in a shell: key='\"{run_dir}/...\"')");
  // A colon ending a value (a line of code as a prompt) makes a mapping too: quote the value.
  EXPECT_EQ(err("checkpoint.dir=def f(x):"),
            "command line: checkpoint.dir: expected a string, got a mapping {def f(x): ~}; YAML "
            "reads a colon followed by a space, or ending the value, as a mapping: quote the "
            "whole value, '\"def f(x):\"' (in a shell: key='\"def f(x):\"')");
  EXPECT_EQ(err("optimizer.lr=-1"),
            "command line: optimizer.lr: -1 is out of range: must be > 0.0");
  EXPECT_EQ(err("optimizer.lr=.inf"), "command line: optimizer.lr: .inf is not finite");
  EXPECT_EQ(err("trainer.limit_eval_batches=0"),
            "command line: trainer.limit_eval_batches: 0 is out of range: must be >= -1 and not 0");
  EXPECT_EQ(err("lr"),
            "command line: 'lr' is not an override: write key=value (e.g. optimizer.lr=0.2)");
  EXPECT_NE(err("optimizer.lr=[1,").find("command line: optimizer.lr: '[1,' is not a YAML value"),
            std::string::npos);
  // Bytes that are not UTF-8 (YAML read them as no value) and a ' #' YAML cut as a comment.
  EXPECT_EQ(err("checkpoint.dir=ab\xff\xfe"),
            "command line: checkpoint.dir: the value's byte 3 of 4 is not UTF-8: give the value "
            "as UTF-8 text");
  EXPECT_EQ(err("checkpoint.dir=runs # old"),
            "command line: checkpoint.dir: YAML reads ' #' in 'runs # old' as the start of a "
            "comment, which would drop the rest; quote the value: checkpoint.dir='\"runs # old\"'");
  const Config quoted =
      Config::defaults(schema_, {"checkpoint.dir=\"runs # old\"", "data.root=a#b"});
  EXPECT_EQ(quoted.get_string("checkpoint.dir"), "runs # old");
  EXPECT_EQ(quoted.get_string("data.root"), "a#b");
  EXPECT_NE(err("data.root=a#b #c").find("YAML reads ' #' in 'a#b #c' as the start of a comment"),
            std::string::npos);
}

TEST_F(ConfigTest, SyntaxErrorsPointAtTheLine) {
  const std::string msg = load_error("fabric:\n  precision: [16\n");
  EXPECT_EQ(msg.rfind((dir_ / "x.yaml").string() + ":3:1: YAML syntax error:", 0), 0u) << msg;
  EXPECT_EQ(load_error("- a\n- b\n"),
            (dir_ / "x.yaml").string() +
                ":1:1: a config must be a mapping of sections (fabric:, data:, ...), got [a, b]");
}

TEST_F(ConfigTest, MissingFileListsEveryPlaceTriedAndSuggestsANeighbour) {
  write("single_cpu.yaml", "{}\n");
  setenv("FABRIC_CONFIG_DIR", dir_.c_str(), 1);
  const std::string msg = error_of([&] { Config::load("singel_cpu.yaml", {}, schema_); });
  unsetenv("FABRIC_CONFIG_DIR");
  EXPECT_EQ(msg.rfind("--config: config file 'singel_cpu.yaml' not found; did you mean "
                      "'single_cpu.yaml'? (tried ",
                      0),
            0u)
      << msg;
  EXPECT_NE(msg.find((fs::current_path() / "singel_cpu.yaml").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find((dir_ / "singel_cpu.yaml").string()), std::string::npos) << msg;
  // A folder where the file was meant: said, with the YAML files it holds.
  EXPECT_EQ(error_of([&] { Config::load(dir_.string(), {}, schema_); }),
            "--config: config file '" + dir_.string() +
                "' is a folder; give a YAML file (it holds single_cpu.yaml)");
  EXPECT_EQ(error_of([&] { Config::load("/dev/zero", {}, schema_); }),
            "--config: config file '/dev/zero' is a character device, not a regular file; give a "
            "YAML file");
}

TEST_F(ConfigTest, FabricConfigDirIsSearched) {
  write("found_here.yaml", "data:\n  batch_size: 7\n");
  setenv("FABRIC_CONFIG_DIR", dir_.c_str(), 1);
  Config c = Config::load("found_here.yaml", {}, schema_);
  unsetenv("FABRIC_CONFIG_DIR");
  EXPECT_EQ(c.get_int("data.batch_size"), 7);
}

TEST_F(ConfigTest, HashIgnoresSpellingButNotValues) {
  const std::string a = write("a.yaml", "optimizer:\n  lr: 0.2\ndata:\n  batch_size: 64\n");
  const std::string b = write("b.yaml", "data: {batch_size: 64}\noptimizer: {lr: 2e-1}\n");
  write("base.yaml", "data:\n  batch_size: 64\n");
  const std::string c = write("c.yaml", "base: base.yaml\n");
  const std::string h = Config::load(a, {}, schema_).hash();
  EXPECT_EQ(h.size(), 16u);
  EXPECT_EQ(Config::load(b, {}, schema_).hash(), h);
  EXPECT_EQ(Config::load(c, {"optimizer.lr=0.2"}, schema_).hash(), h);
  EXPECT_NE(Config::load(a, {"optimizer.lr=0.21"}, schema_).hash(), h);
}

TEST_F(ConfigTest, ResolvedYamlReadsBackToTheSameConfig) {
  Config c = Config::defaults(
      schema_, {"fabric.devices=[1,3]", "optimizer.betas=[0.5, 0.9]", "fabric.precision=16"});
  Config again = Config::parse(c.to_yaml(), {}, schema_);
  EXPECT_EQ(again.hash(), c.hash());
  EXPECT_EQ(again.get_string("fabric.precision"), "16-mixed");
  EXPECT_NE(c.to_yaml().find("devices: [1, 3]"), std::string::npos) << c.to_yaml();
}

// Found by the config fuzzer: quoted input with line breaks or control bytes split the message.
TEST_F(ConfigTest, ErrorsStayOnOneLineWhateverTheInputHolds) {
  const std::string section = load_error("\"bad\\nsection\\x01\": 1\n");
  EXPECT_NE(section.find("unknown section 'bad\\nsection\\x01'"), std::string::npos) << section;
  const std::string value = load_error("optimizer:\n  lr: \"0.1\\n\\n\" \n");
  EXPECT_NE(value.find("'0.1\\n\\n' is not a number"), std::string::npos) << value;
  const std::string long_value = load_error("optimizer:\n  lr: " + std::string(200, 'x') + "\n");
  EXPECT_NE(long_value.find(std::string(80, 'x') + "...'"), std::string::npos) << long_value;
  for (const auto& m : {section, value, long_value})
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

TEST_F(ConfigTest, SchemaRejectsBadDeclarations) {
  fabric::ConfigSchema s;
  s.add("model.width", fabric::KeySpec::integer(8).min(1));
  EXPECT_THROW(s.add("model.width", fabric::KeySpec::integer(8)), fabric::Error);
  EXPECT_THROW(s.add("model.width.x", fabric::KeySpec::integer(8)), fabric::Error);
  EXPECT_THROW(s.add("model.depth", fabric::KeySpec::integer(0).min(1)), fabric::Error);
  EXPECT_THROW(s.add("nodot", fabric::KeySpec::integer(0)), fabric::Error);
  EXPECT_THROW(s.set_default("model.width", "0"), fabric::Error);
  s.set_default("model.width", "16");
  EXPECT_EQ(Config::defaults(s).get_int("model.width"), 16);
}

TEST_F(ConfigTest, TypedAccessToTheWrongTypeIsAProgrammingError) {
  Config c = Config::defaults(schema_);
  EXPECT_THROW(c.get_int("optimizer.lr"), fabric::Error);
  EXPECT_THROW(c.get_bool("no.such"), fabric::Error);
}

// --- command line --------------------------------------------------------------------------------

std::string command_line_error(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  try {
    fabric::parse_command_line(static_cast<int>(argv.size()), argv.data());
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(CommandLineTest, SplitsFlagsFromOverridesWithoutTouchingArgv) {
  std::vector<std::string> args = {"prog", "--config=a.yaml", "optimizer.lr=0.2", "--print_config",
                                   "data.batch_size=8"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  fabric::CommandLine cl = fabric::parse_command_line(static_cast<int>(argv.size()), argv.data());
  EXPECT_EQ(cl.config_file, "a.yaml");
  EXPECT_TRUE(cl.print_config);
  EXPECT_FALSE(cl.help);
  EXPECT_EQ(cl.overrides, (std::vector<std::string>{"optimizer.lr=0.2", "data.batch_size=8"}));
  EXPECT_STREQ(argv[1], "--config=a.yaml");  // unchanged: launchers re-execute argv

  std::vector<std::string> args2 = {"prog", "--config", "b.yaml", "--help"};
  std::vector<char*> argv2;
  for (auto& a : args2) argv2.push_back(a.data());
  cl = fabric::parse_command_line(static_cast<int>(argv2.size()), argv2.data());
  EXPECT_EQ(cl.config_file, "b.yaml");
  EXPECT_FALSE(cl.print_config);  // flags do not leak between calls
  EXPECT_TRUE(cl.help);
}

TEST(CommandLineTest, MistakesAreOneLineErrors) {
  EXPECT_EQ(command_line_error({"prog", "--confg=a.yaml"}),
            "command line: unknown flag '--confg'; did you mean '--config'? (see --help)");
  EXPECT_EQ(command_line_error({"prog", "--config"}),
            "command line: --config needs a value: --config=VALUE");
  EXPECT_EQ(command_line_error({"prog", "single_cpu.yaml"}),
            "command line: 'single_cpu.yaml' is not an override: write key=value (e.g. "
            "optimizer.lr=0.2)");
}

TEST(CommandLineTest, HelpListsKeysWithDefaults) {
  const std::string help = fabric::describe_schema(fabric::training_schema(), "prog");
  EXPECT_NE(help.find("fabric.precision [32-true] one of "
                      "32-true|64-true|16-mixed|bf16-mixed|16-true|bf16-true"),
            std::string::npos)
      << help;
  EXPECT_NE(help.find("optimizer.betas [[0.9, 0.999]]"), std::string::npos) << help;
}

}  // namespace

TEST_F(ConfigTest, ChoiceListsAcceptKnownItemsOnce) {
  EXPECT_EQ(Config::defaults(schema_).get_string_list("logging.loggers"),
            (std::vector<std::string>{"csv", "tensorboard"}));
  EXPECT_TRUE(
      Config::defaults(schema_, {"logging.loggers=[]"}).get_string_list("logging.loggers").empty());
  const std::string path = write("l.yaml", "logging:\n  loggers: [csvv]\n");
  EXPECT_EQ(error_of([&] { Config::load(path, {}, schema_); }),
            path +
                ":2:12: logging.loggers: 'csvv' is not a logger; did you mean 'csv'? (one of csv, "
                "tensorboard)");
  EXPECT_EQ(error_of([&] { Config::defaults(schema_, {"logging.loggers=[csv, csv]"}); }),
            "command line: logging.loggers: 'csv' is listed twice");
  EXPECT_EQ(error_of([&] { Config::defaults(schema_, {"logging.loggers=csv"}); }),
            "command line: logging.loggers: 'csv' is not a list: write it like [csv] (or [] for "
            "none)");
}

namespace {

// configs/README.md lists every key of training_schema() with its default in a YAML block; the
// block and the schema must say the same (a key added, renamed or re-defaulted on one side only
// fails here, naming it).
TEST(ConfigReadmeTest, TheReadmeKeyListIsTheSchema) {
  std::ifstream in("configs/README.md");
  ASSERT_TRUE(in) << "configs/README.md is not in the test's runfiles";
  std::string line, block;
  bool after_heading = false, inside = false;
  while (std::getline(in, line)) {
    if (line.rfind("## Keys and defaults", 0) == 0) after_heading = true;
    if (after_heading && !inside && line == "```yaml") {
      inside = true;
      continue;
    }
    if (inside && line == "```") break;
    if (inside) block += line + "\n";
  }
  ASSERT_FALSE(block.empty()) << "no ```yaml block after '## Keys and defaults'";
  const auto defaults = Config::defaults(fabric::training_schema()).to_yaml();
  const auto diff = fabric::config_differences(block, defaults);
  EXPECT_TRUE(diff.empty()) << "configs/README.md (left) vs training_schema() (right):\n  " << [&] {
    std::string all;
    for (const auto& d : diff) all += d + "\n  ";
    return all;
  }();
}

}  // namespace
