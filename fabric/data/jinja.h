// fabric::jinja::Template: the part of Jinja2 that Hugging Face chat templates use, rendered as
// transformers' apply_chat_template renders them (its environment: trim_blocks, lstrip_blocks, loop
// controls, the {% generation %} block, tojson as Python's json.dumps, and the globals
// raise_exception, strftime_now, namespace, range and dict). //tests/fabric/data:jinja_test holds
// it to jinja2 itself on every construct below and on chat templates written in the styles of the
// Llama 3.1, Qwen2.5, Qwen3, Hermes, Mistral, Gemma, Phi-3 and DeepSeek families.
//
// Taken: text, {{ expr }}, {# comments #}, whitespace control ({%- -%} {{- -}} {%+ +%}), if/elif/
// else, for (loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem, an else
// branch, `for x in xs if cond`, `for k, v in ...`), break/continue, set (names, namespace
// attributes, {% set x %}...{% endset %}, the scoping of a set inside a loop), generation;
// literals (strings with Python's escapes, numbers, true/false/none, lists, dicts), attribute and
// item access, slices, calls with keyword arguments, + - * / // % ** ~, comparisons, in, and/or/
// not, `a if c else b`, filters and tests (their list: kFilters and kTests in jinja.cc), string
// and dict methods (strip, split, startswith, items, get, ...); macros (positional, keyword and
// default arguments, recursion). Not taken (an error naming the line): call and filter blocks,
// include/extends/import, raw.
// Strings are UTF-8 bytes: upper/lower/title change ASCII letters only; length counts code points.
//
//   fabric::jinja::Template t(source, "DIR/tokenizer_config.json: chat_template");
//   std::string text = t.render({{"messages", messages}, {"add_generation_prompt", true},
//                                {"bos_token", "<s>"}});
//
// Errors are fabric::Error: "ORIGIN: line N: problem" for a template this does not take (at
// construction) or one that fails while rendering (an undefined variable's attribute, a string
// added to a number); raise_exception(text) gives "ORIGIN: line N: the template raised: text".
#ifndef FABRIC_DATA_JINJA_H_
#define FABRIC_DATA_JINJA_H_

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace fabric::jinja {

class Template {
 public:
  Template(const std::string& source, std::string origin);
  ~Template();
  Template(const Template&) = delete;
  Template& operator=(const Template&) = delete;

  // The text `context`'s keys (an object) render to; objects keep their key order, as Python's
  // dicts do (tojson, `for k in d`).
  std::string render(const nlohmann::ordered_json& context) const;
  // Whether the template reads `name` anywhere (a variable, attribute or key of that name).
  bool mentions(const std::string& name) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fabric::jinja

#endif  // FABRIC_DATA_JINJA_H_
