#include "examples/gpt_text.h"

#include <torch/nn/module.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/core/paths.h"
#include "fabric/data/bpe.h"
#include "fabric/data/tokens.h"

namespace examples::gpt {

namespace fs = std::filesystem;

fs::path cache_home() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  return xdg && *xdg ? fs::path(xdg) / "fabricpp" : fs::path(home ? home : ".") / ".cache/fabricpp";
}

std::string python_stdlib() {
  FILE* p = popen(
      "python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"stdlib\"])' "
      "2>/dev/null",
      "r");
  if (!p) return "";
  char line[4096] = {0};
  const bool got = fgets(line, sizeof(line), p) != nullptr;
  pclose(p);
  std::string path = got ? line : "";
  while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
  return path;
}

fs::path data_root(fabric::Fabric& f) {
  const fabric::Config& c = f.config();
  const std::string root = c.get_string("data.root");
  if (!root.empty()) {
    const fs::path dir = fabric::absolute_from_working_directory(root);
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
      throw c.error_at("data.root",
                       dir.string() +
                           (fs::exists(dir, ec) ? " is not a folder" : ": no such folder") +
                           "; give the folder tools/prepare_text wrote (train.bin, val.bin, "
                           "meta.json)");
    return dir;
  }
  const std::string stdlib = python_stdlib();
  if (stdlib.empty())
    throw fabric::ConfigError(
        "data.root: not set, and no Python standard library was found for the default corpus "
        "(python3 is not on PATH); prepare text with `bazel run //tools:prepare_text -- "
        "--input=PATH --output=DIR` and set data.root=DIR");
  fs::path cache = c.get_string("gpt.corpus_cache");
  if (cache.empty()) cache = cache_home();
  const fs::path out = cache / ("text-" + fs::path(stdlib).filename().string() + "-stdlib-bytes");
  if (f.local_rank() == 0 && !fs::exists(out / "meta.json")) {
    f.print("data.root is not set: preparing the default corpus, the Python sources of ", stdlib,
            " (tests left out), as byte tokens in ", out.string());
    // Test suites are mostly generated data; site-packages differs between machines.
    auto accept = [](const fs::path& p) {
      if (p.extension() != ".py") return false;
      for (const auto& part : p)
        if (part == "test" || part == "tests" || part == "site-packages" || part == "idlelib")
          return false;
      return true;
    };
    fabric::prepare_byte_text({stdlib}, out, 0.05, accept);
  }
  f.barrier();
  f.print("data: the default corpus (Python ", fs::path(stdlib).filename().string(),
          " standard library sources, byte tokens) in ", out.string(),
          "; data.root=DIR trains on yours");
  return out;
}

Meta read_meta(const fs::path& root) {
  Meta meta;
  static_cast<fabric::TokenMeta&>(meta) = fabric::read_token_meta(root);
  return meta;
}

void check_prompt(const fabric::Config& c, Meta& meta, int64_t model_vocab) {
  if (c.get_int("gpt.sample_tokens") == 0) return;
  if (meta.tokenizer == "gpt2-bpe" || meta.tokenizer == "hf-tokenizer") {
    try {
      meta.bpe = std::make_shared<const fabric::BpeTokenizer>(fabric::load_meta_tokenizer(meta));
    } catch (const fabric::Error& e) {
      throw fabric::Error(std::string(e.what()) + " (or gpt.sample_tokens=0: no sample)");
    }
  } else if (meta.tokenizer != "bytes") {
    meta.no_sample =
        "(no sample: data.root/meta.json names no tokenizer tools/prepare_text writes)";
    return;
  }
  meta.prompt = fabric::encode_checked(meta, meta.bpe.get(), c.get_string("gpt.prompt"),
                                       model_vocab, "gpt.prompt");
  if (meta.prompt.empty() && meta.bpe && meta.bpe->eot() >= 0)
    meta.prompt.push_back(meta.bpe->eot());
  if (meta.prompt.empty()) meta.prompt.push_back(meta.bpe ? 0 : '\n');
}

std::string sample(fabric::Fabric& f, torch::nn::Module& model,
                   const std::function<torch::Tensor(const torch::Tensor&)>& logits_of,
                   int64_t positions, const Meta& meta, const std::vector<int64_t>& eos) {
  const fabric::Config& c = f.config();
  const int64_t n = c.get_int("gpt.sample_tokens"), top_k = c.get_int("gpt.top_k");
  if (n == 0) return "";
  if (!meta.no_sample.empty()) return meta.no_sample;
  const auto& bpe = meta.bpe;
  std::vector<int64_t> ids = meta.prompt;
  if (ids.empty()) return "(no sample: gpt.prompt was not encoded (check_prompt))";
  auto gen = at::detail::createCPUGenerator(1234);
  torch::NoGradGuard no_grad;
  model.eval();
  for (int64_t i = 0; i < n; ++i) {
    const auto begin =
        ids.size() > static_cast<size_t>(positions) ? ids.end() - positions : ids.begin();
    const torch::Tensor x = torch::tensor(std::vector<int64_t>(begin, ids.end())).view({1, -1});
    torch::Tensor logits;
    {
      auto guard = f.autocast();
      logits = logits_of(x.to(f.device()));
    }
    logits = logits[0][-1].to(torch::kCPU, torch::kDouble);
    if (meta.vocab_size > 0 && meta.vocab_size < logits.size(0))  // the padding's ids: never
      logits = logits.narrow(0, 0, meta.vocab_size);
    // Shifted so the largest is 0 before dividing: a tiny temperature gives -inf, not inf - inf.
    logits = (logits - logits.max()) / c.get_double("gpt.temperature");
    if (top_k > 0 && top_k < logits.size(0)) {
      const double kth = std::get<0>(logits.topk(top_k))[-1].item<double>();
      logits.masked_fill_(logits < kth, -INFINITY);
    }
    ids.push_back(torch::multinomial(torch::softmax(logits, 0), 1, false, gen).item<int64_t>());
    if (std::find(eos.begin(), eos.end(), ids.back()) != eos.end()) break;
  }
  model.train();
  return bpe ? bpe->decode(ids) : std::string(ids.begin(), ids.end());
}

void check_tokenizer(fabric::Fabric& f, const fabric::hf::Pretrained& p, const Meta& meta) {
  const fs::path own = p.folder / "tokenizer.json";
  auto contents = [](const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  std::string problem;
  if (meta.tokenizer != "hf-tokenizer") {
    problem = "data.root/meta.json names the tokenizer '" +
              (meta.tokenizer.empty() ? std::string("(none)") : meta.tokenizer) + "'";
  } else if (fs::exists(own) && meta.tokenizer_json != own &&
             contents(meta.tokenizer_json) != contents(own)) {
    problem = "data.root's tokens come from " + meta.tokenizer_json.string() +
              ", whose contents differ from " + own.string();
  }
  if (!problem.empty())
    f.print("warning: model.pretrained: ", problem,
            "; the model reads ids as its own tokenizer made them (tools/prepare_text "
            "--tokenizer=",
            own.string(), ")");
}

}  // namespace examples::gpt
