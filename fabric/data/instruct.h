// fabric::InstructDataset: instruction-tuning examples from a JSONL file, tokenized by a Hugging
// Face tokenizer.json, with the loss on the response tokens only (the others' targets -100, as
// transformers, LitGPT and TorchTune label them).
//
// A line is one example, either
//   {"prompt": "...", "response": "..."}                        (Alpaca-like; "input" optional)
//   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
// rendered by a template:
//   alpaca   the Stanford Alpaca prompt ("Below is an instruction ... ### Instruction:\n{prompt}
//            \n\n### Response:\n", with "### Input:" when "input" is there), then the response
//   chatml   "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message (a prompt/response line is a user
//            and an assistant message); after the last non-assistant message
//            "<|im_start|>assistant\n" belongs to the prompt; the assistants' contents and their
//            "<|im_end|>\n" are the response
//   chat_template  the model's own format: its Hugging Face chat template (the folder of
//            tokenizer_json: chat_template.jinja, else tokenizer_config.json's chat_template;
//            fabric/data/chat_template.h), rendered as transformers renders it; FILE.jinja: that
//            file's template. A prompt/response line is a user and an assistant message, roles
//            are the template's to check, and each assistant message's turn as the template
//            writes it after the generation prompt (its end marker included) is a response
//   TEXT     any other string: "{prompt}" (and "{input}") and "{response}" stand for the fields;
//            the text before "{response}" is the prompt part. An error: no "{response}" or two,
//            no "{prompt}", another {name}, "{prompt}"/"{input}" after "{response}"
// The rendered example is encoded as one text (its ids are `tokenizers`' for that text: a
// prompt part ending in a space joins it to the response's first word), the bos id put first
// (Options::add_bos) and the eos id last (Options::append_eos). A chat template writes its own
// bos ("{{ bos_token }}") and turn ends: bos only when not first already, eos only after a
// conversation that ends with an answer and holds no eos (Llama 3's <|eot_id|> and Qwen2.5's
// <|im_end|> are their instruct models' eos; a base model's <|end_of_text|> is not). Loss targets:
// the ids holding any byte of a response (transformers' assistant mask: the token "ĠIt" of "A: " +
// "It" is the response's), eos included; prompt, system and user ids get -100.
//
// Padded, examples longer than block_size + 1 ids are cut (truncated() counts them), and one left
// without a response id is dropped (dropped() counts them). Batches:
//   padded (default): each example on its own row, [B, L] with L the longest in the batch
//     (at most block_size): inputs ids[:-1] padded with pad_id, targets ids[1:] padded with -100.
//   packed: the examples (in file order) joined into one stream cut into windows of
//     block_size + 1 ids, as TokenDataset cuts token files (a window may span examples).
//
// Errors (fabric::Error, one line "FILE:LINE: FIELD: problem; fix"): a line that is not a JSON
// object, a line with both messages and prompt/response, a missing or non-string field, a message
// without role or content or with an unknown role, no assistant message, an empty file; and a file
// whose examples have no response token at all ("...: no example has a response token within
// block_size ..."); chatml on a tokenizer without <|im_start|> and <|im_end|> tokens; add_bos on
// one without a bos. Keys no template reads are not errors (datasets carry ids, sources,
// categories): unread_fields() names them.
//
//   fabric::InstructDataset::Options o;
//   o.tokenizer_json = "Qwen2.5-0.5B/tokenizer.json";
//   o.template_text = "chatml";
//   auto data = fabric::InstructDataset::open("train.jsonl", o);
//   fabric::Batch b = data->get_batch({0, 1});   // b.data [2, L] ids, b.target [2, L] (-100
//   masked)
#ifndef FABRIC_DATA_INSTRUCT_H_
#define FABRIC_DATA_INSTRUCT_H_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fabric/data/bpe.h"
#include "fabric/data/dataset.h"

namespace fabric {

class ChatTemplate;

class InstructDataset : public Dataset {
 public:
  struct Options {
    std::filesystem::path tokenizer_json;
    std::string template_text = "alpaca";  // alpaca | chatml | a TEXT with {prompt}, {response}
    int64_t block_size = 512;              // the longest input a model sees
    bool packed = false;
    bool append_eos = true;  // the tokenizer's eos after each response (none: nothing appended)
    bool add_bos = false;    // the tokenizer's bos before each example
    int64_t pad_id = -1;     // padded inputs' id (-1: the eos id, else 0)
    // A chat_template or FILE.jinja template_text's template, when the caller has opened it
    // (null: opened from tokenizer_json's folder).
    std::shared_ptr<const ChatTemplate> chat;
    // Where the tokenized examples are kept between runs ("": nowhere): one file per JSONL file,
    // named by a hash of its bytes, tokenizer_json's bytes, the template and bos/eos, read back
    // instead of tokenizing again (block_size and packing apply after). Needs tokenizer_json.
    std::filesystem::path cache_dir;
  };
  // One example: its ids and which of them are response ids (the loss's targets).
  struct Example {
    std::vector<int64_t> ids;
    std::vector<bool> response;
  };

  // Reads and tokenizes `jsonl` (errors: see above).
  static std::shared_ptr<InstructDataset> open(const std::filesystem::path& jsonl,
                                               const Options& options);
  // The same from a tokenizer already loaded (tests; several files with one tokenizer).
  static std::shared_ptr<InstructDataset> open(const std::filesystem::path& jsonl,
                                               const Options& options,
                                               std::shared_ptr<const BpeTokenizer> tokenizer);

  int64_t size() const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  bool cheap_batches() const override { return true; }

  const std::vector<Example>& examples() const { return examples_; }
  int64_t truncated() const { return truncated_; }  // examples cut to block_size + 1 ids
  // Padded: examples left out because no response id remained within block_size + 1 ids.
  int64_t dropped() const { return dropped_; }
  bool from_cache() const { return from_cache_; }  // read from Options::cache_dir
  // Why the cache could not be written ("" when it was, or none was asked for).
  const std::string& cache_warning() const { return cache_warning_; }
  // Keys of the file's lines that no template reads (a misspelt "respones", a "system" beside a
  // prompt), each with the first line it is on: "'system' (FILE:3), ..." (at most 8; "" when none,
  // and after a cache hit, which reads no line).
  const std::string& unread_fields() const { return unread_fields_; }
  int64_t response_tokens() const;  // targets that are not -100, in all examples

 private:
  InstructDataset() = default;
  Options options_;
  std::vector<Example> examples_;
  std::vector<int64_t> stream_;        // packed: every example's ids in order
  std::vector<int64_t> stream_label_;  // packed: the id where it is a response id, else -100
  int64_t truncated_ = 0, dropped_ = 0, pad_id_ = 0;
  bool from_cache_ = false;
  std::string cache_warning_;
  std::string unread_fields_;
};

// fabric::Error "template 'TEXT': problem; fix" for a TEXT template that would misplace the data
// (see TEXT above: no {response} or two, no {prompt}, another {name}, a field after {response});
// alpaca and chatml pass. InstructDataset::open checks its template with it, before any line.
void check_instruct_template(const std::string& template_text);

// Where `tokenizer`'s token that holds byte `at` of `text` starts (ChatTemplate::TokenStart;
// `tokenizer` must outlive it).
std::function<size_t(const std::string&, size_t)> token_start_of(const BpeTokenizer& tokenizer);

// fabric::Error "template chatml: SOURCE has no <|im_start|> token (...)" when `template_text` is
// chatml and the tokenizer does not have its two markers as tokens (Llama's, GPT-2's): the
// examples would be trained on them spelled out as text. Other templates pass.
void check_template_tokens(const std::string& template_text, const BpeTokenizer& tokenizer,
                           const std::string& source);

// The prompt and response parts of one JSONL line (`where`: "FILE:LINE" for errors) under
// `template_text`, as alternating segments: {text, is_response}; `unread` (when given) gets the
// line's keys no template reads. Exposed for tests.
// `chat`: the template a chat_template or FILE.jinja `template_text` names (ChatTemplate::open);
// `token_start`: its ChatTemplate::TokenStart, token_start_of(the tokenizer).
std::vector<std::pair<std::string, bool>> render_instruct_example(
    const std::string& line, const std::string& template_text, const std::string& where,
    std::set<std::string>* unread = nullptr, const ChatTemplate* chat = nullptr,
    const std::function<size_t(const std::string&, size_t)>& token_start = {});

}  // namespace fabric

#endif  // FABRIC_DATA_INSTRUCT_H_
