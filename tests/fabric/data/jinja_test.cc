// fabric::jinja::Template against jinja2 itself: jinja_cases.py renders each case in
// transformers' chat-template environment; every one must render to the same text here, and every
// case jinja2 refuses must be refused here with an error naming the template and its line.
#include "fabric/data/jinja.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "fabric/core/error.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

nlohmann::ordered_json cases() {
  const fs::path dir = fs::path(::testing::TempDir()) / "jinja";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const char* python = std::getenv("PYTHON");
  const auto r = fabric::testing::run_command(std::string(python ? python : "python3") +
                                              " tests/fabric/data/jinja_cases.py " + dir.string());
  EXPECT_EQ(r.code, 0) << r.out;
  std::ifstream in(dir / "jinja_cases.json");
  return nlohmann::ordered_json::parse(in);
}

TEST(JinjaTest, EveryCaseRendersAsJinja2RendersIt) {
  const nlohmann::ordered_json all = cases();
  ASSERT_GT(all.size(), 250u);
  int rendered = 0;
  for (const auto& c : all) {
    if (c.contains("error")) continue;
    const std::string name = c["name"].get<std::string>();
    try {
      fabric::jinja::Template t(c["template"].get<std::string>(), name);
      EXPECT_EQ(t.render(c["context"]), c["expected"].get<std::string>()) << name;
      ++rendered;
    } catch (const fabric::Error& e) {
      ADD_FAILURE() << name << ": " << e.what();
    }
  }
  EXPECT_GT(rendered, 230);
}

TEST(JinjaTest, WhatJinja2RefusesIsRefusedNamingTheLine) {
  int refused = 0;
  for (const auto& c : cases()) {
    if (!c.contains("error")) continue;
    const std::string name = c["name"].get<std::string>();
    try {
      fabric::jinja::Template t(c["template"].get<std::string>(), name);
      const std::string out = t.render(c["context"]);
      ADD_FAILURE() << name << ": rendered '" << out << "'; jinja2 says "
                    << c["error"].get<std::string>();
    } catch (const fabric::Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind(name + ": line ", 0), 0u) << what;
      ++refused;
    }
  }
  EXPECT_GE(refused, 25);
}

TEST(JinjaTest, RaiseExceptionCarriesTheTemplatesMessage) {
  fabric::jinja::Template t(
      "{% for m in messages %}\n{% if m.role == 'system' %}\n"
      "{{ raise_exception('System role not supported') }}\n{% endif %}\n{% endfor %}",
      "DIR/tokenizer_config.json: chat_template");
  try {
    t.render({{"messages", {{{"role", "system"}, {"content", "x"}}}}});
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(e.what(),
                 "DIR/tokenizer_config.json: chat_template: line 3: the template raised: System "
                 "role not supported");
  }
}

TEST(JinjaTest, TagsItDoesNotTakeAreRefusedWhenRead) {
  for (const std::string& src : {"{% call f() %}x{% endcall %}", "{% include 'a' %}",
                                 "{% raw %}x{% endraw %}", "{% filter upper %}x{% endfilter %}"}) {
    try {
      fabric::jinja::Template t(src, "T");
      ADD_FAILURE() << src << ": no error";
    } catch (const fabric::Error& e) {
      EXPECT_NE(std::string(e.what()).find("T: line 1: {% "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("is not supported"), std::string::npos) << e.what();
    }
  }
}

// What Python computes with unbounded integers and stack, and jinja2 refuses with a
// RecursionError, is a one-line error here, never a crash, a hang or a wrong number.
TEST(JinjaTest, LimitsAreOneLineErrorsNotCrashesOrWrongNumbers) {
  auto error_of = [](const std::string& src, const nlohmann::ordered_json& context) {
    try {
      fabric::jinja::Template t(src, "T");
      return "rendered '" + t.render(context) + "'";
    } catch (const fabric::Error& e) {
      return std::string(e.what());
    }
  };
  std::string parens(5000, '('), ifs;
  for (int k = 0; k < 30000; ++k) ifs += "{% if true %}";
  std::string deep = "1";
  for (int k = 0; k < 150; ++k) deep = "[" + deep + "]";
  const struct {
    std::string src, context, says;
  } cases[] = {
      {"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "{}",
       "T: line 1: macro 'f' called 100 deep"},
      {"{{ " + parens + "1" + std::string(5000, ')') + " }}", "{}",
       "T: line 1: nested more than 200 deep"},
      {ifs, "{}", "T: line 1: nested more than 200 deep"},
      {"{{ 1 + -" + std::string(3000, '-') + "1 }}", "{}", "T: line 1: nested more than 200 deep"},
      {"{{ (-9223372036854775807 - 1) // -1 }}", "{}", "T: line 1: integer overflow"},
      {"{{ 2 ** 70 }}", "{}", "T: line 1: integer overflow"},
      {"{{ 4611686018427387904 * 4 }}", "{}", "T: line 1: integer overflow"},
      {"{{ 'ab' * 10**12 }}", "{}", "T: line 1: a repeated str of more than 2^27 items"},
      {"{{ 99999999999999999999 }}", "{}",
       "T: line 1: the integer 99999999999999999999 is past 64 bits"},
      {"{{ x }}", R"({"x": 18446744073709551615})",
       "T: x: the integer 18446744073709551615 is past 64 bits"},
      {"{{ x }}", "{\"x\": " + deep + "}", "T: x: a value nested more than 100 deep"},
      {"a\n\xff{{ 1 }}", "{}", "T: line 2: not UTF-8 text (byte 2)"},
      {"{{ 'a\\U00110000' }}", "{}", "T: line 1: a string's \\U escape is not a character"},
  };
  for (const auto& c : cases)
    EXPECT_EQ(error_of(c.src, nlohmann::ordered_json::parse(c.context)).rfind(c.says, 0), 0u)
        << c.says << "\n"
        << error_of(c.src, nlohmann::ordered_json::parse(c.context)).substr(0, 300);
  // What fits is computed exactly, and fast: 1 ** (10 ** 13) takes 44 squarings.
  EXPECT_EQ(
      error_of("{{ 1 ** 10000000000000 }} {{ 3 ** 39 }} {{ (-9223372036854775807 - 1) % -1 }}",
               nlohmann::ordered_json::object()),
      "rendered '1 4052555153018976267 0'");
}

}  // namespace
