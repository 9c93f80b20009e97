// The fixture of the examples/gpt tests (gpt_example_test, gpt_model_parallel_test): a small
// byte-level corpus written for each test, the tiny GPT's arguments, and what a run wrote.
#ifndef TESTS_INTEGRATION_GPT_EXAMPLE_FIXTURE_H_
#define TESTS_INTEGRATION_GPT_EXAMPLE_FIXTURE_H_

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fabric/checkpoint/sharded.h"
#include "fabric/data/tokens.h"
#include "tests/integration/examples_fixture.h"

namespace fabric::testing {

class GptExampleTest : public ExamplesTest {
 protected:
  void SetUp() override {
    ExamplesTest::SetUp();
    // ~40 KB of varied text: enough windows of 32 tokens for a few steps of 8 sequences.
    std::ofstream text(dir_ / "corpus.txt");
    for (int i = 0; i < 900; ++i)
      text << "def f" << i << "(x):\n    return x * " << (i * 7919) % 101 << " + " << i % 13
           << "\n";
    text.close();
    fabric::prepare_byte_text({dir_ / "corpus.txt"}, dir_ / "data", 0.1);
  }

  // A tiny GPT, fp32, 8 sequences of 32 tokens per optimizer step over `ranks` processes.
  std::string args(int ranks, const std::string& strategy = "ddp") const {
    return "--config=gpt_tiny.yaml data.root=" + (dir_ / "data").string() +
           " fabric.strategy=" + strategy + " fabric.devices=" + std::to_string(ranks) +
           " data.batch_size=" + std::to_string(8 / ranks) +
           " model.n_layer=2 model.n_head=2 model.n_embd=32 model.block_size=32"
           " trainer.max_steps=6 scheduler.warmup_steps=2 trainer.limit_eval_batches=2"
           " gpt.sample_tokens=0 logging.log_every_n_steps=2";
  }

  c10::IValue weights(const std::string& run, const std::string& file = "weights.pt") {
    return fabric::read_checkpoint(dir_ / run / file);
  }

  // `run`'s last checkpoint (a file or a sharded folder).
  fs::path last_checkpoint(const std::string& run) {
    fs::path last;
    for (const auto& e : fs::directory_iterator(dir_ / run / "checkpoints"))
      if (e.path().extension() == ".ckpt" && e.path() > last) last = e.path();
    return last;
  }
  // Its model and optimizer state.
  c10::IValue trained_state(const std::string& run) {
    const auto state =
        fabric::read_checkpoint(last_checkpoint(run)).toGenericDict().at("state").toGenericDict();
    c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
    for (const char* key : {"model", "optimizer"}) out.insert(key, state.at(key));
    for (const auto& e : state)  // trainer.ema_decay's averages
      if (e.key().toStringRef().rfind("ema.", 0) == 0) out.insert(e.key(), e.value());
    return out;
  }
};

}  // namespace fabric::testing

#endif  // TESTS_INTEGRATION_GPT_EXAMPLE_FIXTURE_H_
