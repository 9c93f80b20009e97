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

bool read_text(const fs::path& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in), {});
  return true;
}

const char kInstead[] =
    "set data.template to chatml, alpaca, a TEXT template or a FILE.jinja of the format";

}  // namespace

bool ChatTemplate::named_by(const std::string& template_text) {
  return template_text == "chat_template" ||
         (template_text.size() > 6 &&
          template_text.compare(template_text.size() - 6, 6, ".jinja") == 0);
}

std::shared_ptr<const ChatTemplate> ChatTemplate::open(const std::string& template_text,
                                                       const fs::path& folder) {
  std::shared_ptr<ChatTemplate> t(new ChatTemplate());
  const fs::path config_path = folder / "tokenizer_config.json";
  ojson config = ojson::object();
  std::string text;
  if (read_text(config_path, text)) {
    try {
      config = ojson::parse(text);
    } catch (const ojson::exception& e) {
      throw Error(config_path.string() + ": not JSON (" + one_line(e.what(), 80) +
                  "); fix or remove the file");
    }
    if (!config.is_object()) config = ojson::object();
  }
  if (template_text != "chat_template") {
    if (!read_text(template_text, t->source_))
      throw Error(template_text + ": cannot read this chat template file (a Jinja text, as " +
                  "Hugging Face's chat_template.jinja)");
    t->origin_ = template_text;
  } else if (read_text(folder / "chat_template.jinja", t->source_)) {
    t->origin_ = (folder / "chat_template.jinja").string();
  } else if (config.contains("chat_template")) {
    t->origin_ = config_path.string() + ": chat_template";
    const ojson& c = config["chat_template"];
    if (c.is_string()) {
      t->source_ = c.get<std::string>();
    } else if (c.is_array()) {  // named templates: transformers uses "default"
      std::string names;
      for (const ojson& entry : c) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string())
          throw Error(t->origin_ + ": not a list of {\"name\", \"template\"}; fix the file");
        if (entry["name"] == "default") t->source_ = entry["template"].get<std::string>();
        names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
      }
      if (t->source_.empty())
        throw Error(t->origin_ + ": no template named \"default\" among " + names +
                    "; write the one to train with to a FILE.jinja and set data.template to it");
    } else {
      throw Error(t->origin_ + ": neither a text nor a list of named templates; fix the file");
    }
  } else {
    throw Error(folder.string() + " has no chat template (no chat_template.jinja, and " +
                (fs::exists(config_path) ? "tokenizer_config.json has no chat_template"
                                         : "no tokenizer_config.json") +
                "): " + kInstead);
  }
  t->template_ = std::make_unique<jinja::Template>(t->source_, t->origin_);
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                          "cls_token", "mask_token"}) {
    if (!config.contains(key)) continue;
    const ojson& v = config[key];
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
  context["messages"] = messages;
  context["add_generation_prompt"] = add_generation_prompt;
  return template_->render(context);
}

std::vector<std::pair<std::string, bool>> ChatTemplate::segments(const ojson& messages,
                                                                 const std::string& where) const {
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
    if (messages[i].value("role", "") != "assistant") continue;
    const std::string before = render_at(i, true), with = render_at(i + 1, false);
    const bool prefix = before.size() >= done && with.size() >= before.size() &&
                        with.compare(0, before.size(), before) == 0 &&
                        whole.compare(0, with.size(), with) == 0;
    if (!prefix)
      throw Error(where + ": " + origin_ + " does not render messages[" + std::to_string(i) +
                  "] (an assistant's) as a continuation of the messages before it with the " +
                  "generation prompt, so its answer cannot be told from the prompt (templates " +
                  "that drop earlier turns' reasoning do this); " + kInstead);
    out.emplace_back(whole.substr(done, before.size() - done), false);
    out.emplace_back(whole.substr(before.size(), with.size() - before.size()), true);
    done = with.size();
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
