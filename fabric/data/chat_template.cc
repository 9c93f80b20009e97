#include "fabric/data/chat_template.h"

#include <ctime>
#include <fstream>
#include <iterator>

#include "fabric/core/error.h"
#include "fabric/data/jinja.h"

namespace fabric {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

// The file's bytes into `out`; false when there is no such file. A folder is an error.
bool read_text(const fs::path& path, std::string& out, const std::string& what) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw Error(path.string() + ": is a folder; give " + what);
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in), {});
  return true;
}

// The length of the longest common prefix of a and b.
size_t common_prefix(const std::string& a, const std::string& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// A message as apply_chat_template hands it to the template: keys whose value is null left out
// (an OpenAI-style "content": null), and the reasoning under "reasoning_content" and "thinking"
// when any of "reasoning_content", "thinking", "reasoning" holds it.
ojson template_message(const ojson& m) {
  if (!m.is_object()) return m;
  ojson kept = ojson::object();
  for (const auto& item : m.items())
    if (!item.value().is_null()) kept[item.key()] = item.value();
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    if (!kept.contains(key)) continue;
    const ojson reasoning = kept[key];
    ojson out = ojson::object();
    out["thinking"] = reasoning;
    for (const auto& item : kept.items()) out[item.key()] = item.value();
    out["reasoning_content"] = reasoning;
    return out;
  }
  return kept;
}

const char kInsteadOfMissing[] =
    "set data.template to chatml, alpaca, a TEXT template or a FILE.jinja of the format";

}  // namespace

bool ChatTemplate::named_by(const std::string& template_text) {
  return template_text == "chat_template" ||
         (template_text.size() > 6 &&
          template_text.compare(template_text.size() - 6, 6, ".jinja") == 0);
}

std::shared_ptr<const ChatTemplate> ChatTemplate::open(const std::string& template_text,
                                                       const fs::path& folder,
                                                       const std::string& instead) {
  std::shared_ptr<ChatTemplate> t(new ChatTemplate());
  const std::string advice = instead.empty() ? kInsteadOfMissing : instead;
  const fs::path config_path = folder / "tokenizer_config.json";
  ojson config = ojson::object();
  std::string text;
  if (read_text(config_path, text, "the tokenizer's JSON configuration")) {
    try {
      config = ojson::parse(text);
    } catch (const ojson::exception& e) {
      throw Error(config_path.string() + ": not JSON (" + one_line(e.what(), 80) +
                  "); fix or remove the file");
    }
    if (!config.is_object()) config = ojson::object();
  }
  const std::string jinja_file = "a chat template file (Jinja text, as chat_template.jinja)";
  if (template_text != "chat_template") {
    if (!read_text(template_text, t->source_, jinja_file))
      throw Error(template_text + ": cannot read this chat template file (a Jinja text, as " +
                  "Hugging Face's chat_template.jinja)");
    t->origin_ = template_text;
  } else if (read_text(folder / "chat_template.jinja", t->source_, jinja_file)) {
    t->origin_ = (folder / "chat_template.jinja").string();
  } else if (config.contains("chat_template")) {
    t->origin_ = config_path.string() + ": chat_template";
    const ojson& c = config["chat_template"];
    if (c.is_string()) {
      t->source_ = c.get<std::string>();
    } else if (c.is_array()) {  // named templates: transformers uses "default"
      std::string names;
      bool found = false;
      for (const ojson& entry : c) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string())
          throw Error(t->origin_ + ": not a list of {\"name\", \"template\"}; fix the file");
        if (entry["name"] == "default") {
          t->source_ = entry["template"].get<std::string>();
          found = true;
        }
        names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
      }
      if (!found)
        throw Error(t->origin_ + ": no template named \"default\" among " +
                    (names.empty() ? std::string("none (an empty list)") : names) +
                    "; write the one to use to a FILE.jinja and give its path");
    } else {
      throw Error(t->origin_ + ": neither a text nor a list of named templates; fix the file");
    }
  } else {
    throw Error(folder.string() + " has no chat template (no chat_template.jinja, and " +
                (fs::exists(config_path) ? "tokenizer_config.json has no chat_template"
                                         : "no tokenizer_config.json") +
                "): " + advice);
  }
  t->template_ = std::make_unique<jinja::Template>(t->source_, t->origin_);
  // The special tokens: tokenizer_config.json's, else special_tokens_map.json's (transformers
  // reads both).
  ojson map = ojson::object();
  if (read_text(folder / "special_tokens_map.json", text, "the special tokens' JSON map")) {
    map = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!map.is_object()) map = ojson::object();
  }
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                          "cls_token", "mask_token"}) {
    const ojson& v = config.contains(key) ? config[key] : map.contains(key) ? map[key] : ojson();
    if (v.is_string())
      t->variables_[key] = v;
    else if (v.is_object() && v.contains("content") && v["content"].is_string())
      t->variables_[key] = v["content"];
  }
  t->variables_["tools"] = nullptr;  // as apply_chat_template passes them when not given
  t->variables_["documents"] = nullptr;
  return t;
}

ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const ojson& messages, bool add_generation_prompt) const {
  ojson context = variables_;
  ojson list = ojson::array();
  for (const ojson& m : messages) list.push_back(template_message(m));
  context["messages"] = std::move(list);
  context["add_generation_prompt"] = add_generation_prompt;
  return template_->render(context);
}

std::vector<std::pair<std::string, bool>> ChatTemplate::segments(
    const ojson& messages, const std::string& where, const TokenStart& token_start) const {
  std::vector<std::pair<std::string, bool>> out;
  auto render_at = [&](size_t n, bool prompt) {
    try {
      ojson head = ojson::array();
      for (size_t i = 0; i < n; ++i) head.push_back(messages[i]);
      return render(head, prompt);
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
  };
  const std::string whole = render_at(messages.size(), false);
  size_t done = 0;  // bytes of `whole` in `out`
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object() || messages[i].value("role", "") != "assistant") continue;
    const std::string past = render_at(i, false), before = render_at(i, true),
                      with = render_at(i + 1, false);
    // The answer starts where the conversation with it leaves the one that asks for it (a
    // generation prompt the answer does not repeat, such as "<think>\n", stays out) and ends
    // where the whole conversation leaves it (an end the template writes only last, such as
    // Phi-3's eos, stays out); where they part inside a token ("<|" of two markers), at that
    // token's start.
    // The generation prompt starts where the conversation without it ends; the answer must begin
    // as it does (else the template writes this turn otherwise, and its header would be learned).
    const size_t prompt = common_prefix(past, before);
    size_t begin = common_prefix(before, with), end = common_prefix(with, whole);
    if (begin < before.size()) {
      // Text the template writes before a turn only once the turn follows (indentation a
      // template leaks): the answer starts after the whole generation prompt, where `with` has
      // it; else, at the token where the two part.
      const std::string gen = before.substr(prompt);
      const size_t found =
          gen.empty() || begin < prompt ? std::string::npos : with.find(gen, prompt);
      if (found != std::string::npos)
        begin = found + gen.size();
      else if (token_start)
        begin = token_start(with, begin);
    }
    if (token_start && end < with.size()) end = token_start(with, end);
    const std::string at = where + ": " + origin_ + ": messages[" + std::to_string(i) + "]";
    const std::string otherwise =
        at + " (an assistant's): the template writes it otherwise than its generation prompt " +
        "begins it, or writes the messages before it otherwise once it follows, so its answer " +
        "cannot be told from the prompt (templates that drop earlier turns' reasoning do this); " +
        kInsteadOfMissing;
    if (begin < done) throw Error(otherwise);
    if (end <= begin)
      throw Error(at + " (an assistant's) renders to nothing after the generation prompt (the " +
                  "template leaves it out, or renders it otherwise once later messages " +
                  "follow): there is no answer to train on; " + kInsteadOfMissing);
    if (prompt < before.size() && begin <= prompt) throw Error(otherwise);
    out.emplace_back(whole.substr(done, begin - done), false);
    out.emplace_back(whole.substr(begin, end - begin), true);
    done = end;
  }
  if (done < whole.size()) out.emplace_back(whole.substr(done), false);
  return out;
}

std::string ChatTemplate::key() const {
  std::string k = source_ + '\0' + variables_.dump();
  if (template_->mentions("strftime_now")) {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char day[16];
    k += std::string(day, std::strftime(day, sizeof day, "%Y-%m-%d", &tm));
  }
  return k;
}

}  // namespace fabric
