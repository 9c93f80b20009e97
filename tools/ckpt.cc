// bazel run //tools:ckpt -- inspect PATH
//                         verify PATH
//                         consolidate PATH OUT [--entry=model]
//                         hf PATH OUT [--entry=model] [--max-shard-bytes=N] [--config=YAML]
//                         diff PATH_A PATH_B
//
// Tools for the checkpoints Fabric::save writes (a .ckpt file or a sharded folder) and for weights
// (.pt, .safetensors, a Hugging Face folder's model.safetensors or its shards; a .pt holding a
// bare tensor or a list counts as weights too):
//   inspect      what the file records about its run (format version, LibTorch, revision, config
//                hash, world size, time) and every entry of its state, tensors with shape and dtype
//                (Lightning's and Accelerate's "what is in this checkpoint").
//   verify       every byte checked as loading would check it (each record's CRC; for a folder the
//                manifest, every file's size, and that the pieces cover every split tensor once),
//                streaming: no tensor is held in memory. A .safetensors file: its header and every
//                byte range (the format has no checksums); a Hugging Face folder: its index and
//                every shard so.
//   consolidate  one full weights file from a checkpoint (a sharded folder joined): the state
//                entry --entry (default model) as a state dict, written as OUT's extension says
//                (.safetensors: Hugging Face's format; else torch.save's), which Python reads
//                (torch.load(OUT, weights_only=True) or safetensors.torch.load_file(OUT)). OUT is
//                refused before anything is read when it is PATH, lies inside it, is or lies
//                inside any checkpoint, is a FIFO or device, or is an existing file that is not
//                a weights file (fabric/checkpoint/output_check.h).
//   hf           a Hugging Face folder from a checkpoint (file or sharded folder, joined as
//                consolidate joins it) that transformers.AutoModelForCausalLM.from_pretrained
//                loads (fabric/hf/export.h): config.json and model.safetensors, or above
//                --max-shard-bytes (default 5 GB) the shards and model.safetensors.index.json. The
//                architecture comes from the run's resolved config the checkpoint records (or, for
//                a weights file, --config=YAML, the run's config): with model.pretrained (a Hugging
//                Face folder, found from the working directory) that folder's config.json (llama,
//                qwen2, mistral or gpt2), its tokenizer and generation files copied along; else
//                the GPT of the model.* keys (vocabulary and positions from the weights' shapes)
//                as a GPT-2 folder (GPT2LMHeadModel, activation_function gelu_new: the GPT's tanh
//                GELU). OUT is refused as consolidate refuses it, and when it is a non-empty folder
//                that is not a Hugging Face folder (one is replaced, its other files kept).
//   diff         per tensor, the largest absolute difference between two checkpoints or weight
//                files, tensors only in one, or of another shape; the last line the largest. A
//                checkpoint against a weights file compares the weights with the checkpoint's
//                state entry --entry (default model).
// --entry (consolidate, hf, diff) names a checkpoint's state entry; for weights it defaults to
// their one entry, "weights". A flag a command does not read is a usage error.
// Exit status: 0 done (diff: whatever the differences); 1 a file cannot be read, is damaged or
// has no such entry; 2 bad usage (including a refused OUT).
#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <torch/types.h>

#include "examples/gpt_recipe.h"
#include "fabric/checkpoint/output_check.h"
#include "fabric/checkpoint/safetensors.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/checkpoint/state_dict.h"
#include "fabric/config/config.h"
#include "fabric/core/error.h"
#include "fabric/core/paths.h"
#include "fabric/hf/config_reader.h"
#include "fabric/hf/export.h"
#include "fabric/hf/gpt2.h"
#include "fabric/hf/llama.h"
#include "fabric/hf/weights.h"

namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage =
    "usage: ckpt inspect PATH | verify PATH | consolidate PATH OUT [--entry=NAME] | hf PATH OUT "
    "[--entry=NAME] [--max-shard-bytes=N] [--config=YAML] | diff A B\n";

int usage(const std::string& why) {
  std::cerr << "ckpt: " << why << "\n" << kUsage;
  return 2;
}

std::string shape_of(const torch::Tensor& t) {
  std::string out = "[";
  for (int64_t i = 0; i < t.dim(); ++i) out += (i ? ", " : "") + std::to_string(t.size(i));
  return out + "]";
}

// A Hugging Face model folder (model.safetensors or its index, and no checkpoint manifest).
bool is_hf_folder(const fs::path& path) {
  return fs::is_directory(path) && !fs::exists(path / fabric::kShardedManifest) &&
         (fs::exists(path / "model.safetensors") ||
          fs::exists(path / "model.safetensors.index.json"));
}

// {"state": {"weights": value}}.
c10::IValue as_weights(c10::IValue value) {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("weights", std::move(value));
  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("state", state);
  return top;
}

// A checkpoint (file or folder) or weights, as one value: weights (a safetensors file, a Hugging
// Face folder's files, a .pt holding a plain state dict, or one holding anything but a dict: a
// bare tensor, a list) become {"state": {"weights": value}}, and `weights_file` (when given) says
// so.
c10::IValue read_any(const fs::path& path, bool* weights_file = nullptr) {
  if (weights_file) *weights_file = true;
  const bool hf = is_hf_folder(path);
  if (hf || (!fs::is_directory(path) && fabric::is_safetensors_file(path))) {
    c10::impl::GenericDict weights(c10::StringType::get(), c10::AnyType::get());
    for (auto& [name, t] :
         hf ? fabric::hf::read_weights(path).tensors : fabric::load_safetensors(path).tensors)
      weights.insert(name, t);
    return as_weights(weights);
  }
  c10::IValue value = fabric::read_checkpoint(path);
  if (!value.isGenericDict() || !value.toGenericDict().contains("state")) return as_weights(value);
  if (weights_file) *weights_file = false;
  return value;
}

std::string key_text(const c10::IValue& key) {
  return key.isString() ? key.toStringRef() : c10::str(key);
}

// Calls `leaf(path, value)` for every tensor and plain value under `value`.
void walk(const c10::IValue& value, const std::string& path,
          const std::function<void(const std::string&, const c10::IValue&)>& leaf) {
  const auto join = [&](const std::string& k) { return path.empty() ? k : path + "." + k; };
  if (value.isGenericDict()) {
    for (const auto& e : value.toGenericDict()) walk(e.value(), join(key_text(e.key())), leaf);
  } else if (value.isList()) {
    const auto list = value.toListRef();
    for (size_t i = 0; i < list.size(); ++i) walk(list[i], join(std::to_string(i)), leaf);
  } else if (value.isTuple()) {
    const auto& items = value.toTupleRef().elements();
    for (size_t i = 0; i < items.size(); ++i) walk(items[i], join(std::to_string(i)), leaf);
  } else {
    leaf(path, value);
  }
}

c10::IValue field(const c10::IValue& dict, const std::string& key) {
  if (!dict.isGenericDict()) return c10::IValue();
  const auto d = dict.toGenericDict();
  return d.contains(key) ? d.at(key) : c10::IValue();
}

int inspect(const fs::path& path) {
  const c10::IValue value = read_any(path);
  const c10::IValue meta = field(value, "fabric");
  if (meta.isGenericDict()) {
    for (const auto& e : meta.toGenericDict()) {
      const std::string k = key_text(e.key());
      if (k == "config") continue;  // the whole YAML: too long for a line
      std::string v = e.value().isString() ? e.value().toStringRef() : c10::str(e.value());
      if (k == "saved_unix_time" && e.value().isInt()) {
        const std::time_t t = static_cast<std::time_t>(e.value().toInt());
        char buf[64];
        std::tm when{};
        // A time gmtime cannot express (a damaged or foreign file): the number alone.
        if (gmtime_r(&t, &when) != nullptr &&
            std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &when) > 0)
          v += std::string(" (") + buf + ")";
      }
      std::cout << k << ": " << v << "\n";
    }
  }
  int64_t tensors = 0, elements = 0, bytes = 0;
  walk(field(value, "state"), "", [&](const std::string& name, const c10::IValue& v) {
    if (v.isTensor()) {
      const auto& t = v.toTensor();
      std::cout << name << "  " << c10::toString(t.scalar_type()) << " " << shape_of(t) << "\n";
      ++tensors;
      elements += t.numel();
      bytes += static_cast<int64_t>(t.nbytes());
    } else {
      std::cout << name << "  " << (v.isString() ? v.toStringRef() : c10::str(v)) << "\n";
    }
  });
  std::cout << "state: " << tensors << " tensors, " << elements << " elements, " << bytes
            << " bytes\n";
  return 0;
}

// The state dict of entry `entry` of a checkpoint's (or weights file's) `value`.
fabric::StateDict entry_state(const c10::IValue& value, const fs::path& path,
                              const std::string& entry) {
  const c10::IValue state = field(value, "state");
  std::string names;
  if (state.isGenericDict())
    for (const auto& e : state.toGenericDict())
      names += (names.empty() ? "" : ", ") + key_text(e.key());
  const c10::IValue chosen = field(state, entry);
  if (chosen.isNone())
    throw fabric::Error(path.string() + ": no entry '" + entry + "' in the state (there: " +
                        (names.empty() ? "none" : names) + "); choose one with --entry=NAME");
  return fabric::state_dict_from(chosen, path.string() + " (entry " + entry + ")");
}

// The files and folders the run that wrote `checkpoint` read, from its recorded config
// (model.pretrained, model.init_weights, data.*): an output never goes over or into them.
std::vector<fabric::InputPath> recorded_inputs(const c10::IValue& checkpoint) {
  std::vector<fabric::InputPath> inputs;
  const c10::IValue saved = field(field(checkpoint, "fabric"), "config");
  if (!saved.isString()) return inputs;
  std::map<std::string, std::string> leaves;
  try {
    leaves = fabric::config_leaves(saved.toStringRef());
  } catch (const fabric::Error&) {
    return inputs;  // a config that is not YAML names nothing
  }
  for (const char* key :
       {"model.pretrained", "model.init_weights", "data.train", "data.val", "data.root"}) {
    const auto it = leaves.find(key);
    if (it == leaves.end() || it->second.empty() || it->second == "none" || it->second == "~")
      continue;
    const bool whole = std::string(key) != "data.root";  // a data folder: the files it names
    inputs.push_back({fabric::absolute_from_working_directory(it->second),
                      std::string("the run's ") + key, whole});
  }
  return inputs;
}

int consolidate(const fs::path& path, const fs::path& out, std::string entry, bool entry_given) {
  bool weights_file = false;
  const c10::IValue value = read_any(path, &weights_file);
  if (weights_file && !entry_given) entry = "weights";  // read_any's name for a weights file's
  // Never into what the run read (its model.pretrained folder's model.safetensors, say).
  try {
    auto inputs = recorded_inputs(value);
    inputs.push_back({path, "the checkpoint read"});
    fabric::check_weights_output(out, "OUT", inputs);
  } catch (const fabric::Error& e) {
    return usage(e.what());
  }
  const fabric::StateDict weights = entry_state(value, path, entry);
  fabric::save_state_dict(out, weights);
  int64_t elements = 0;
  for (const auto& [name, t] : weights) elements += t.numel();
  std::cout << out.string() << ": " << weights.size() << " tensors, " << elements
            << " elements (entry " << entry << " of " << path.string() << ")\n";
  return 0;
}

const torch::Tensor* find_tensor(const fabric::StateDict& state, const std::string& name) {
  for (const auto& [n, t] : state)
    if (n == name) return &t;
  return nullptr;
}

// `ckpt hf`: the architecture from the run's config (see the header comment), then
// fabric::hf::save_llama or save_gpt2.
int to_hf(const fs::path& path, const fs::path& out, std::string entry, bool entry_given,
          int64_t max_shard_bytes, const std::string& config_file) {
  bool weights_file = false;
  const c10::IValue value = read_any(path, &weights_file);
  std::string yaml, source = path.string() + "'s config";
  if (!config_file.empty()) {
    const fabric::Config loaded = fabric::Config::load(config_file, {}, examples::gpt::schema());
    yaml = loaded.to_yaml();
    source = config_file;
  } else if (const c10::IValue saved = field(field(value, "fabric"), "config"); saved.isString()) {
    yaml = saved.toStringRef();
  } else {
    throw fabric::Error(path.string() +
                        ": records no config (a weights file); give the run's config with "
                        "--config=YAML");
  }
  // A fine-tuning run's checkpoint (examples:finetune): its own export writes the folder.
  if (config_file.empty()) {
    std::map<std::string, std::string> leaves;
    try {
      leaves = fabric::config_leaves(yaml);
    } catch (const fabric::Error&) {
    }
    for (const auto& [key, value] : leaves)
      if (key.rfind("finetune.", 0) == 0)
        throw fabric::Error(
            path.string() +
            ": a checkpoint of examples:finetune, which ckpt hf does not convert (it converts "
            "examples:gpt's); resume the run with checkpoint.resume=PATH and its end exports the "
            "Hugging Face folder (checkpoint.export_weights; finetune.lora.merge_on_export=true "
            "for a merged model)");
  }
  if (weights_file && !entry_given) entry = "weights";  // read_any's name for its tensors
  const fabric::StateDict state = entry_state(value, path, entry);
  const fabric::Config c = fabric::Config::parse(yaml, {}, examples::gpt::schema(), source);
  std::string pretrained;
  try {
    pretrained = c.get_string("model.pretrained");
  } catch (const fabric::Error&) {
    // A schema without the key: the GPT of model.*.
  }
  std::string written;
  if (!pretrained.empty()) {
    const fs::path folder = fabric::absolute_from_working_directory(pretrained);
    fabric::check_output(out, "OUT", {{path, "the checkpoint read"}, {folder, "model.pretrained"}},
                         /*folder=*/true);
    const auto [json, config_path] = fabric::hf::read_config_json(folder);
    const fabric::hf::ConfigReader r(json, config_path, "a Hugging Face config.json names it");
    const std::string type = r.string("model_type", "");
    fabric::hf::ExportExtras extras;
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                          "special_tokens_map.json", "vocab.json", "merges.txt"})
      if (fs::is_regular_file(folder / f)) extras.copy_files.push_back(folder / f);
    for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
      if (r.has(key)) extras.config[key] = json[key];
    if (type == "gpt2") {
      fabric::hf::save_gpt2(fabric::hf::read_gpt2_config(folder), state, out, max_shard_bytes,
                            extras);
    } else {
      fabric::hf::save_llama(fabric::hf::read_llama_config(folder), state, out, max_shard_bytes,
                             extras);
    }
    written = (type.empty() ? std::string("?") : type) + " (model.pretrained " + pretrained + ")";
  } else {
    fabric::models::GPTConfig gpt = examples::gpt::model_config(c, 0);
    // The vocabulary (the data's, padded) and positions the run trained with: the weights'.
    if (const auto* wte = find_tensor(state, "transformer.wte.weight"))
      gpt.vocab_size = wte->size(0);
    if (const auto* wpe = find_tensor(state, "transformer.wpe.weight"))
      gpt.block_size = wpe->size(0);
    fabric::hf::save_gpt2(gpt, state, out, max_shard_bytes);
    written = "gpt2 (the GPT of model.*: " + std::to_string(gpt.n_layer) + " layers, " +
              std::to_string(gpt.n_head) + " heads, " + std::to_string(gpt.n_embd) + " wide)";
  }
  int64_t elements = 0;
  for (const auto& [name, t] : state) elements += t.numel();
  std::cout << out.string() << ": a Hugging Face " << written << " folder, " << state.size()
            << " tensors, " << elements << " elements (entry " << entry << " of " << path.string()
            << ")\n";
  return 0;
}

// {"state": {entry: value}} of a checkpoint's state entry `entry`, renamed `as`.
c10::IValue only_entry(const c10::IValue& checkpoint, const std::string& entry,
                       const std::string& as, const fs::path& path) {
  const c10::IValue chosen = field(field(checkpoint, "state"), entry);
  if (chosen.isNone())
    throw fabric::Error(path.string() + ": no entry '" + entry +
                        "' in the state to compare with the weights file; choose one with "
                        "--entry=NAME");
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert(as, chosen);
  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("state", state);
  return top;
}

int diff(const fs::path& a, const fs::path& b, const std::string& entry) {
  std::map<std::string, torch::Tensor> left, right;
  std::map<std::string, std::string> left_values, right_values;
  const auto collect = [](const c10::IValue& v, std::map<std::string, torch::Tensor>& tensors,
                          std::map<std::string, std::string>& values) {
    walk(field(v, "state"), "", [&](const std::string& name, const c10::IValue& leaf) {
      if (leaf.isTensor()) {
        tensors[name] = leaf.toTensor();
      } else {
        values[name] = leaf.isString() ? leaf.toStringRef() : c10::str(leaf);
      }
    });
  };
  bool a_weights = false, b_weights = false;
  c10::IValue va = read_any(a, &a_weights), vb = read_any(b, &b_weights);
  // A checkpoint against a weights file (its own export, say): the weights against the
  // checkpoint's --entry, not every entry of the checkpoint against nothing.
  if (a_weights != b_weights) {
    const fs::path& checkpoint = a_weights ? b : a;
    std::cout << "comparing the weights file " << (a_weights ? a : b).string() << " with entry '"
              << entry << "' of " << checkpoint.string() << "\n";
    (a_weights ? vb : va) = only_entry(a_weights ? vb : va, entry, "weights", checkpoint);
  }
  collect(va, left, left_values);
  collect(vb, right, right_values);
  double largest = 0;
  std::string largest_name;
  int64_t differing = 0;
  for (const auto& [name, t] : left) {
    const auto other = right.find(name);
    if (other == right.end()) {
      std::cout << name << "  only in " << a.string() << "\n";
      ++differing;
      continue;
    }
    const auto& u = other->second;
    if (t.sizes() != u.sizes()) {
      std::cout << name << "  shape " << shape_of(t) << " vs " << shape_of(u) << "\n";
      ++differing;
      continue;
    }
    // In double (int64 extremes would overflow a long subtraction); equal elements, NaN beside
    // NaN and infinities of one sign included, differ by 0 (a file against itself: 0 differ).
    double d = 0.0;
    if (t.numel() > 0) {
      const torch::Tensor x = t.to(torch::kDouble), y = u.to(torch::kDouble);
      const torch::Tensor same = (x == y).logical_or(x.isnan().logical_and(y.isnan()));
      d = torch::where(same, torch::zeros_like(x), (x - y).abs()).max().item<double>();
    }
    if (d != 0 || std::isnan(d)) {
      std::cout << name << "  max |a - b| " << d << "\n";
      ++differing;
    }
    if (d > largest || std::isnan(d)) {
      largest = d;
      largest_name = name;
    }
  }
  for (const auto& [name, t] : right)
    if (!left.count(name)) {
      std::cout << name << "  only in " << b.string() << "\n";
      ++differing;
    }
  for (const auto& [name, v] : left_values) {
    const auto other = right_values.find(name);
    if (other != right_values.end() && other->second != v) {
      std::cout << name << "  " << v << " vs " << other->second << "\n";
      ++differing;
    }
  }
  std::cout << differing << " of " << left.size() + left_values.size()
            << " entries differ; largest tensor difference " << largest
            << (largest_name.empty() ? "" : " (" + largest_name + ")") << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args, flags;  // flags: the names given, for the check below
  std::string entry = "model", config_file;
  int64_t max_shard_bytes = 5'000'000'000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) == 0 && a != "--help") flags.push_back(a.substr(0, a.find('=')));
    if (a.rfind("--entry=", 0) == 0) {
      entry = a.substr(8);
    } else if (a.rfind("--config=", 0) == 0) {
      config_file = a.substr(9);
    } else if (a.rfind("--max-shard-bytes=", 0) == 0) {
      try {
        size_t used = 0;
        max_shard_bytes = std::stoll(a.substr(18), &used);
        if (used != a.size() - 18 || max_shard_bytes < 1) throw std::invalid_argument(a);
      } catch (const std::exception&) {
        return usage(a + ": not a positive number of bytes");
      }
    } else if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (a.rfind("--", 0) == 0) {
      return usage("unknown flag " + a);
    } else {
      args.push_back(a);
    }
  }
  if (args.empty()) return usage("no command");
  const std::string command = args[0];
  // A flag the command does not read is refused, not ignored.
  const std::map<std::string, std::vector<std::string>> applies = {
      {"inspect", {}},
      {"verify", {}},
      {"consolidate", {"--entry"}},
      {"hf", {"--entry", "--max-shard-bytes", "--config"}},
      {"diff", {"--entry"}}};
  const auto known = applies.find(command);
  if (known == applies.end()) return usage("unknown command '" + command + "'");
  for (const std::string& flag : flags)
    if (std::find(known->second.begin(), known->second.end(), flag) == known->second.end())
      return usage(flag + " does not apply to " + command +
                   (known->second.empty() ? std::string(" (it takes no flags)") : ""));
  const bool entry_given = std::find(flags.begin(), flags.end(), "--entry") != flags.end();
  const auto path = [&](size_t i) { return fabric::absolute_from_working_directory(args[i]); };
  try {
    if (command == "inspect" && args.size() == 2) return inspect(path(1));
    if (command == "verify" && args.size() == 2 && is_hf_folder(path(1))) {
      const auto weights = fabric::hf::read_weights(path(1));
      std::set<fs::path> files;
      for (const auto& [name, file] : weights.file) files.insert(file);
      std::cout << path(1).string() << ": a Hugging Face folder, " << files.size()
                << " safetensors file(s), " << weights.tensors.size()
                << " tensors; the index, every header and every byte range checked, OK (the "
                   "format has no checksums)\n";
      return 0;
    }
    if (command == "verify" && args.size() == 2 && fabric::is_safetensors_file(path(1))) {
      const auto file = fabric::load_safetensors(path(1));
      std::cout << path(1).string() << ": a safetensors file, " << file.tensors.size()
                << " tensors; its header and every byte range checked, OK (the format has no "
                   "checksums)\n";
      return 0;
    }
    if (command == "verify" && args.size() == 2) {
      fabric::verify_checkpoint(path(1));
      std::cout << path(1).string() << ": every record checked, OK\n";
      return 0;
    }
    if (command == "consolidate" && args.size() == 3) {
      // Never over the checkpoint read, nor into any checkpoint; checked before reading.
      try {
        fabric::check_weights_output(path(2), "OUT", {{path(1), "the checkpoint read"}});
      } catch (const fabric::Error& e) {
        return usage(e.what());
      }
      return consolidate(path(1), path(2), entry, entry_given);
    }
    if (command == "hf" && args.size() == 3) {
      try {
        fabric::check_output(path(2), "OUT", {{path(1), "the checkpoint read"}}, /*folder=*/true);
        fabric::check_export_folder(path(2), "OUT");  // never another model's folder
      } catch (const fabric::Error& e) {
        return usage(e.what());
      }
      return to_hf(path(1), path(2), entry, entry_given, max_shard_bytes, config_file);
    }
    if (command == "diff" && args.size() == 3) return diff(path(1), path(2), entry);
  } catch (const c10::Error& e) {
    // LibTorch's text without its C++ stack trace, on one line.
    std::cerr << "ckpt: " << fabric::one_line(e.what_without_backtrace(), 300) << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ckpt: " << fabric::describe(e) << "\n";
    return 1;
  }
  return usage("bad command line");
}
