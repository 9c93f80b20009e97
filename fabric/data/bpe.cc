#include "fabric/data/bpe.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <limits>
#include <mutex>
#include <queue>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "fabric/core/error.h"
#include "fabric/core/files.h"
#include "fabric/data/bpe_unicode.h"

namespace fabric {

using bpe_unicode::append_utf8;
using bpe_unicode::char_at;
using bpe_unicode::is_space;

namespace {

std::string read_file(const std::filesystem::path& path, const char* what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(path.string() + ": is a folder, not " + what);
  // A FIFO would block, a device (/dev/zero) never end: regular files only.
  if (std::filesystem::exists(path, ec)) require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string() + ": cannot read (" + what + ")");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::vector<std::string> byte_level_symbols() {
  std::vector<std::string> s(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    append_utf8(s[b], printable ? b : next++);
  }
  return s;
}

// `tokenizers` keeps ids in u32 and refuses larger ones (an id near 2^63 would also overflow
// id + 1, the vocabulary's size).
constexpr int64_t kLargestId = 0xFFFFFFFFLL;

struct BpeTokenizer::Loader {
  static void set_vocab(BpeTokenizer& t, const nlohmann::json& vocab, const std::string& file) {
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
          it.value().get<int64_t>() > kLargestId)
        throw Error(file + ": \"" + it.key() + "\" has no integer id in [0, 2^32)");
      const int64_t id = it.value().get<int64_t>();
      // Two symbols with one id: decoding could not tell them apart, and training data written
      // with one would decode as the other.
      if (const auto other = t.symbols_.find(id); other != t.symbols_.end())
        throw Error(file + ": \"" + one_line(other->second, 40) + "\" and \"" +
                    one_line(it.key(), 40) + "\" share id " + std::to_string(id) +
                    "; each symbol needs its own id (a damaged or hand-edited vocabulary?)");
      t.vocab_[it.key()] = id;
      t.symbols_[id] = it.key();
      t.vocab_size_ = std::max(t.vocab_size_, id + 1);
    }
    for (int b = 0; b < 256; ++b)
      if (!t.vocab_.count(t.byte_symbol_[b]))
        throw Error(file + ": no symbol for byte " + std::to_string(b) +
                    "; is it a byte-level BPE vocabulary (GPT-2's vocab.json / encoder.json)?");
  }

  static void add_merge(BpeTokenizer& t, std::string a, std::string b, const std::string& where,
                        const std::string& vocab_file, int& rank) {
    if (!t.vocab_.count(a + b))
      throw Error(where + ": the merge of '" + a + "' and '" + b + "' is not in " + vocab_file +
                  " (files of two different tokenizers?)");
    // A pair listed twice takes its last rank, as `tokenizers` (a map built in order) and
    // transformers' slow tokenizers (a dict) do.
    t.ranks_[std::make_pair(std::move(a), std::move(b))] = rank++;
  }
};

BpeTokenizer BpeTokenizer::load(const std::filesystem::path& vocab_json,
                                const std::filesystem::path& merges_txt) {
  BpeTokenizer t;
  t.byte_symbol_ = byte_level_symbols();
  for (int b = 0; b < 256; ++b) t.symbol_byte_[t.byte_symbol_[b]] = static_cast<unsigned char>(b);
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(read_file(vocab_json, "the BPE vocabulary"));
  } catch (const nlohmann::json::exception& e) {
    throw Error(vocab_json.string() + ": not a JSON vocabulary (" + e.what() + ")");
  }
  if (!vocab.is_object())
    throw Error(vocab_json.string() + ": expected an object {\"symbol\": id, ...}");
  Loader::set_vocab(t, vocab, vocab_json.string());
  if (auto e = t.vocab_.find("<|endoftext|>"); e != t.vocab_.end()) t.eot_ = e->second;

  std::istringstream merges(read_file(merges_txt, "the BPE merges"));
  std::string line;
  int line_number = 0, rank = 0;
  while (std::getline(merges, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos)
      throw Error(merges_txt.string() + ":" + std::to_string(line_number) +
                  ": expected two symbols separated by one space, got '" + line + "'");
    Loader::add_merge(t, line.substr(0, space), line.substr(space + 1),
                      merges_txt.string() + ":" + std::to_string(line_number), vocab_json.string(),
                      rank);
  }
  t.cache_ = std::make_shared<std::unordered_map<std::string, std::vector<int64_t>>>();
  return t;
}

namespace {

using nlohmann::json;

// The JSON of a file beside tokenizer.json, or null when there is none.
json sibling_json(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) return nullptr;
  try {
    return json::parse(read_file(path, "a tokenizer's configuration"));
  } catch (const json::exception& e) {
    throw Error(path.string() + ": not JSON (" + one_line(e.what(), 80) +
                "); fix or remove the file");
  }
}

// A token's text in tokenizer_config.json: "text", {"content": "text"}, or null.
std::string token_text(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return "";
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

// An id in generation_config.json: a number, or the first of a list.
int64_t config_id(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return -1;
  const json& v = config[key];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int64_t>();
  return -1;
}

constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : "";
}

// A boolean field of `j` (`otherwise` when absent or null); another type is an error naming the
// file and the key, as `tokenizers` refuses it (a "yes" read as the default would tokenize
// otherwise without a word).
bool flag(const json& j, const char* key, bool otherwise, const std::string& file) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return otherwise;
  if (!j[key].is_boolean())
    throw Error(file + ": \"" + key + "\": " + one_line(j[key].dump(), 40) +
                " is not true or false");
  return j[key].get<bool>();
}

}  // namespace

BpeTokenizer BpeTokenizer::from_tokenizer_json(const std::filesystem::path& tokenizer_json) {
  const std::string file = tokenizer_json.string();
  // A model folder given for its tokenizer.json: the file to give instead.
  std::error_code ec;
  if (std::filesystem::is_regular_file(tokenizer_json / "tokenizer.json", ec))
    throw Error(file + ": is a folder, not a Hugging Face tokenizer.json; give " +
                (tokenizer_json / "tokenizer.json").string());
  json j;
  try {
    j = json::parse(read_file(tokenizer_json, "a Hugging Face tokenizer.json"));
  } catch (const json::exception& e) {
    throw Error(file + ": not JSON (" + one_line(e.what(), 80) +
                "); give a Hugging Face tokenizer.json");
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    throw Error(file + ": no \"model\" object; give a Hugging Face tokenizer.json");
  const json& model = j["model"];
  std::string type = type_of(model);
  if (type.empty() && model.contains("merges")) type = "BPE";
  const std::string only =
      "; only byte-level BPE tokenizers (GPT-2's, Llama 3's, Qwen2's kind) are";
  if (type == "Unigram")
    throw Error(file +
                ": a Unigram model (SentencePiece's kind: T5, ALBERT, XLNet) is not supported" +
                only);
  if (type == "WordPiece")
    throw Error(file + ": a WordPiece model (BERT's kind) is not supported" + only);
  if (type != "BPE")
    throw Error(file + ": model type \"" + one_line(type, 40) + "\" is not supported" + only);
  if (flag(model, "byte_fallback", false, file))
    throw Error(file +
                ": a BPE with byte_fallback (SentencePiece's kind: Llama 2, Mistral) is "
                "not supported" +
                only);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
      throw Error(file + ": model." + key + " \"" + model[key].get<std::string>() +
                  "\" is not supported" + only);
  if (model.contains("dropout") && model["dropout"].is_number() &&
      model["dropout"].get<double>() > 0)
    throw Error(file + ": model.dropout is set; set it to null (dropout is for training only)");
  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges") ||
      !model["merges"].is_array())
    throw Error(file + ": model has no \"vocab\" object or no \"merges\" list");

  BpeTokenizer t;
  t.byte_symbol_ = byte_level_symbols();
  for (int b = 0; b < 256; ++b) t.symbol_byte_[t.byte_symbol_[b]] = static_cast<unsigned char>(b);
  Loader::set_vocab(t, model["vocab"], file);
  int rank = 0;
  const json& merges = model["merges"];
  for (size_t k = 0; k < merges.size(); ++k) {
    const json& m = merges[k];
    const std::string where = file + ": model.merges[" + std::to_string(k) + "]";
    std::string a, b;
    if (m.is_string()) {  // "a b"
      const std::string line = m.get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
          line.find(' ', space + 1) != std::string::npos)
        throw Error(where + ": expected two symbols separated by one space, got '" +
                    one_line(line, 40) + "'");
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      throw Error(where + ": expected \"a b\" or [\"a\", \"b\"], got " + one_line(m.dump(), 40));
    }
    Loader::add_merge(t, std::move(a), std::move(b), where, "model.vocab", rank);
  }
  t.ignore_merges_ = flag(model, "ignore_merges", false, file);

  // Normalizer: none or NFC (alone or in a Sequence).
  const json normalizer = j.value("normalizer", json(nullptr));
  std::vector<json> normalizers;
  if (type_of(normalizer) == "Sequence" && normalizer.contains("normalizers") &&
      normalizer["normalizers"].is_array()) {
    for (const json& n : normalizer["normalizers"]) normalizers.push_back(n);
  } else if (!normalizer.is_null()) {
    normalizers.push_back(normalizer);
  }
  for (const json& n : normalizers) {
    if (type_of(n) != "NFC")
      throw Error(file + ": normalizer \"" +
                  one_line(type_of(n).empty() ? n.dump() : type_of(n), 40) +
                  "\" is not supported; only none and NFC are");
    t.nfc_ = true;
  }

  // Pre-tokenizer: ByteLevel with GPT-2's pattern, or Split(pattern) then ByteLevel.
  const json pre = j.value("pre_tokenizer", json(nullptr));
  const std::string pre_error =
      file + ": pre_tokenizer " + one_line(pre.dump(), 60) +
      " is not supported; a byte-level BPE needs ByteLevel (GPT-2) or Sequence [Split, ByteLevel] "
      "(Llama 3, Qwen2)";
  if (type_of(pre) == "ByteLevel" && flag(pre, "use_regex", true, file)) {
    t.pattern_ = Pattern::kGpt2;
    t.add_prefix_space_ = flag(pre, "add_prefix_space", false, file);
  } else if (type_of(pre) == "Sequence" && pre.contains("pretokenizers") &&
             pre["pretokenizers"].is_array() && pre["pretokenizers"].size() == 2 &&
             type_of(pre["pretokenizers"][0]) == "Split" &&
             type_of(pre["pretokenizers"][1]) == "ByteLevel" &&
             !flag(pre["pretokenizers"][1], "use_regex", true, file)) {
    const json& split = pre["pretokenizers"][0];
    const json pattern = split.value("pattern", json(nullptr));
    if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string() ||
        split.value("behavior", std::string()) != "Isolated" || flag(split, "invert", false, file))
      throw Error(pre_error);
    const std::string regex = pattern["Regex"].get<std::string>();
    if (regex == kGpt2Regex) {
      t.pattern_ = Pattern::kGpt2;
    } else if (regex == kLlama3Regex) {
      t.pattern_ = Pattern::kLlama3;
    } else if (regex == kQwen2Regex) {
      t.pattern_ = Pattern::kQwen2;
    } else {
      throw Error(file + ": pre-tokenizer pattern '" + one_line(regex, 60) +
                  "' is not supported; only GPT-2's, Llama 3's and Qwen2's are");
    }
    t.add_prefix_space_ = flag(pre["pretokenizers"][1], "add_prefix_space", false, file);
    t.prefix_pieces_ = true;
  } else {
    throw Error(pre_error);
  }
  const json decoder = j.value("decoder", json(nullptr));
  if (!decoder.is_null() && type_of(decoder) != "ByteLevel")
    throw Error(file + ": decoder \"" + one_line(type_of(decoder), 40) +
                "\" is not supported; a byte-level BPE decodes with ByteLevel");

  // Added and special tokens.
  t.added_by_byte_.resize(256);
  const json added = j.value("added_tokens", json::array());
  if (!added.is_array() && !added.is_null())
    throw Error(file + ": \"added_tokens\" is not a list of {\"id\", \"content\", ...}");
  for (size_t k = 0; added.is_array() && k < added.size(); ++k) {
    const json& a = added[k];
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() > kLargestId ||
        !a.contains("content") || !a["content"].is_string())
      throw Error(file + ": added_tokens[" + std::to_string(k) +
                  "] has no \"id\" in [0, 2^32) or no \"content\" string");
    AddedToken token{a["content"].get<std::string>(),     a["id"].get<int64_t>(),
                     flag(a, "lstrip", false, file),      flag(a, "rstrip", false, file),
                     flag(a, "single_word", false, file), flag(a, "normalized", false, file)};
    if (token.content.empty()) continue;
    t.added_by_byte_[static_cast<unsigned char>(token.content[0])].push_back(t.added_.size());
    t.added_text_[token.id] = token.content;
    t.vocab_size_ = std::max(t.vocab_size_, token.id + 1);
    t.added_.push_back(std::move(token));
  }

  // bos and eos: tokenizer_config.json's tokens, else generation_config.json's ids.
  auto id_of = [&](const std::string& text) -> int64_t {
    if (text.empty()) return -1;
    for (const AddedToken& a : t.added_)
      if (a.content == text) return a.id;
    const auto v = t.vocab_.find(text);
    return v == t.vocab_.end() ? -1 : v->second;
  };
  const auto dir = tokenizer_json.parent_path();
  const json tokenizer_config = sibling_json(dir / "tokenizer_config.json");
  const json generation_config = sibling_json(dir / "generation_config.json");
  t.bos_ = id_of(token_text(tokenizer_config, "bos_token"));
  if (t.bos_ < 0) t.bos_ = config_id(generation_config, "bos_token_id");
  t.eot_ = id_of(token_text(tokenizer_config, "eos_token"));
  if (t.eot_ < 0) t.eot_ = config_id(generation_config, "eos_token_id");
  if (t.eot_ < 0) t.eot_ = id_of("<|endoftext|>");
  t.cache_ = std::make_shared<std::unordered_map<std::string, std::vector<int64_t>>>();
  return t;
}

namespace {

// Where the character that ends at byte `at` (> 0) of `text` starts.
size_t char_start_before(const std::string& text, size_t at) {
  size_t i = at - 1;
  while (i > 0 && at - i < 4 && (static_cast<unsigned char>(text[i]) >> 6) == 0x2) --i;
  return char_at(text, i).second == at - i ? i : at - 1;
}

// The code point that ends just before byte `at` of `text` (0 at the start).
uint32_t char_before(const std::string& text, size_t at) {
  return at == 0 ? 0 : char_at(text, char_start_before(text, at)).first;
}

// Rust's regex \w, which tokenizers tests a single_word token's neighbours against.

}  // namespace

std::vector<int64_t> BpeTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  if (added_.empty() && !nfc_) {
    encode_text(text, ids);
    return ids;
  }
  // Added tokens that match the text as written first (leftmost, longest), then, inside the
  // normalized rest, those marked "normalized", as Hugging Face tokenizers' AddedVocabulary does.
  auto split = [&](const std::string& s, bool normalized, const auto& on_text) {
    size_t done = 0, i = 0;
    while (i < s.size()) {
      const AddedToken* best = nullptr;
      for (const size_t k : added_by_byte_[static_cast<unsigned char>(s[i])]) {
        const AddedToken& a = added_[k];
        if (a.normalized == normalized &&
            (best == nullptr || a.content.size() > best->content.size()) &&
            s.compare(i, a.content.size(), a.content) == 0)
          best = &a;
      }
      if (best == nullptr) {
        ++i;
        continue;
      }
      size_t start = i, stop = i + best->content.size();
      i = stop;
      if (best->single_word &&
          ((start > 0 && bpe_unicode::is_word_char(char_before(s, start))) ||
           (stop < s.size() && bpe_unicode::is_word_char(char_at(s, stop).first))))
        continue;
      if (best->lstrip)
        while (start > done && is_space(char_before(s, start))) start = char_start_before(s, start);
      if (best->rstrip)
        while (stop < s.size() && is_space(char_at(s, stop).first)) stop += char_at(s, stop).second;
      if (done < start) on_text(s.substr(done, start - done));
      ids.push_back(best->id);
      done = i = stop;
    }
    if (done < s.size()) on_text(s.substr(done));
  };
  split(text, false, [&](const std::string& raw) {
    const std::string normalized = nfc_ ? nfc(raw) : raw;
    split(normalized, true, [&](const std::string& rest) { encode_text(rest, ids); });
  });
  return ids;
}

void BpeTokenizer::encode_text(const std::string& text, std::vector<int64_t>& ids) const {
  if (text.empty()) return;
  const std::string& in =
      !prefix_pieces_ && add_prefix_space_ && text[0] != ' ' ? " " + text : text;
  for (const std::string& piece : pretokenize(in, pattern_))
    encode_piece(prefix_pieces_ && add_prefix_space_ && piece[0] != ' ' ? " " + piece : piece, ids);
}

void BpeTokenizer::encode_piece(const std::string& piece, std::vector<int64_t>& ids) const {
  static std::mutex cache_mutex;
  {
    const std::lock_guard<std::mutex> lock(cache_mutex);
    if (auto hit = cache_->find(piece); hit != cache_->end()) {
      ids.insert(ids.end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  std::vector<int64_t> piece_ids;
  std::string whole;
  for (const char c : piece) whole += byte_symbol_[static_cast<unsigned char>(c)];
  // ignore_merges (Llama 3): a piece that is a vocabulary entry is that entry.
  if (const auto v = ignore_merges_ ? vocab_.find(whole) : vocab_.end(); v != vocab_.end()) {
    piece_ids.push_back(v->second);
  } else {
    // The merges in rank order, as GPT-2's loop does them (the lowest-ranked pair first; equal
    // ranks left to right), from a heap of candidate pairs: O(n log n) for a piece of n bytes,
    // where the loop's whole-word rescans took O(n^2) (a 1 MB run of letters: minutes).
    struct Symbol {
      std::string text;
      int64_t prev, next;   // -1: none
      int64_t version = 0;  // bumped when the symbol grows or is merged away (alive = false)
      bool alive = true;
    };
    std::vector<Symbol> word;
    word.reserve(piece.size());
    for (size_t k = 0; k < piece.size(); ++k)
      word.push_back({byte_symbol_[static_cast<unsigned char>(piece[k])],
                      static_cast<int64_t>(k) - 1,
                      k + 1 < piece.size() ? static_cast<int64_t>(k) + 1 : -1});
    // (rank, left, right, left's version, right's version): stale once either changed.
    using Candidate = std::tuple<int, int64_t, int64_t, int64_t, int64_t>;
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
    auto offer = [&](int64_t left) {
      if (left < 0 || word[left].next < 0) return;
      const int64_t right = word[left].next;
      const auto r = ranks_.find({word[left].text, word[right].text});
      if (r != ranks_.end())
        heap.emplace(r->second, left, right, word[left].version, word[right].version);
    };
    for (int64_t k = 0; k + 1 < static_cast<int64_t>(word.size()); ++k) offer(k);
    while (!heap.empty()) {
      const auto [rank, left, right, left_version, right_version] = heap.top();
      heap.pop();
      Symbol &a = word[left], &b = word[right];
      if (!a.alive || !b.alive || a.next != right || a.version != left_version ||
          b.version != right_version)
        continue;
      a.text += b.text;
      ++a.version;
      b.alive = false;
      ++b.version;
      a.next = b.next;
      if (b.next >= 0) word[b.next].prev = left;
      offer(a.prev);
      offer(left);
    }
    for (const Symbol& symbol : word)
      if (symbol.alive) piece_ids.push_back(vocab_.at(symbol.text));
  }
  ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
  const std::lock_guard<std::mutex> lock(cache_mutex);
  if (cache_->size() > 200000) cache_->clear();
  cache_->emplace(piece, std::move(piece_ids));
}

std::string BpeTokenizer::decode_text(const std::vector<int64_t>& ids) const {
  std::vector<int64_t> known;
  for (const int64_t id : ids)
    if (added_text_.count(id) || symbols_.count(id)) known.push_back(id);
  return bpe_unicode::utf8_lossy(decode(known));
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (const int64_t id : ids) {
    if (const auto a = added_text_.find(id); a != added_text_.end()) {
      out += a->second;
      continue;
    }
    const auto s = symbols_.find(id);
    if (s == symbols_.end())
      throw Error("BpeTokenizer::decode: id " + std::to_string(id) + " is not in the vocabulary");
    const std::string& symbol = s->second;
    if (id == eot_ || added_text_.count(id)) {
      out += symbol;
      continue;
    }
    for (size_t i = 0; i < symbol.size();) {
      const auto [cp, len] = char_at(symbol, i);
      (void)cp;
      const auto b = symbol_byte_.find(symbol.substr(i, len));
      if (b == symbol_byte_.end()) {
        out += symbol.substr(i, len);  // a special token's own text
      } else {
        out += static_cast<char>(b->second);
      }
      i += len;
    }
  }
  return out;
}

}  // namespace fabric
