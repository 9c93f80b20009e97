#include "examples/finetune_demo.h"

#include <torch/utils.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "examples/gpt_text.h"
#include "fabric/checkpoint/state_dict.h"
#include "fabric/config/config.h"
#include "fabric/core/error.h"
#include "fabric/data/bpe.h"
#include "fabric/hf/export.h"
#include "fabric/models/llama.h"

namespace examples::finetune {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kEos = 256;  // <|endoftext|>; <|im_start|> 257, <|im_end|> 258
// The embedding's rows: the tokenizer's 259 ids padded to a multiple of 8, so tensor parallelism
// (which splits the vocabulary) runs the demo at tp 2, 4 and 8; ids 259-263 are never produced.
constexpr int64_t kVocab = 264;
// Written to the folder's "done": a demo of another version (an older vocabulary) is rebuilt.
constexpr const char* kDemoVersion = "3 vocab 264, chat template\n";
// tokenizer_config.json's chat template: ChatML, as data.template chatml writes it (the one
// data.template chat_template and generate.template chat_template read).
constexpr const char* kChatTemplate =
    "{%- for message in messages %}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n";

fabric::models::LlamaConfig tiny_llama() {
  fabric::models::LlamaConfig c;
  c.vocab_size = kVocab;
  c.hidden_size = 64;
  c.intermediate_size = 176;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = true;
  return c;
}

// A byte-level BPE without merges: every byte its own id, as `tokenizers` reads the file.
nlohmann::ordered_json byte_tokenizer() {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  const auto symbols = fabric::byte_level_symbols();
  for (size_t b = 0; b < symbols.size(); ++b) vocab[symbols[b]] = static_cast<int64_t>(b);
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  const char* specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (int64_t i = 0; i < 3; ++i) {
    vocab[specials[i]] = kEos + i;
    added.push_back({{"id", kEos + i},
                     {"content", specials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder",
           {{"type", "ByteLevel"},
            {"add_prefix_space", true},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", nlohmann::ordered_json::array()}}}};
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out.flush()) throw fabric::Error("cannot write " + path.string());
}

// Seed 0 for the model, the run's CPU generator as it was afterwards: a run that writes the demo
// draws what one that reads it draws, and local rank 0 stays in step with the other ranks
// (tensor-parallel ranks draw the same dropout masks).
fabric::models::Llama seeded_llama(const fabric::models::LlamaConfig& c) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  struct Restore {
    at::Generator& g;
    at::Tensor state;
    ~Restore() { g.set_state(state); }
  } restore{generator, generator.get_state()};
  torch::manual_seed(0);
  return fabric::models::Llama(c);
}

void write_model(const fs::path& folder) {
  const fabric::models::LlamaConfig c = tiny_llama();
  fabric::models::Llama model = seeded_llama(c);
  fabric::StateDict state;
  for (const auto& p : model->named_parameters()) state.emplace_back(p.key(), p.value().detach());
  fabric::hf::ExportExtras extras;
  extras.config["eos_token_id"] = kEos;
  extras.config["bos_token_id"] = kEos;
  fabric::hf::save_llama(c, state, folder, int64_t{1} << 40, extras);
  write_text(folder / "tokenizer.json", byte_tokenizer().dump(1) + "\n");
  write_text(folder / "tokenizer_config.json", nlohmann::json({{"eos_token", "<|endoftext|>"},
                                                               {"add_bos_token", false},
                                                               {"chat_template", kChatTemplate}})
                                                       .dump(1) +
                                                   "\n");
}

// One example per public function with a one-line docstring start, in sorted file order.
int64_t write_examples(const fs::path& stdlib, const fs::path& train, const fs::path& val,
                       int64_t* val_count) {
  std::vector<fs::path> files;
  for (const auto& e :
       fs::recursive_directory_iterator(stdlib, fs::directory_options::skip_permission_denied)) {
    const fs::path& p = e.path();
    if (p.extension() != ".py" || !e.is_regular_file()) continue;
    bool skip = false;
    for (const auto& part : fs::relative(p, stdlib))
      skip = skip || part == "test" || part == "tests" || part == "site-packages" ||
             part == "idlelib" || part.string().rfind("_", 0) == 0;
    if (!skip) files.push_back(p);
  }
  std::sort(files.begin(), files.end());
  const std::regex def(R"(^\s*def ([A-Za-z][A-Za-z0-9_]*)\(([^()]*)\):\s*$)");
  const std::regex doc(R"(^\s*[rR]?"""([^"]{16,160}?)(\.|""")?\s*$)");
  std::ofstream t(train), v(val);
  int64_t n = 0, in_val = 0;
  for (const fs::path& file : files) {
    std::ifstream in(file);
    std::string module = fs::relative(file, stdlib).replace_extension().string();
    std::replace(module.begin(), module.end(), '/', '.');
    std::string line, previous;
    std::smatch m, d;
    std::string name, args;
    while (std::getline(in, line)) {
      if (!name.empty() && std::regex_match(line, d, doc)) {
        const std::string prompt =
            "What does " + name + "(" + args + ") in Python's " + module + " module do?";
        const std::string response = d[1].str() + (d[2].str() == "." ? "." : "");
        const std::string json =
            nlohmann::json({{"prompt", prompt}, {"response", response}}).dump() + "\n";
        (++n % 10 == 0 ? (++in_val, v) : t) << json;
      }
      name.clear();
      if (line.find("def ") != std::string::npos && std::regex_match(line, m, def)) {
        name = m[1].str();
        args = m[2].str();
      }
    }
  }
  if (!t.flush() || !v.flush()) throw fabric::Error("cannot write " + train.string());
  *val_count = in_val;
  return n - in_val;
}

int64_t count_lines(const fs::path& path) {
  std::ifstream in(path);
  return std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n');
}

}  // namespace

Demo prepare_demo(fabric::Fabric& f, const fs::path& cache) {
  const std::string stdlib = examples::gpt::python_stdlib();
  if (stdlib.empty())
    throw fabric::ConfigError(
        "model.pretrained: not set, and no Python standard library was found to make the demo's "
        "instruction data (python3 is not on PATH); set model.pretrained=DIR and data.train=FILE");
  const fs::path root = cache / ("finetune-demo-" + fs::path(stdlib).filename().string());
  Demo d{root / "model", root / "train.jsonl", root / "val.jsonl"};
  const bool current = [&] {
    std::ifstream in(root / "done");  // missing: empty, so not current
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()) ==
           kDemoVersion;
  }();
  if (f.local_rank() == 0 && !current) {
    f.print(
        "model.pretrained is not set: building the demo, a tiny random Llama and instruction "
        "data from the docstrings of ",
        stdlib, ", in ", root.string());
    // The cache's own folder, rebuilt whole (an older or cut build of it carries no export mark,
    // which save_llama would refuse to write over).
    fs::remove_all(d.model);
    fs::create_directories(d.model);
    write_model(d.model);
    int64_t val = 0;
    write_examples(stdlib, d.train, d.val, &val);
    write_text(root / "done", kDemoVersion);
  }
  f.barrier();
  d.train_examples = count_lines(d.train);
  d.val_examples = count_lines(d.val);
  f.print("finetune demo: ", d.model.string(), " (2 layers, width 64, byte tokenizer), ",
          d.train_examples, " train / ", d.val_examples,
          " val examples; model.pretrained=DIR data.train=FILE fine-tunes yours");
  return d;
}

}  // namespace examples::finetune
