// fabric::InstructDataset against the Python references (make_instruct.py): Alpaca lines give the
// ids `tokenizers` gives the whole rendered text and LitGPT's prompt mask; chat lines give the
// ids and assistant mask of transformers' apply_chat_template(return_assistant_tokens_mask=True)
// under ChatML; a text template whose prompt ends in a space gives the whole text's ids (the
// space joined to the response's first word) and the tokens holding a response character. Batches
// shift by one with -100 on prompt and padding; a chat template (the folder's or a FILE.jinja)
// gives apply_chat_template's ids and assistant mask; packing keeps every id once; bad lines are
// one error naming FILE:LINE and the field.
#include "fabric/data/instruct.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/data/bpe.h"
#include "fabric/data/chat_template.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;
using fabric::InstructDataset;

namespace {

class InstructTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::path(::testing::TempDir()) / "instruct";
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const char* python = std::getenv("PYTHON");
    const auto r = fabric::testing::run_command(std::string(python ? python : "python3") +
                                                " tests/fabric/data/make_instruct.py " +
                                                dir_.string() + " README.md");
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static InstructDataset::Options options(const std::string& tmpl) {
    InstructDataset::Options o;
    o.tokenizer_json = dir_ / "tokenizer.json";
    o.template_text = tmpl;
    o.block_size = 256;
    return o;
  }
  static nlohmann::json reference(const std::string& name) {
    std::ifstream in(dir_ / (name + ".ref.json"));
    return nlohmann::json::parse(in);
  }
  static std::string error_of(const std::string& lines, const std::string& tmpl = "alpaca") {
    std::ofstream(dir_ / "bad.jsonl") << lines;
    try {
      InstructDataset::open(dir_ / "bad.jsonl", options(tmpl));
    } catch (const fabric::Error& e) {
      return e.what();
    }
    return "(no error)";
  }
  static fs::path dir_;
};

fs::path InstructTest::dir_;

TEST_F(InstructTest, IdsAndMasksEqualThePythonReferences) {
  for (const auto& [name, tmpl] : {std::pair{"alpaca", "alpaca"}, std::pair{"chat", "chatml"},
                                   std::pair{"text", "Q: {prompt}\nA: {response}"}}) {
    SCOPED_TRACE(name);
    const auto data = InstructDataset::open(dir_ / (std::string(name) + ".jsonl"), options(tmpl));
    const nlohmann::json ref = reference(name);
    ASSERT_EQ(data->size(), static_cast<int64_t>(ref.size()));
    for (size_t i = 0; i < ref.size(); ++i) {
      const auto& e = data->examples()[i];
      EXPECT_EQ(e.ids, ref[i]["ids"].get<std::vector<int64_t>>()) << "example " << i;
      EXPECT_EQ(e.response, ref[i]["mask"].get<std::vector<bool>>()) << "example " << i;
    }
    EXPECT_EQ(data->truncated(), 0);
  }
}

TEST_F(InstructTest, BatchesShiftByOneAndMaskPromptsAndPadding) {
  const auto data = InstructDataset::open(dir_ / "alpaca.jsonl", options("alpaca"));
  const fabric::Batch b = data->get_batch({0, 1});
  const auto& e0 = data->examples()[0];
  const auto& e1 = data->examples()[1];
  const int64_t L = std::max(e0.ids.size(), e1.ids.size()) - 1;
  ASSERT_EQ(b.data.sizes(), (std::vector<int64_t>{2, L}));
  for (int64_t row = 0; row < 2; ++row) {
    const auto& e = row == 0 ? e0 : e1;
    for (int64_t k = 0; k < L; ++k) {
      const bool real = k + 1 < static_cast<int64_t>(e.ids.size());
      const int64_t want_target = real && e.response[k + 1] ? e.ids[k + 1] : -100;
      EXPECT_EQ(b.target[row][k].item<int64_t>(), want_target) << row << "," << k;
      if (real) {
        EXPECT_EQ(b.data[row][k].item<int64_t>(), e.ids[k]);
      }
    }
  }
  // Packing: windows of block_size + 1 over the examples in order, each id once.
  auto o = options("alpaca");
  o.block_size = 16;
  o.packed = true;
  const auto packed = InstructDataset::open(dir_ / "alpaca.jsonl", o);
  std::vector<int64_t> all;
  for (const auto& e : packed->examples()) all.insert(all.end(), e.ids.begin(), e.ids.end());
  ASSERT_EQ(packed->size(), (static_cast<int64_t>(all.size()) - 1) / 16);
  const fabric::Batch p = packed->get_batch({1});
  for (int64_t k = 0; k < 16; ++k) EXPECT_EQ(p.data[0][k].item<int64_t>(), all[16 + k]);
  // Truncation: block_size 48 cuts the longer examples to 49 ids and counts them.
  o.packed = false;
  o.block_size = 48;
  o.template_text = "chatml";
  const auto whole = InstructDataset::open(dir_ / "chat.jsonl", options("chatml"));
  const auto cut = InstructDataset::open(dir_ / "chat.jsonl", o);
  // An example whose cut leaves no response target is dropped (and counted), the rest kept in
  // order.
  int64_t longer = 0, dropped = 0;
  size_t kept = 0;
  for (size_t i = 0; i < whole->examples().size(); ++i) {
    const auto& e = whole->examples()[i];
    const size_t n = std::min<size_t>(49, e.ids.size());
    longer += e.ids.size() > 49;
    if (std::find(e.response.begin() + 1, e.response.begin() + n, true) == e.response.begin() + n) {
      ++dropped;
      continue;
    }
    ASSERT_LT(kept, cut->examples().size());
    EXPECT_EQ(cut->examples()[kept++].ids, std::vector<int64_t>(e.ids.begin(), e.ids.begin() + n));
  }
  EXPECT_EQ(kept, cut->examples().size());
  EXPECT_GT(longer, 0);
  EXPECT_GT(dropped, 0);
  EXPECT_EQ(cut->dropped(), dropped);
  EXPECT_EQ(cut->truncated(), longer);
}

// Options::cache_dir: the second open reads the cache and gives the same examples; an edited
// file or another template is tokenized again, never read from a stale cache; a damaged cache
// file is tokenized again too.
TEST_F(InstructTest, TheTokenCacheGivesTheSameExamplesAndNeverAStaleOne) {
  auto o = options("alpaca");
  o.cache_dir = dir_ / "cache";
  fs::copy_file(dir_ / "alpaca.jsonl", dir_ / "cached.jsonl", fs::copy_options::overwrite_existing);
  const auto first = InstructDataset::open(dir_ / "cached.jsonl", o);
  EXPECT_FALSE(first->from_cache());
  const auto again = InstructDataset::open(dir_ / "cached.jsonl", o);
  EXPECT_TRUE(again->from_cache());
  ASSERT_EQ(again->examples().size(), first->examples().size());
  for (size_t i = 0; i < first->examples().size(); ++i) {
    EXPECT_EQ(again->examples()[i].ids, first->examples()[i].ids);
    EXPECT_EQ(again->examples()[i].response, first->examples()[i].response);
  }
  auto chat = o;
  chat.template_text = "Q: {prompt}\nA: {response}";
  EXPECT_FALSE(InstructDataset::open(dir_ / "cached.jsonl", chat)->from_cache());
  std::ofstream(dir_ / "cached.jsonl", std::ios::app)
      << R"({"prompt": "one more", "response": "x"})"
      << "\n";
  const auto edited = InstructDataset::open(dir_ / "cached.jsonl", o);
  EXPECT_FALSE(edited->from_cache());
  EXPECT_EQ(edited->examples().size(), first->examples().size() + 1);
  for (const auto& e : fs::directory_iterator(dir_ / "cache"))
    std::ofstream(e.path(), std::ios::trunc) << "damaged";
  const auto damaged = InstructDataset::open(dir_ / "cached.jsonl", o);
  EXPECT_FALSE(damaged->from_cache());
  EXPECT_EQ(damaged->examples().size(), edited->examples().size());
  EXPECT_TRUE(damaged->cache_warning().empty());
  // A cache folder that cannot be made: the examples still come, with a warning.
  std::ofstream(dir_ / "not_a_folder") << "x";
  o.cache_dir = dir_ / "not_a_folder" / "cache";
  const auto unwritable = InstructDataset::open(dir_ / "cached.jsonl", o);
  EXPECT_EQ(unwritable->examples().size(), edited->examples().size());
  EXPECT_FALSE(unwritable->cache_warning().empty());
}

TEST_F(InstructTest, BadInputIsOneLineNamingFileLineAndField) {
  auto expect = [](const std::string& error, const std::vector<std::string>& words) {
    for (const auto& w : words) EXPECT_NE(error.find(w), std::string::npos) << w << " in " << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  };
  expect(error_of("{\"prompt\": \"a\", \"response\": \"b\"}\nnot json\n"),
         {"bad.jsonl:2: not JSON (column 2: syntax error while parsing value - invalid literal",
          "a line is {\"prompt\""});
  expect(error_of("[\"a\", \"b\"]\n"), {"bad.jsonl:1: a JSON array, not an object; a line is"});
  expect(error_of("{\"prompt\": \"a\"}\n"), {"bad.jsonl:1", "response: missing"});
  expect(error_of("{\"prompt\": 3, \"response\": \"b\"}\n"), {"bad.jsonl:1", "prompt", "not text"});
  expect(error_of("{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}\n", "chatml"),
         {"bad.jsonl:1", "messages[0].role", "'bot'"});
  expect(error_of("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n", "chatml"),
         {"bad.jsonl:1", "no assistant message"});
  expect(error_of("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n"),
         {"bad.jsonl:1", "chatml"});
  expect(error_of("{\"prompt\": \"a\", \"response\": \"b\"}\n", "Q: {prompt} A:"),
         {"no {response}"});
  // Two examples on one line: which one would be trained on is not for the reader to guess.
  expect(error_of("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": "
                  "\"assistant\", \"content\": \"y\"}], \"prompt\": \"a\", \"response\": \"b\"}\n",
                  "chatml"),
         {"bad.jsonl:1: messages and prompt on one line"});
  // Placeholders that would silently drop the prompt or train on it: an unclosed or misspelt
  // {prompt}, a prompt after {response}, a second {response}.
  const std::string ab = "{\"prompt\": \"a\", \"response\": \"b\"}\n";
  expect(error_of(ab, "Q: {prompt A: {response}"), {"no {prompt} in it", "left out"});
  expect(error_of(ab, "Q: {promt} A: {response}"), {"{promt} is not a placeholder"});
  expect(error_of(ab, "Q: {prompt} {Input1} A: {response}"), {"{Input1} is not a placeholder"});
  expect(error_of(ab, "A: {response} Q: {prompt}"),
         {"{prompt} after {response} would be trained on", "put it before {response}"});
  expect(error_of(ab, "Q: {prompt} A: {response} ({response})"), {"{response} twice"});
  // Literal braces that are not a {name} stay text.
  EXPECT_EQ(error_of(ab, "{\"q\": {prompt}} {} A: {response}"), "(no error)");
  expect(error_of(""), {"no examples"});
  // Responses that fall beyond the window: no target would count.
  auto o = options("alpaca");
  o.block_size = 4;
  o.append_eos = false;
  std::ofstream(dir_ / "long.jsonl")
      << "{\"prompt\": \"a long prompt here\", \"response\": \"b\"}\n";
  try {
    InstructDataset::open(dir_ / "long.jsonl", o);
    ADD_FAILURE() << "no error";
  } catch (const fabric::Error& e) {
    expect(e.what(), {"long.jsonl", "no example has a response token", "block_size 4"});
  }
}

// A field's own text is never searched for placeholders (a prompt about "{input}" stays as
// written); keys no template reads are named, each with its first line.
TEST_F(InstructTest, FieldsAreFilledInOnePassAndUnreadKeysAreNamed) {
  const auto parts = fabric::render_instruct_example(
      R"({"prompt": "what does f({input}) do with {prompt}?", "input": "ctx", "response": "x"})",
      "Q: {prompt}\nC: {input}\nA: {response}", "line");
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].first, "Q: what does f({input}) do with {prompt}?\nC: ctx\nA: ");
  std::ofstream(dir_ / "extra.jsonl") << R"({"prompt": "a", "response": "b", "id": 1})"
                                      << "\n"
                                      << R"({"prompt": "a", "respones": "b", "response": "c"})"
                                      << "\n";
  const auto data = InstructDataset::open(dir_ / "extra.jsonl", options("alpaca"));
  EXPECT_EQ(data->examples().size(), 2u);
  EXPECT_EQ(data->unread_fields(), "'id' (" + (dir_ / "extra.jsonl").string() +
                                       ":1), 'respones' (" + (dir_ / "extra.jsonl").string() +
                                       ":2)");
}

// chatml on a tokenizer without its two markers as tokens would train on them spelled out.
TEST_F(InstructTest, ChatmlNeedsItsMarkersAsTokens) {
  std::ifstream in(dir_ / "tokenizer.json");
  nlohmann::json t = nlohmann::json::parse(in);
  nlohmann::json kept = nlohmann::json::array();
  for (const auto& a : t["added_tokens"])
    if (a["content"] != "<|im_start|>") kept.push_back(a);
  ASSERT_LT(kept.size(), t["added_tokens"].size());
  t["added_tokens"] = kept;
  std::ofstream(dir_ / "no_markers.json") << t.dump();
  auto o = options("chatml");
  o.tokenizer_json = dir_ / "no_markers.json";
  try {
    InstructDataset::open(dir_ / "chat.jsonl", o);
    ADD_FAILURE() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_NE(std::string(e.what()).find("template chatml: " + o.tokenizer_json.string() +
                                         " has no <|im_start|> token (it would be trained on "
                                         "spelled out, in "),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(InstructDataset::open(dir_ / "chat.jsonl", options("chatml"))->examples().empty(),
            false);
}

// data.template chat_template: the folder's own template (no {% generation %} blocks) gives the
// ids and assistant mask transformers' apply_chat_template gives with them: the assistant's
// content and <|eot_id|>, the template's bos once (add_bos does not add a second), no eos after
// the eos the template ends with. A FILE.jinja (the template with the blocks) gives the same.
TEST_F(InstructTest, ChatTemplateGivesApplyChatTemplatesIdsAndAssistantMask) {
  const fs::path chat = dir_ / "chat";
  std::ifstream in(chat / "chat.ref.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  for (const std::string& tmpl :
       {std::string("chat_template"), (chat / "chat_generation.jinja").string()}) {
    SCOPED_TRACE(tmpl);
    auto o = options(tmpl);
    o.tokenizer_json = chat / "tokenizer.json";
    o.add_bos = true;
    const auto data = InstructDataset::open(chat / "chat.jsonl", o);
    ASSERT_EQ(data->size(), static_cast<int64_t>(ref.size()));
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_EQ(data->examples()[i].ids, ref[i]["ids"].get<std::vector<int64_t>>()) << i;
      EXPECT_EQ(data->examples()[i].response, ref[i]["mask"].get<std::vector<bool>>()) << i;
    }
  }
  std::ifstream prompt_in(chat / "prompt.ref.json");
  const auto t = fabric::ChatTemplate::open("chat_template", chat);
  EXPECT_EQ(
      t->render(nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi"}])"), true),
      nlohmann::json::parse(prompt_in)["text"].get<std::string>());
}

TEST_F(InstructTest, ChatTemplatesThatCannotMarkTheAnswerAreRefused) {
  // No template in the folder: where it looked, and what to use instead.
  EXPECT_EQ(error_of("{\"prompt\": \"a\", \"response\": \"b\"}\n", "chat_template"),
            dir_.string() +
                " has no chat template (no chat_template.jinja, and tokenizer_config.json has "
                "no chat_template): set data.template to chatml, alpaca, a TEXT template or a "
                "FILE.jinja of the format");
  // The turns before an answer written otherwise once it follows (the last one marked).
  std::ofstream(dir_ / "last.jinja")
      << "{% for m in messages %}{% if loop.last %}[final] {% endif %}"
         "{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: "
         "{% endif %}";
  const std::string line = "{\"prompt\": \"a\", \"response\": \"b\"}\n";
  EXPECT_NE(error_of(line, (dir_ / "last.jinja").string())
                .find(":1: " + (dir_ / "last.jinja").string() +
                      ": messages[1] (an assistant's): the template writes it otherwise than "
                      "its generation prompt begins it"),
            std::string::npos)
      << error_of(line, (dir_ / "last.jinja").string());
  // The template's own refusal, with the example's line and the template's.
  std::ofstream(dir_ / "raises.jinja")
      << "{% for m in messages %}\n{% if m.role == 'system' %}\n"
         "{{ raise_exception('System role not supported') }}\n{% endif %}\n"
         "{{ m.content }}{% endfor %}";
  EXPECT_EQ(error_of("{\"prompt\": \"a\", \"response\": \"b\"}\n"
                     "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, "
                     "{\"role\": \"assistant\", \"content\": \"b\"}]}\n",
                     (dir_ / "raises.jinja").string()),
            (dir_ / "bad.jsonl").string() + ":2: " + (dir_ / "raises.jinja").string() +
                ": line 3: the template raised: System role not supported");
}

// Templates whose turns do not simply follow one another: an end written only last (Phi-3's eos
// after the conversation), a generation prompt the answer does not repeat (DeepSeek's
// "<think>\n"). The answer is what the conversation with it shares with the whole one, after
// what it shares with the prompt; eos is appended only after a last answer without one.
TEST_F(InstructTest, ChatTemplateAnswersEndWhereTheConversationGoesOn) {
  const fs::path chat = dir_ / "chat";
  const std::string head =
      "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>";
  std::ofstream(chat / "phi.jinja")
      << head << "{{ m.content }}<|end_header_id|>{% endfor %}{% if add_generation_prompt %}"
      << "<|start_header_id|>assistant<|end_header_id|>{% else %}{{ eos_token }}{% endif %}";
  std::ofstream(chat / "think.jinja")
      << head << "{{ m.content }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
      << "<|start_header_id|>assistant<|end_header_id|><think>{% endif %}";
  const auto messages = nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
          {"role": "user", "content": "c"}, {"role": "assistant", "content": "d",
           "tool_calls": null}])");
  using Parts = std::vector<std::pair<std::string, bool>>;
  const std::string u = "<|start_header_id|>user<|end_header_id|>";
  const std::string a = "<|start_header_id|>assistant<|end_header_id|>";
  const fabric::BpeTokenizer t = fabric::BpeTokenizer::from_tokenizer_json(chat / "tokenizer.json");
  const auto tokens = fabric::token_start_of(t);
  EXPECT_EQ(fabric::ChatTemplate::open((chat / "phi.jinja").string(), chat)
                ->segments(messages, "L", tokens),
            (Parts{{u + "a<|end_header_id|>" + a, false},
                   {"b<|end_header_id|>", true},
                   {u + "c<|end_header_id|>" + a, false},
                   {"d<|end_header_id|><|eot_id|>", true}}));
  EXPECT_EQ(fabric::ChatTemplate::open((chat / "think.jinja").string(), chat)
                ->segments(messages, "L", tokens),
            (Parts{{u + "a<|eot_id|>" + a, false},
                   {"b<|eot_id|>", true},
                   {u + "c<|eot_id|>" + a, false},
                   {"d<|eot_id|>", true}}));
  // Text a template writes before an assistant's turn only once it follows (leaked
  // whitespace): the prompt's.
  std::ofstream(chat / "leak.jinja")
      << "{% for m in messages %}{% if m.role == 'assistant' %}{{ '\\n' }}{% endif %}"
      << "<|start_header_id|>{{ m.role }}<|end_header_id|>{{ m.content }}<|eot_id|>{% endfor %}"
      << "{% if add_generation_prompt %}" << a << "{% endif %}";
  EXPECT_EQ(fabric::ChatTemplate::open((chat / "leak.jinja").string(), chat)
                ->segments(messages, "L", tokens),
            (Parts{{u + "a<|eot_id|>\n" + a, false},
                   {"b<|eot_id|>", true},
                   {u + "c<|eot_id|>\n" + a, false},
                   {"d<|eot_id|>", true}}));
  // eos: not after the phi template's own, once after a conversation that holds none, never
  // after a user's last turn.
  std::ofstream(chat / "plain.jinja") << head << "{{ m.content }}\n{% endfor %}"
                                      << "{% if add_generation_prompt %}" << a << "{% endif %}";
  std::ofstream(chat / "lines.jsonl")
      << messages.dump().insert(0, "{\"messages\": ") << "}\n"
      << R"({"messages": [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]})"
      << "\n";
  auto o = options((chat / "plain.jinja").string());
  o.tokenizer_json = chat / "tokenizer.json";
  const auto data = InstructDataset::open(chat / "lines.jsonl", o);
  ASSERT_EQ(data->size(), 2);
  EXPECT_EQ(data->examples()[0].ids.back(), t.eot());
  EXPECT_TRUE(data->examples()[0].response.back());
  EXPECT_EQ(t.decode(data->examples()[1].ids).substr(t.decode(data->examples()[1].ids).size() - 2),
            "y\n");
  o.template_text = (chat / "phi.jinja").string();
  const auto phi = InstructDataset::open(chat / "lines.jsonl", o);
  EXPECT_EQ(std::count(phi->examples()[0].ids.begin(), phi->examples()[0].ids.end(), t.eot()), 1);
}

TEST_F(InstructTest, ChatTemplatesThatWriteNoAnswerAreRefused) {
  std::ofstream(dir_ / "silent.jinja")
      << "{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}\n{% endif %}"
         "{% endfor %}{% if add_generation_prompt %}A: {% endif %}";
  const std::string got =
      error_of("{\"prompt\": \"a\", \"response\": \"b\"}\n", (dir_ / "silent.jinja").string());
  EXPECT_NE(got.find(":1: " + (dir_ / "silent.jinja").string() +
                     ": messages[1] (an assistant's) renders to nothing after the generation "
                     "prompt"),
            std::string::npos)
      << got;
  // A folder where the template file should be.
  fs::create_directories(dir_ / "folder.jinja");
  EXPECT_NE(
      error_of("{\"prompt\": \"a\", \"response\": \"b\"}\n", (dir_ / "folder.jinja").string())
          .find((dir_ / "folder.jinja").string() + ": is a folder; give a chat template file"),
      std::string::npos);
}

}  // namespace
