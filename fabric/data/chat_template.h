// fabric::ChatTemplate: a model's own chat format, its Hugging Face chat template (the folder's
// chat_template.jinja, else tokenizer_config.json's "chat_template"; or a FILE.jinja given by
// name), rendered as transformers' apply_chat_template renders it (fabric/data/jinja.h): the
// variables are messages, add_generation_prompt, tools and documents (none) and the folder's
// special tokens (bos_token, eos_token, unk_token, pad_token, ... from tokenizer_config.json).
//
// For training, segments() splits a conversation into prompt and response parts: an assistant
// message's response part is what the template adds for it after the generation prompt (its
// content and the end-of-turn marker, "<|eot_id|>" or "<|im_end|>\n"), found by rendering the
// conversation up to that message with the generation prompt and with the message: the answer
// starts where the two part (a generation prompt the answer does not repeat, DeepSeek's
// "<think>\n", stays out; text written before the turn only once it follows, such as leaked
// indentation, is the prompt's) and ends where the whole conversation leaves the one with it (an
// end written only last, Phi-3's eos, stays out). TRL and torchtune find assistant turns by
// rendering too; transformers' own assistant mask needs {% generation %} blocks most templates
// lack. Messages reach the template as apply_chat_template hands them: keys holding null left
// out, reasoning ("reasoning_content", "thinking", "reasoning") under the first two names.
//
//   auto chat = fabric::ChatTemplate::open("chat_template", "Llama-3.2-1B-Instruct");
//   std::string prompt = chat->render(messages, /*add_generation_prompt=*/true);
#ifndef FABRIC_DATA_CHAT_TEMPLATE_H_
#define FABRIC_DATA_CHAT_TEMPLATE_H_

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fabric {

namespace jinja {
class Template;
}

class ChatTemplate {
 public:
  // Whether a template name asks for a chat template: "chat_template" (the model folder's own)
  // or a path ending in ".jinja".
  static bool named_by(const std::string& template_text);
  // The template `template_text` names, with `folder`'s special tokens (tokenizer_config.json's,
  // else special_tokens_map.json's). Errors (fabric::Error, one line): the folder has no chat
  // template (saying where it looked, then `instead`: what to use; "" says data.template's
  // choices), a tokenizer_config.json that is not JSON or whose chat_template is neither text
  // nor a list of {"name", "template"} with a "default", a FILE.jinja that cannot be read or is a
  // folder, and a template this renderer does not take ("ORIGIN: line N: ...").
  static std::shared_ptr<const ChatTemplate> open(const std::string& template_text,
                                                  const std::filesystem::path& folder,
                                                  const std::string& instead = "");
  ~ChatTemplate();

  // `messages` (a list of {"role", "content", ...}) as the template writes them; with
  // add_generation_prompt, followed by what starts the assistant's answer.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt) const;
  // The start of the token of `text` that holds byte `at` (a tokenizer's view of the text).
  using TokenStart = std::function<size_t(const std::string& text, size_t at)>;
  // The same text as alternating parts {text, is_response} (see above); `where` ("FILE:LINE")
  // names the example in errors: a template that renders earlier turns differently once later
  // ones follow (as templates that drop past reasoning do), one whose answer does not begin as
  // its generation prompt does, one that writes nothing for an assistant message, or one that
  // raises an error. `token_start`: where the renderings part inside a token, the answer's
  // bounds move to that token's start (without it they may fall inside one, as "<|" of two
  // markers).
  std::vector<std::pair<std::string, bool>> segments(const nlohmann::ordered_json& messages,
                                                     const std::string& where,
                                                     const TokenStart& token_start = {}) const;
  // Everything the rendered text depends on besides the messages: the template, the special
  // tokens and, when the template reads strftime_now, today's date (for a token cache's name).
  std::string key() const;
  // Where the template came from: "DIR/chat_template.jinja", "DIR/tokenizer_config.json:
  // chat_template" or the FILE.
  const std::string& origin() const { return origin_; }

 private:
  ChatTemplate() = default;
  std::unique_ptr<jinja::Template> template_;
  std::string source_, origin_;
  nlohmann::ordered_json variables_;  // the special tokens, tools and documents
};

}  // namespace fabric

#endif  // FABRIC_DATA_CHAT_TEMPLATE_H_
