// bazel run //examples:finetune -- --config=finetune_lora.yaml [key=value ...]
// bazel run //examples:finetune -- --config=finetune_lora.yaml model.pretrained=DIR
//     data.train=train.jsonl data.val=val.jsonl data.template=chat_template   (one line; or alpaca,
//     chatml, FILE.jinja, a TEXT with {prompt} and {response}; chat_template: the folder's own)
//
// Instruction fine-tuning of a Hugging Face Llama-family folder (llama, qwen2, mistral) or a
// GPT-2 folder (gpt2: LoRA on c_attn, c_proj, c_fc; docs/finetune.md): LoRA adapters on the layers
// finetune.lora.target_modules names (the base frozen; only the adapters train, are all-reduced and
// held by the optimizer), or every weight (finetune.method: full). The data: JSONL files read by
// fabric::InstructDataset (fabric/data/instruct.h) with the model's tokenizer.json, the loss on the
// response tokens only (the others' targets -100), padded per batch or packed (data.packed). Any
// strategy and precision the other examples take (under model_parallel the adapters split with
// their layers); checkpoints resume mid-epoch; the validation loss (response tokens only) every
// finetune.eval_every_n_steps and at the end; a greedy answer to finetune.sample_prompt at the end
// (any strategy; with the key/value cache where examples/common/decode.h says it runs).
//
// Without model.pretrained it builds a tiny Llama and instruction data from this machine's Python
// standard library (examples/finetune_demo.h) and fine-tunes that, and says so.
//
// Export at the end (checkpoint.export_weights, default {run_dir}/export): LoRA writes the peft
// adapter (adapter_model.safetensors, adapter_config.json: peft.PeftModel.from_pretrained loads
// it onto the base model), or with finetune.lora.merge_on_export=true the merged model as a
// Hugging Face folder; a full fine-tune writes the Hugging Face folder. The base folder's
// tokenizer files are copied beside a model folder. summary.json: train_loss, val_loss,
// tokens_per_s, trainable_params, parameters, steps, peak_tensor_bytes. Exit status: fabric/main.h
// (2: a config error; 3: stopped on non-finite losses).
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "examples/common/decode.h"
#include "examples/common/evaluations.h"
#include "examples/common/parallel_keys.h"
#include "examples/common/steps.h"
#include "examples/finetune_demo.h"
#include "examples/finetune_recipe.h"
#include "examples/gpt_recipe.h"
#include "examples/gpt_text.h"
#include "fabric/accelerators/memory.h"
#include "fabric/callbacks.h"
#include "fabric/checkpointer.h"
#include "fabric/core/error.h"
#include "fabric/core/paths.h"
#include "fabric/data/bpe.h"
#include "fabric/data/instruct.h"
#include "fabric/fabric.h"
#include "fabric/hf/pretrained.h"
#include "fabric/logging/progress.h"
#include "fabric/main.h"
#include "fabric/models/gpt.h"
#include "fabric/models/gpt_generate.h"
#include "fabric/models/llama.h"
#include "fabric/models/llama_generate.h"
#include "fabric/nn/empty_init.h"
#include "fabric/nn/lora.h"
#include "fabric/nonfinite_guard.h"
#include "fabric/training/activation_checkpoint.h"
#include "fabric/training/lr_scheduler.h"
#include "fabric/training/optimizers.h"

namespace fs = std::filesystem;
using examples::finetune::lora_options;
using examples::finetune::sample_ids;

namespace {

// The recipe on a model of type Model (fabric::models::Llama or GPT), built by `build`.
template <typename Model, typename Build>
int train(fabric::Fabric& f, const examples::finetune::Inputs& in, const Build& build) {
  using Clock = std::chrono::steady_clock;
  constexpr bool kLlama = std::is_same_v<Model, fabric::models::Llama>;
  const fabric::Config& c = f.config();
  const fs::path& folder = in.folder;
  const fabric::hf::Pretrained& p = in.pretrained;
  const auto& tokenizer = in.tokenizer;
  const auto& train_data = in.train;
  const auto& val_data = in.val;

  const bool lora = c.get_string("finetune.method") == "lora";
  fabric::nn::LoraOptions lopt = lora_options(c);
  // GPT-2's layers are Conv1D in Hugging Face (weights [in, out]): peft's adapter says so.
  lopt.fan_in_fan_out = !kLlama;
  if (lopt.base_dtype != fabric::nn::LoraBaseDtype::kAuto) {
    const std::string given = "'" + fabric::nn::to_string(lopt.base_dtype) + "'";
    if (!lora)
      throw c.error_at("finetune.lora.base_dtype",
                       given +
                           " stores a LoRA run's frozen base; finetune.method=full trains "
                           "the base: leave it auto (or set finetune.method=lora)");
    const std::string s = f.strategy().name();
    if ((s == "fsdp" || s == "model_parallel") && c.get_bool("fabric.empty_init"))
      throw c.error_at("finetune.lora.base_dtype",
                       given + " with fabric.empty_init under fabric.strategy=" + s +
                           " is not supported (the base loads after the strategy shards it); "
                           "set fabric.empty_init=false or finetune.lora.base_dtype=auto");
  }
  // The adapters are made with the model, so that under fabric.empty_init they are recorded with
  // the base and setup gives them the values a full construction draws (the same numbers either
  // way); they start as peft's (B = 0: the model begins equal to the base).
  std::vector<std::string> adapted;
  auto model = f.init_module([&] {
    Model m = build();
    if (lora) {
      try {
        adapted = fabric::nn::apply_lora(*m, lopt);
      } catch (const fabric::Error& e) {
        // A rank above a targeted layer's sizes is the rank's problem, anything else the targets'.
        const bool rank = std::string(e.what()).rfind("LoRA: rank", 0) == 0;
        throw c.error_at(rank ? "finetune.lora.rank" : "finetune.lora.target_modules", e.what());
      }
    }
    return m;
  });
  const fabric::hf::Weights weights = fabric::hf::model_weights(p);
  // The pretrained weights; the folder has no adapters: they keep their init. A LoRA model with
  // memory loads before setup (whole on each rank; the strategy then shards the loaded values),
  // an empty init's (no memory until setup) after it, gathered while loaded (the adapters kept),
  // and a full fine-tune after it (under fsdp and tp each rank copies only its part).
  const fabric::Fabric::KeepName keep_adapters =
      lora ? fabric::Fabric::KeepName(fabric::nn::is_lora_tensor) : nullptr;
  const bool load_after_setup = !lora || fabric::has_meta_tensors(*model);
  if (!load_after_setup) f.load_weights(model, weights.tensors, folder.string(), keep_adapters);
  // finetune.lora.base_dtype: the adapted layers' frozen weights in bf16 or float8 once loaded,
  // whole or split by tp (fabric::nn::store_lora_base), before fsdp would shard them.
  auto store_base = [&] {
    try {
      const auto stored = fabric::nn::store_lora_base(*model, lopt.base_dtype);
      if (!stored.empty())
        f.print("finetune: the frozen weights of ", stored.size(), " adapted layers kept as ",
                fabric::nn::to_string(lopt.base_dtype), " (finetune.lora.base_dtype)");
    } catch (const fabric::Error& e) {
      throw c.error_at("finetune.lora.base_dtype", e.what());
    }
  };
  if (lora && !load_after_setup) store_base();
  int64_t trainable = 0;  // counted on the whole model, before a strategy shards it
  for (const auto& t : model->parameters())
    if (t.requires_grad()) trainable += t.numel();
  // A LoRA run's optimizer holds only what trains (fsdp and model_parallel refuse frozen
  // parameters), under every strategy: its checkpoints number the adapters alike.
  const std::string strategy = f.strategy().name();
  auto optimizer = lora ? fabric::make_optimizer(c, *examples::finetune::trainable_tree(*model))
                        : fabric::make_optimizer(c, *model);
  f.setup(model, *optimizer);
  if (load_after_setup) f.load_weights(model, weights.tensors, folder.string(), keep_adapters);
  if (lora && load_after_setup) store_base();  // an empty init's base, loaded just now
  const int64_t parameters = p.parameters() + (lora ? trainable : 0);

  const bool checkpoint_layers = !c.get_string_list("model.activation_checkpointing").empty();
  auto step_loss = [&](const torch::Tensor& x, const torch::Tensor& y) {
    if (!checkpoint_layers) return model->loss(x, y);
    return model->loss(x, y, [](auto& layer, const torch::Tensor& h) {
      return fabric::checkpoint_activations(layer, h);
    });
  };
  const int64_t batch_size = c.get_int("data.batch_size");
  auto loader_options = [&] {
    return fabric::DataLoaderOptions()
        .batch_size(batch_size)
        .num_workers(c.get_int("data.num_workers"))
        .prefetch(c.get_int("data.prefetch"));
  };
  auto train = f.setup_dataloader(
      train_data,
      loader_options().shuffle(c.get_bool("data.shuffle")).drop_last(c.get_bool("data.drop_last")));
  std::optional<fabric::DataLoader> val;
  if (val_data) val.emplace(f.setup_dataloader(val_data, loader_options()));

  // No full batch under data.drop_last: refused (no step would run; the start would export).
  const examples::StepCount steps =
      examples::count_steps(f, train.size(), train_data->size(), batch_size,
                            c.get_bool("data.packed") ? "windows" : "examples");
  const int64_t accumulate = steps.accumulate;
  int64_t total_steps = steps.total_steps;  // the plan; after a resume from where it stands
  const int64_t max_epochs = c.get_int("trainer.max_epochs");
  fabric::LRScheduler scheduler(
      *optimizer, fabric::LRSchedule::from_config(c, std::max<int64_t>(total_steps, 1)));

  // A LoRA run checkpoints only what trains, the adapters (under fsdp and model_parallel the
  // strategy's pieces of them; named alike under every strategy, so that a checkpoint resumes
  // under another one); a full fine-tune the model.
  fabric::CheckpointState state;
  if (lora) {
    state.add("adapters", model, fabric::trainable_only(*model));
  } else {
    state.add("model", model);
  }
  state.add("optimizer", *optimizer).add("scheduler", scheduler).add("train_loader", train);
  for (auto& callback : fabric::make_callbacks(c, model.get(), optimizer.get()))
    f.add_callback(std::move(callback));
  fabric::add_stateful_callbacks(f, state);  // callbacks.*: checkpointed when stateful
  examples::PlateauReport plateau(f);        // scheduler.name: plateau, at every evaluation
  plateau.add_to(state);
  fabric::Checkpointer checkpoints(f, state);
  checkpoints.set_export_module(*model);
  examples::gpt::ModelChoice choice;
  choice.pretrained = p;
  if (p.gpt2) choice.gpt = *p.gpt2;  // exported as GPT-2 with the folder's config
  checkpoints.set_hf_export([&](const fabric::StateDict& whole, const fs::path& out) {
    if (lora && !c.get_bool("finetune.lora.merge_on_export")) {
      fabric::nn::save_lora_adapter(fabric::nn::lora_state_of(whole), out, lopt, folder.string());
      return;
    }
    fabric::StateDict merged = whole;
    if (lora) fabric::nn::merge_lora_state(merged, lopt);
    examples::gpt::export_hf(c, choice, merged, out);
  });
  f.print("finetune: ", p.describe(), "; ",
          lora ? "LoRA rank " + std::to_string(lopt.rank) + " on " +
                     std::to_string(adapted.size()) + " layers"
               : std::string("full"),
          ", ", trainable, " trainable of ", parameters, " parameters; strategy ",
          f.strategy().name(), ", world size ", f.world_size(), ", device ", f.device().str(),
          ", precision ", fabric::to_string(f.precision().mode()), ", ", f.threads_description(),
          "; ", total_steps, " steps; run directory ", f.run_directory().path().string());

  // The validation loss over response tokens: each batch's mean times its token count, summed
  // over the batches and ranks, over the tokens.
  auto validate = [&]() -> double {
    if (!val) return NAN;
    torch::NoGradGuard no_grad;
    model->eval();
    auto guard = f.autocast();
    auto sum = torch::zeros({}, torch::dtype(torch::kDouble).device(f.device()));
    auto count = torch::zeros_like(sum);
    const int64_t limit = c.get_int("trainer.limit_eval_batches");
    int64_t seen = 0;
    for (fabric::Batch& b : *val) {
      if (limit >= 0 && seen++ >= limit) break;
      if (b.padding >= b.size()) continue;
      // The sampler's padding rows (repeats that even out the ranks) count nowhere.
      torch::Tensor target = b.target;
      if (b.padding > 0) {
        target = target.clone();
        target.narrow(0, b.size() - b.padding, b.padding).fill_(-100);
      }
      const torch::Tensor n = (target != -100).sum().to(torch::kDouble);
      sum += step_loss(b.data, target).to(torch::kDouble) * n;
      count += n;
    }
    val->end_pass();  // a pass cut by limit_eval_batches ends here (resumes start the next one)
    model->train();
    const double total = f.all_reduce(count, fabric::ReduceOp::kSum).item<double>();
    return f.all_reduce(sum, fabric::ReduceOp::kSum).item<double>() / std::max(total, 1.0);
  };

  const int64_t log_every = c.get_int("logging.log_every_n_steps");
  const int64_t eval_every = c.get_int("finetune.eval_every_n_steps");
  int64_t step = checkpoints.step(), epoch = checkpoints.epoch(), tokens = 0;
  total_steps =
      examples::steps_after_resume(f, steps, step, epoch, train.state().batches, train.size());
  double last_loss = NAN, val_loss = NAN, train_seconds = 0;
  auto window_loss = torch::zeros({}, torch::dtype(torch::kFloat).device(f.device()));
  int64_t window = 0, window_tokens = 0;
  auto window_start = Clock::now();
  fabric::ProgressBar& bar = f.progress_bar(total_steps, max_epochs, step);
  fabric::NonFiniteGuard nonfinite(f);
  std::string stopped;
  bool stop_early = false;  // a callback asked (callbacks.early_stopping)
  f.call("on_fit_start", step);
  for (; epoch < max_epochs && step < total_steps && stopped.empty() && !stop_early; ++epoch) {
    // Micro-batches group from where this pass starts: a mid-epoch resume with another
    // trainer.accumulate_grad_batches starts a whole group (at the saver's, the same groups).
    const int64_t start = train.state().batches;
    int64_t in_epoch = start;
    torch::Tensor group_loss;
    const auto epoch_start = Clock::now();
    for (fabric::Batch& batch : train) {
      const auto micro =
          fabric::MicroBatch::in_epoch(in_epoch++ - start, train.size() - start, accumulate);
      torch::Tensor loss;
      {
        auto guard = f.autocast();
        loss = step_loss(batch.data, batch.target);
      }
      f.backward(loss, micro);       // loss / micro.count; gradients synchronized on the last one
      tokens += batch.data.numel();  // input positions, padding included
      window_tokens += batch.data.numel();
      group_loss = micro.first() ? loss.detach() : group_loss + loss.detach();
      if (!micro.last()) continue;
      f.step(*optimizer);  // clipping: trainer.gradient_clip_val
      optimizer->zero_grad();
      scheduler.step();
      ++step;
      const torch::Tensor mean = group_loss / static_cast<double>(micro.count);
      f.call("on_train_batch_end", step);
      plateau.step(mean);
      window_loss += mean.to(torch::kFloat);
      ++window;
      if (step % log_every == 0 || step == total_steps) {
        last_loss = f.all_reduce(window_loss / static_cast<double>(window)).item<double>();
        const double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
        const double rate = static_cast<double>(window_tokens * f.world_size()) / secs;
        bar.set_metrics(last_loss, scheduler.get_lr(), rate);
        bar.set_throughput(rate, "tok/s", -1);
        f.log_dict({{"train/loss", last_loss},
                    {"lr", scheduler.get_lr()},
                    {"train/tokens_per_second", rate}},
                   step);
        window_loss.zero_();
        window = window_tokens = 0;
        window_start = Clock::now();
      }
      bar.step(step, epoch);
      checkpoints.step_end();
      if (nonfinite.update(mean, step)) {
        stopped = nonfinite.message();
        break;
      }
      if (val && eval_every > 0 && step % eval_every == 0 && step < total_steps) {
        const auto eval_start = Clock::now();
        val_loss = validate();
        f.print("step ", step, " val loss ", val_loss);
        f.log_dict({{"val/loss", val_loss}}, step);
        f.call("on_validation_end", step, {{"val/loss", val_loss}});
        plateau.report(scheduler, val_loss, step);
        const auto eval_time = Clock::now() - eval_start;
        window_start += eval_time;  // evaluation counts in neither tokens/s
        train_seconds -= std::chrono::duration<double>(eval_time).count();
        if (!f.callbacks().empty() && f.should_stop()) {
          f.print(f.stop_reason());
          stop_early = true;
          break;
        }
      }
      if (step >= total_steps) break;
    }
    train_seconds += std::chrono::duration<double>(Clock::now() - epoch_start).count();
    checkpoints.epoch_end();
  }
  bar.finish();
  f.call("on_fit_end", step);
  std::string answer;
  if (stopped.empty()) {
    if (val) {  // no data.val: no validation line (it would say nan)
      val_loss = validate();
      f.print("step ", step, " val loss ", val_loss, " (response tokens)");
      f.log_dict({{"val/loss", val_loss}}, step);
    }
    const int64_t sample_tokens = c.get_int("finetune.sample_tokens");
    if (!c.get_string("finetune.sample_prompt").empty() && sample_tokens > 0) {
      const std::vector<int64_t> prompt = sample_ids(c, in);
      fabric::models::GenerateOptions g;  // greedy
      // Up to the model's last position (never an error after the run has trained).
      const int64_t room = p.max_positions() - static_cast<int64_t>(prompt.size());
      g.max_new_tokens = std::min(sample_tokens, room);
      g.eos_token_ids = p.eos_token_ids;
      // The cached decode where it runs (examples/common/decode.h); else the forward over the
      // whole sequence each step, through Fabric.
      if (room < 1) {
        answer = "(no sample: finetune.sample_prompt's " + std::to_string(prompt.size()) +
                 " ids fill the model's " + std::to_string(p.max_positions()) + " positions)";
      } else if (examples::cached_decode_runs(f)) {
        auto guard = f.autocast();
        answer = tokenizer->decode_text(fabric::models::generate(*model, {prompt}, g).tokens[0]);
      } else {
        answer = tokenizer->decode_text(
            examples::generate_uncached(f, model, prompt, p.max_positions(), g));
      }
      f.print("sample (finetune.sample_prompt): ", answer);
    }
    checkpoints.finish();
    if (!checkpoints.export_weights().empty())
      f.print("exported ",
              lora && !c.get_bool("finetune.lora.merge_on_export") ? "the adapter" : "the model",
              " to ", checkpoints.export_weights());
  } else {
    f.print("stopped: ", stopped, "; the state is in ",
            checkpoints.save_aside("nonfinite").string());
  }
  const double tokens_per_s =
      static_cast<double>(tokens * f.world_size()) / std::max(train_seconds, 1e-9);
  // The most tensor memory any rank held (CUDA; the CPU under fabric.tensor_memory_limit_gb).
  nlohmann::json peak_tensor_bytes = nullptr;
  if (fabric::memory_counted(f.device()))
    peak_tensor_bytes = static_cast<int64_t>(f.all_reduce(
        static_cast<double>(fabric::memory_stats(f.device()).peak), fabric::ReduceOp::kMax));
  nlohmann::json summary = {
      {"name", f.run_name()},
      {"config_hash", c.hash()},
      {"strategy", f.strategy().name()},
      {"precision", fabric::to_string(f.precision().mode())},
      {"device", f.device().str()},
      {"world_size", f.world_size()},
      {"pretrained", folder.string()},
      {"method", lora ? "lora" : "full"},
      {"parameters", parameters},
      {"trainable_params", trainable},
      {"steps", step},
      {"train_loss", last_loss},
      {"val_loss", std::isnan(val_loss) ? nlohmann::json(nullptr) : nlohmann::json(val_loss)},
      {"tokens_per_s", tokens_per_s},
      {"peak_tensor_bytes", peak_tensor_bytes},
      {"export", checkpoints.export_weights()},
      {"resumed_from", checkpoints.resumed_from()},
      {"stopped", stopped},
      {"stopped_early",
       f.stop_reason().empty() ? nlohmann::json(nullptr) : nlohmann::json(f.stop_reason())},
      {"sample", answer},
  };
  f.print(f.run_directory().write_summary(summary).string());
  return !stopped.empty() && f.is_global_zero() ? 3 : 0;
}

int run(fabric::Fabric& f) {
  const examples::finetune::Inputs in = examples::finetune::open_inputs(f);
  const fabric::hf::Pretrained& p = in.pretrained;
  if (p.gpt2)
    return train<fabric::models::GPT>(f, in, [&] { return fabric::models::GPT(*p.gpt2); });
  return train<fabric::models::Llama>(f, in, [&] { return fabric::models::Llama(*p.llama); });
}

}  // namespace

int main(int argc, char** argv) {
  return fabric::run_main(
      argc, argv, examples::finetune::schema(), [](const fabric::Config& config) {
        // Before any process starts: what the loop cannot honour (exit 2).
        examples::check_evaluation_keys(
            config, {"finetune.eval_every_n_steps", {"val/loss"}, {"val/loss", "train/loss"}});
        examples::refuse_pipeline_and_context_parallel(config, "examples:finetune");
        fabric::Fabric fabric(config);
        return fabric.launch(run);
      });
}
