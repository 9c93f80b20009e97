#include "fabric/data/instruct.h"

#include <torch/types.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "fabric/core/error.h"
#include "fabric/core/json_object.h"
#include "fabric/data/chat_template.h"
#include "fabric/data/instruct_cache.h"

namespace fabric {

namespace fs = std::filesystem;

namespace {

using Segments = std::vector<std::pair<std::string, bool>>;

// The ids of an example's parts encoded as one text, as `tokenizers` encodes the rendered example
// (a prompt part ending in a space joins it to the response's first word: "A: " + "It" is "A",
// ":", "ĠIt", not "Ġ", "It"), appended to `e`. An id is a response id when any of its bytes is a
// response part's, as transformers' assistant mask takes every token holding an assistant
// character. Where the whole text's bytes are not the parts' (a normalizer joining across a
// boundary), each part is encoded on its own.
void encode_example(const BpeTokenizer& t, const Segments& parts, InstructDataset::Example& e) {
  std::string whole;
  std::vector<size_t> ends;  // each part's end in the encoded bytes
  size_t at = 0;
  for (const auto& [text, response] : parts) {
    whole += text;
    at += t.decode(t.encode(text)).size();
    ends.push_back(at);
  }
  const std::vector<int64_t> ids = t.encode(whole);
  std::vector<bool> labels;
  labels.reserve(ids.size());
  size_t start = 0;
  for (const int64_t id : ids) {
    const size_t end = start + t.decode({id}).size();
    bool response = false;
    for (size_t k = 0, begin = 0; k < parts.size(); begin = ends[k++])
      response = response || (parts[k].second && begin < ends[k] && begin < end && ends[k] > start);
    labels.push_back(response);
    start = end;
  }
  if (start != at) {  // the parts' bytes differ from the whole's: each part alone
    for (const auto& [text, response] : parts) {
      const std::vector<int64_t> part = t.encode(text);
      e.ids.insert(e.ids.end(), part.begin(), part.end());
      e.response.insert(e.response.end(), part.size(), response);
    }
    return;
  }
  e.ids.insert(e.ids.end(), ids.begin(), ids.end());
  e.response.insert(e.response.end(), labels.begin(), labels.end());
}

const char kAlpacaIntro[] =
    "Below is an instruction that describes a task. Write a response that appropriately completes "
    "the request.\n\n";
const char kAlpacaIntroWithInput[] =
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n";

std::string text_field(const nlohmann::json& j, const char* key, const std::string& where,
                       bool required) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required)
      throw Error(where + ": " + key +
                  ": missing; a line is {\"prompt\": ..., \"response\": ...} "
                  "or {\"messages\": [{\"role\": ..., \"content\": ...}]}");
    return "";
  }
  if (!j[key].is_string()) throw Error(where + ": " + key + ": " + j[key].dump() + " is not text");
  return j[key].get<std::string>();
}

// How deep `j` nests (a scalar: 0), walked without recursion.
int nesting(const nlohmann::json& j) {
  int deepest = 0;
  std::vector<std::pair<const nlohmann::json*, int>> stack{{&j, 0}};
  while (!stack.empty()) {
    const auto [v, depth] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) continue;
    deepest = std::max(deepest, depth + 1);
    for (const auto& item : *v) stack.emplace_back(&item, depth + 1);
  }
  return deepest;
}

// The messages of a line: {"messages": [...]}, or a prompt/response line as user + assistant.
// Roles are system, user and assistant; with `any_role` (a chat template's, which may know
// "tool" or "developer"), any text.
std::vector<std::pair<std::string, std::string>> messages_of(const nlohmann::json& j,
                                                             const std::string& where,
                                                             bool any_role = false) {
  std::vector<std::pair<std::string, std::string>> out;
  if (j.contains("messages") && (j.contains("prompt") || j.contains("response")))
    throw Error(where + ": messages and " + (j.contains("prompt") ? "prompt" : "response") +
                " on one line: give one example per line, either messages or prompt/response");
  if (!j.contains("messages")) {
    std::string prompt = text_field(j, "prompt", where, true);
    if (const std::string input = text_field(j, "input", where, false); !input.empty())
      prompt += "\n\n" + input;
    out.emplace_back("user", prompt);
    out.emplace_back("assistant", text_field(j, "response", where, true));
    return out;
  }
  if (!j["messages"].is_array() || j["messages"].empty())
    throw Error(where + ": messages: not a non-empty list of {\"role\", \"content\"}");
  for (size_t i = 0; i < j["messages"].size(); ++i) {
    const auto& m = j["messages"][i];
    const std::string at = where + ": messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw Error(at + ": not an object {\"role\", \"content\"}");
    const std::string role = text_field(m, "role", at, true);
    if (!any_role && role != "system" && role != "user" && role != "assistant")
      throw Error(at + ".role: '" + role + "' is not system, user or assistant");
    // A chat template takes any content (null beside tool_calls, a list of parts): its own
    // checks apply.
    out.emplace_back(role, any_role ? "" : text_field(m, "content", at, true));
  }
  const bool answered =
      std::any_of(out.begin(), out.end(), [](const auto& m) { return m.first == "assistant"; });
  if (!answered)
    throw Error(where + ": messages: no assistant message; the loss is on the assistant's words");
  return out;
}

// A TEXT template's {name}s: only {prompt}, {input} and one {response}; {prompt} present, and
// none after {response}, whose text is trained on (a prompt there would be learned as answer).
// A misspelt or unclosed placeholder would otherwise drop the prompt from every example.
void check_placeholders(const std::string& text, size_t response_at) {
  const std::string quoted = "template '" + text + "': ";
  const std::string example = "e.g. \"Q: {prompt}\\nA: {response}\"";
  if (text.find("{response}", response_at + 1) != std::string::npos)
    throw Error(quoted + "{response} twice; write it once, where the response goes");
  for (size_t open = text.find('{'); open != std::string::npos; open = text.find('{', open + 1)) {
    const size_t close = text.find_first_not_of(
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_", open + 1);
    if (close == std::string::npos || text[close] != '}' || close == open + 1) continue;
    const std::string name = text.substr(open + 1, close - open - 1);
    if (name != "prompt" && name != "input" && name != "response")
      throw Error(quoted + "{" + name + "} is not a placeholder; use {prompt}, {input} and " +
                  "{response}, " + example);
    if (name != "response" && open > response_at)
      throw Error(quoted + "{" + name + "} after {response} would be trained on as part of the " +
                  "response; put it before {response}, " + example);
  }
  if (text.find("{prompt}") == std::string::npos)
    throw Error(quoted + "no {prompt} in it, so every example's prompt would be left out; write " +
                "where it goes, " + example);
}

}  // namespace

void check_template_tokens(const std::string& template_text, const BpeTokenizer& tokenizer,
                           const std::string& source) {
  if (template_text != "chatml") return;
  for (const std::string token : {"<|im_start|>", "<|im_end|>"}) {
    const size_t pieces = tokenizer.encode(token).size();
    if (pieces != 1)
      throw Error("template chatml: " + source + " has no " + token + " token (it would be " +
                  "trained on spelled out, in " + std::to_string(pieces) +
                  " pieces); use a template in this model's own format (alpaca, or a TEXT "
                  "template such as \"Q: {prompt}\\nA: {response}\")");
  }
}

void check_instruct_template(const std::string& template_text) {
  if (template_text == "alpaca" || template_text == "chatml" ||
      ChatTemplate::named_by(template_text))
    return;
  const size_t at = template_text.find("{response}");
  if (at == std::string::npos)
    throw Error("template '" + template_text +
                "': no {response} in it; write where the response goes, e.g. "
                "\"Q: {prompt}\\nA: {response}\" (or alpaca, chatml)");
  check_placeholders(template_text, at);
}

std::function<size_t(const std::string&, size_t)> token_start_of(const BpeTokenizer& tokenizer) {
  return [&tokenizer](const std::string& text, size_t at) {
    size_t start = 0;
    for (const int64_t id : tokenizer.encode(text)) {
      const size_t n = tokenizer.decode({id}).size();
      if (start + n > at) break;
      start += n;
    }
    return std::min(start, at);
  };
}

Segments render_instruct_example(
    const std::string& line, const std::string& template_text, const std::string& where,
    std::set<std::string>* unread, const ChatTemplate* chat,
    const std::function<size_t(const std::string&, size_t)>& token_start) {
  const nlohmann::json j = parse_json_object(
      line, where, "; a line is {\"prompt\": ..., \"response\": ...} or {\"messages\": [...]}");
  if (unread != nullptr)
    for (const auto& item : j.items())
      if (item.key() != "prompt" && item.key() != "input" && item.key() != "response" &&
          item.key() != "messages")
        unread->insert(item.key());
  Segments out;
  if (ChatTemplate::named_by(template_text)) {
    if (chat == nullptr)
      throw Error(where + ": the chat template '" + template_text + "' is not open");
    messages_of(j, where, true);  // the line's errors, as under chatml
    if (nesting(j) > 64)          // the template's values are walked recursively
      throw Error(where + ": a value nested more than 64 deep; flatten it");
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (j.contains("messages")) {  // every field, in the line's order (tool_calls, name, ...)
      messages = nlohmann::ordered_json::parse(line)["messages"];
    } else {
      std::string prompt = text_field(j, "prompt", where, true);
      if (const std::string input = text_field(j, "input", where, false); !input.empty())
        prompt += "\n\n" + input;
      messages.push_back({{"role", "user"}, {"content", prompt}});
      messages.push_back(
          {{"role", "assistant"}, {"content", text_field(j, "response", where, true)}});
    }
    return chat->segments(messages, where, token_start);
  }
  if (template_text == "chatml") {
    const auto messages = messages_of(j, where);
    std::string prompt;
    for (const auto& [role, content] : messages) {
      if (role == "assistant") {
        out.emplace_back(prompt + "<|im_start|>assistant\n", false);
        out.emplace_back(content + "<|im_end|>\n", true);
        prompt.clear();
      } else {
        prompt += "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
      }
    }
    if (!prompt.empty()) out.emplace_back(prompt, false);  // turns after the last answer
    return out;
  }
  if (j.contains("messages"))
    throw Error(
        where +
        ": messages: a chat line needs data.template chatml or chat_template (the template '" +
        (template_text.size() > 20 ? template_text.substr(0, 20) + "..." : template_text) +
        "' renders prompt and response)");
  const std::string prompt = text_field(j, "prompt", where, true);
  const std::string input = text_field(j, "input", where, false);
  const std::string response = text_field(j, "response", where, true);
  if (template_text == "alpaca") {
    std::string p = input.empty() ? kAlpacaIntro : kAlpacaIntroWithInput;
    p += "### Instruction:\n" + prompt + "\n\n";
    if (!input.empty()) p += "### Input:\n" + input + "\n\n";
    p += "### Response:\n";
    out.emplace_back(p, false);
    out.emplace_back(response, true);
    return out;
  }
  const size_t at = template_text.find("{response}");
  if (at == std::string::npos) check_instruct_template(template_text);  // throws, saying why
  // One pass over the template: a field's own text is never searched again, so a "{input}" the
  // prompt writes stays as written (Python's str.format does the same).
  auto fill = [&](const std::string& s) {
    std::string out;
    for (size_t at = 0; at < s.size();) {
      if (s.compare(at, 8, "{prompt}") == 0) {
        out += prompt;
        at += 8;
      } else if (s.compare(at, 7, "{input}") == 0) {
        out += input;
        at += 7;
      } else {
        out += s[at++];
      }
    }
    return out;
  };
  out.emplace_back(fill(template_text.substr(0, at)), false);
  out.emplace_back(response, true);
  const std::string after = fill(template_text.substr(at + 10));
  if (!after.empty()) out.emplace_back(after, true);  // the template's own end of a response
  return out;
}

std::shared_ptr<InstructDataset> InstructDataset::open(const fs::path& jsonl,
                                                       const Options& options) {
  if (options.tokenizer_json.empty())
    throw Error(jsonl.string() + ": no tokenizer.json given to tokenize it with");
  return open(jsonl, options,
              std::make_shared<const BpeTokenizer>(
                  BpeTokenizer::from_tokenizer_json(options.tokenizer_json)));
}

std::shared_ptr<InstructDataset> InstructDataset::open(
    const fs::path& jsonl, const Options& options, std::shared_ptr<const BpeTokenizer> tokenizer) {
  if (options.block_size < 1) throw Error("InstructDataset: block_size must be at least 1");
  check_instruct_template(options.template_text);  // once, before any line (or a cache hit)
  check_template_tokens(options.template_text, *tokenizer, options.tokenizer_json.string());
  std::shared_ptr<const ChatTemplate> chat = options.chat;
  if (!chat && ChatTemplate::named_by(options.template_text))
    chat = ChatTemplate::open(options.template_text, options.tokenizer_json.parent_path());
  const auto token_start = token_start_of(*tokenizer);
  if (options.add_bos && tokenizer->bos() < 0)
    throw Error(options.tokenizer_json.string() +
                ": names no bos token to start each example with; give one in the folder's "
                "tokenizer_config.json (bos_token), or leave add_bos off");
  std::error_code ec;
  if (std::filesystem::is_directory(jsonl, ec))
    throw Error(jsonl.string() + ": is a folder; give a JSONL file of examples (one per line)");
  std::ifstream in(jsonl);
  if (!in) throw Error(jsonl.string() + ": cannot read (a JSONL file of examples)");
  std::shared_ptr<InstructDataset> d(new InstructDataset());
  d->options_ = options;
  const int64_t eos = tokenizer->eot();
  if (options.append_eos && eos < 0)
    throw Error(options.tokenizer_json.string() +
                ": names no eos token to end each response with; give one in the folder's "
                "tokenizer_config.json (eos_token)");
  d->pad_id_ = options.pad_id >= 0 ? options.pad_id : std::max<int64_t>(eos, 0);
  // The examples as tokenized, whole: from the cache when it holds this file under these
  // options, else tokenized now (and cached).
  std::vector<Example> whole;
  fs::path cached;
  if (!options.cache_dir.empty() && !options.tokenizer_json.empty()) {
    cached = options.cache_dir / instruct_cache::cache_name(jsonl, options, *tokenizer, chat.get());
    d->from_cache_ = instruct_cache::read_cache(cached, whole);
  }
  if (!d->from_cache_) {
    std::string line;
    int64_t number = 0;
    std::set<std::string> unread_seen;
    while (std::getline(in, line)) {
      ++number;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
      const std::string where = jsonl.string() + ":" + std::to_string(number);
      std::set<std::string> unread;
      Example e;
      const Segments parts = render_instruct_example(line, options.template_text, where, &unread,
                                                     chat.get(), token_start);
      encode_example(*tokenizer, parts, e);
      // bos first and eos after the response. A chat template writes its own bos ("{{ bos_token
      // }}") and ends its turns: bos only when it is not first, eos only after a last answer
      // and when the text holds none (Llama 3's <|eot_id|>, Qwen2.5's <|im_end|> are eos).
      if (options.add_bos && (!chat || e.ids.empty() || e.ids.front() != tokenizer->bos())) {
        e.ids.insert(e.ids.begin(), tokenizer->bos());
        e.response.insert(e.response.begin(), false);
      }
      if (options.append_eos &&
          (!chat || (!parts.empty() && parts.back().second &&
                     std::find(e.ids.begin(), e.ids.end(), eos) == e.ids.end()))) {
        e.ids.push_back(eos);
        e.response.push_back(true);
      }
      whole.push_back(std::move(e));
      for (const auto& key : unread)
        if (unread_seen.insert(key).second && unread_seen.size() <= 8)
          d->unread_fields_ +=
              (d->unread_fields_.empty() ? "" : ", ") + ("'" + key + "' (" + where + ")");
    }
    // The cache is an optimisation: a folder that cannot be written costs the next run a
    // tokenization, not this run.
    if (!cached.empty()) {
      try {
        instruct_cache::write_cache(cached, whole);
      } catch (const Error& e) {
        d->cache_warning_ = e.what();
      }
    }
  }
  int64_t responses = 0;
  for (Example& e : whole) {
    // Padded rows end at block_size + 1 ids; packed examples flow across windows, whole.
    if (!options.packed && static_cast<int64_t>(e.ids.size()) > options.block_size + 1) {
      e.ids.resize(static_cast<size_t>(options.block_size + 1));
      e.response.resize(e.ids.size());
      ++d->truncated_;
    }
    // A target is the next id: response ids after the first position count. A padded row left
    // without one (its response cut off) would be a row of -100 targets only: it is dropped and
    // counted, so no batch has an empty loss.
    const auto targets = std::count(e.response.begin() + 1, e.response.end(), true);
    if (!options.packed && targets == 0) {
      ++d->dropped_;
      continue;
    }
    responses += targets;
    d->examples_.push_back(std::move(e));
  }
  if (d->examples_.empty() && d->dropped_ == 0)
    throw Error(jsonl.string() + ": no examples (one JSON object per line)");
  if (responses == 0)
    throw Error(jsonl.string() + ": no example has a response token within block_size " +
                std::to_string(options.block_size) +
                " (the loss would be empty); check the response fields, or raise block_size");
  if (options.packed) {
    for (const Example& e : d->examples_)
      for (size_t i = 0; i < e.ids.size(); ++i) {
        d->stream_.push_back(e.ids[i]);
        d->stream_label_.push_back(e.response[i] ? e.ids[i] : -100);
      }
    if (static_cast<int64_t>(d->stream_.size()) < options.block_size + 1)
      throw Error(jsonl.string() + ": " + std::to_string(d->stream_.size()) +
                  " ids in all, fewer than one packed window of block_size + 1 = " +
                  std::to_string(options.block_size + 1) + "; lower block_size or pad instead");
  }
  return d;
}

int64_t InstructDataset::size() const {
  if (options_.packed) return (static_cast<int64_t>(stream_.size()) - 1) / options_.block_size;
  return static_cast<int64_t>(examples_.size());
}

int64_t InstructDataset::response_tokens() const {
  int64_t n = 0;
  for (const Example& e : examples_)
    n += std::count(e.response.begin() + 1, e.response.end(), true);
  return n;
}

Batch InstructDataset::get_batch(const std::vector<int64_t>& indices) const {
  const auto B = static_cast<int64_t>(indices.size());
  for (const int64_t i : indices)
    if (i < 0 || i >= size())
      throw Error("InstructDataset: index " + std::to_string(i) + " outside [0, " +
                  std::to_string(size()) + ")");
  if (options_.packed) {
    const int64_t T = options_.block_size;
    torch::Tensor data = torch::empty({B, T}, torch::kLong),
                  target = torch::empty({B, T}, torch::kLong);
    auto d = data.accessor<int64_t, 2>();
    auto t = target.accessor<int64_t, 2>();
    for (int64_t b = 0; b < B; ++b) {
      const int64_t start = indices[static_cast<size_t>(b)] * T;
      for (int64_t k = 0; k < T; ++k) {
        d[b][k] = stream_[static_cast<size_t>(start + k)];
        t[b][k] = stream_label_[static_cast<size_t>(start + k + 1)];
      }
    }
    return {data, target};
  }
  int64_t T = 1;
  for (const int64_t i : indices)
    T = std::max<int64_t>(T,
                          static_cast<int64_t>(examples_[static_cast<size_t>(i)].ids.size()) - 1);
  torch::Tensor data = torch::full({B, T}, pad_id_, torch::kLong);
  torch::Tensor target = torch::full({B, T}, -100, torch::kLong);
  auto d = data.accessor<int64_t, 2>();
  auto t = target.accessor<int64_t, 2>();
  for (int64_t b = 0; b < B; ++b) {
    const Example& e = examples_[static_cast<size_t>(indices[static_cast<size_t>(b)])];
    for (size_t k = 0; k + 1 < e.ids.size(); ++k) {
      d[b][static_cast<int64_t>(k)] = e.ids[k];
      if (e.response[k + 1]) t[b][static_cast<int64_t>(k)] = e.ids[k + 1];
    }
  }
  return {data, target};
}

}  // namespace fabric
