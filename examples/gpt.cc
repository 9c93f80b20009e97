// bazel run //examples:gpt -- --config=gpt_tiny.yaml [key=value ...]
// bazel run //examples:gpt -- model.pretrained=DIR data.root=TOKENS [key=value ...]
//
// A GPT language model (fabric::models::GPT), or with model.pretrained a Hugging Face model
// folder's Llama, Qwen2, Mistral or GPT-2 (its architecture and weights; docs/pretrained.md),
// trained on token files in nanoGPT's format:
// data.root holds train.bin and val.bin (tools/prepare_text writes them from any text). Without
// data.root the run trains on the sources of this machine's Python standard library, turned into
// byte tokens on first use and cached (gpt.corpus_cache), and says so.
// The loop is the one a user writes with Fabric: AdamW from the optimizer: section (weight decay
// on matrices only by optimizer.no_weight_decay), the scheduler: section (cosine with warm-up),
// clipping, gradient accumulation, any strategy and precision, checkpoints that resume mid-epoch.
// Every logging window prints and logs the loss, tokens/s and the model FLOPs utilization (MFU:
// GPTConfig::flops_per_token × tokens/s over the devices' dense peak, fabric::peak_dense_tflops or
// throughput.peak_tflops; unknown on CPUs), and logs TFLOP/s (fabric::Throughput). The validation
// loss is measured every gpt.eval_every_n_steps and at the end; last, a sample generated from
// gpt.prompt is printed. Callbacks (callbacks.*, profiler.*) fire as in the image examples:
// on_train_batch_end every optimizer step, on_validation_end with val/loss at every
// gpt.eval_every_n_steps (scheduler.name: plateau reports there too). summary.json: train_loss,
// val_loss, tokens_per_s (+ _per_rank), flops_per_token, flops_source, tflops, mfu (null when the
// peak is unknown). Exit status: see fabric/main.h; 3 when training stopped on non-finite losses.
#include <torch/types.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "examples/common/classification.h"
#include "examples/common/ema.h"
#include "examples/common/evaluations.h"
#include "examples/common/steps.h"
#include "examples/common/throughput.h"
#include "examples/gpt_pipeline.h"
#include "examples/gpt_recipe.h"
#include "examples/gpt_text.h"
#include "fabric/accelerators/memory.h"
#include "fabric/callbacks.h"
#include "fabric/checkpointer.h"
#include "fabric/core/error.h"
#include "fabric/data/tokens.h"
#include "fabric/fabric.h"
#include "fabric/graphed_step.h"
#include "fabric/hf/pretrained.h"
#include "fabric/logging/progress.h"
#include "fabric/main.h"
#include "fabric/models/gpt.h"
#include "fabric/models/llama.h"
#include "fabric/models/pipeline_stages.h"
#include "fabric/nn/ring_attention.h"
#include "fabric/nonfinite_guard.h"
#include "fabric/training/activation_checkpoint.h"
#include "fabric/training/lr_scheduler.h"
#include "fabric/training/optimizers.h"

namespace fs = std::filesystem;
using examples::gpt::data_root;
using examples::gpt::Meta;
using examples::gpt::read_meta;
using examples::gpt::sample;
using fabric::KeySpec;

namespace {

// Trains the model `make` builds (a GPT or a Llama holder) as `choice` describes it; under
// pipeline parallelism (`pipe`) `make` builds this rank's stages of it (GPTStages, LlamaStages).
template <typename Make>
int train_model(fabric::Fabric& f, const examples::gpt::ModelChoice& choice, const fs::path& root,
                Meta meta, Make&& make, examples::gpt::Pipeline* pipe = nullptr) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const fabric::Config& c = f.config();
  const int64_t sequence = choice.window, vocab_size = choice.vocab_size();
  fabric::TokenDataset::Options token_options{
      sequence, c.get_string("data.token_dtype") == "uint32" ? 4 : 2, vocab_size};
  if (choice.pretrained) {  // the folder fixes the vocabulary: no model.vocab_size to raise
    token_options.vocab_name = "the vocabulary of model.pretrained's config.json";
    token_options.vocab_fix =
        "prepare the data with its tokenizer (tools/prepare_text --tokenizer=" +
        (choice.pretrained->folder / "tokenizer.json").string() + ")";
  }
  if (!fs::exists(root / "val.bin"))
    throw fabric::Error((root / "val.bin").string() +
                        ": missing (data.root needs train.bin and val.bin; tools/prepare_text "
                        "writes both)");
  // train.bin and val.bin checked against meta.json, gpt.prompt against both vocabularies: all
  // before training (fabric/data/tokens.h).
  const auto splits = fabric::open_token_splits(root, meta, token_options);
  const auto& train_data = splits.train;
  const auto& val_data = splits.val;
  examples::gpt::check_prompt(c, meta, vocab_size);

  auto model = f.init_module(make);
  constexpr bool kStaged = std::is_base_of_v<fabric::models::PipelineStagesImpl,
                                             typename decltype(model)::ContainedType>;
  const bool checkpoint_blocks = !c.get_string_list("model.activation_checkpointing").empty();
  // The step's loss: GPT::loss fuses the output layer and the cross-entropy on GPUs (no float32
  // logits); under fabric.strategy: dp with several GPUs the replicas' logits are gathered.
  const auto* replicas = f.strategy().replica_devices();
  const bool replicated = replicas && replicas->size() > 1;
  auto step_loss = [&](const torch::Tensor& x, const torch::Tensor& y) -> torch::Tensor {
    if constexpr (kStaged) {  // the stages' loss runs in Pipeline::train
      throw fabric::Error("gpt: no whole-model loss under pipeline parallelism");
    } else {
      if (replicated) return fabric::models::lm_loss(f.forward(model, x), y);
      if (!checkpoint_blocks) return model->loss(x, y);
      return model->loss(x, y, [](auto& block, const torch::Tensor& h) {
        return fabric::checkpoint_activations(block, h);
      });
    }
  };
  // Stages: optimizer.no_weight_decay and lr_scale were checked against the whole model (a
  // selector may match nothing of this rank's stages).
  auto optimizer =
      kStaged ? fabric::make_optimizer_for_part(c, *model) : fabric::make_optimizer(c, *model);
  if constexpr (kStaged) {
    examples::gpt::check_stage_groups(f, *model);
    f.setup_pipeline_tied(model->tied_weight(), pipe->runner());
    pipe->describe(*model, choice.parameters());
  }
  // model.init_weights under pp: this loop's (read before setup, so Fabric leaves it): the file is
  // a whole model's, and each stage takes its own tensors from it, below.
  const std::string staged_init = kStaged ? c.get_string("model.init_weights") : "none";
  f.setup(model, *optimizer);  // and model.init_weights, if set (a whole model)
  // fabric.model_parallel.context_parallel_size: each rank runs its share of every sequence
  // (`local`: chunks r and 2 cp - 1 - r of 2 cp), attention over the whole by ring.
  // (Stages: their whole model got the group before the cut, in train().)
  torch::Tensor cp_positions;
  if (const auto cp = f.strategy().context_parallel_group()) {
    if constexpr (!kStaged) model->set_context_parallel(cp);
    const auto at = fabric::nn::cp_rank_positions(sequence, cp->getSize(), cp->getRank());
    cp_positions = torch::tensor(at, torch::kLong).to(f.device());
  }
  auto local = [&](const torch::Tensor& t) {
    return cp_positions.defined() ? t.index_select(1, cp_positions) : t;
  };
  // model.pretrained's weights, after the sharding: each rank copies only its own elements from
  // the memory-mapped files (Fabric::load_weights), so no rank holds the whole model.
  if (choice.pretrained) {
    fabric::hf::Weights weights = fabric::hf::model_weights(*choice.pretrained);
    if constexpr (kStaged)
      examples::gpt::keep_held(weights.tensors, *model);  // this rank's stages' tensors
    f.load_weights(model, weights.tensors, choice.pretrained->folder.string());
    f.print("model.pretrained: loaded ", weights.tensors.size(), " tensors from ",
            choice.pretrained->folder.string());
  }
  if (staged_init != "none") examples::gpt::load_stage_weights(f, *model, staged_init);
  // data.batch_size: auto: the largest that runs a step (Fabric::find_batch_size): sequences of
  // the first tokens through the loss and backward, no gradient synchronization, the optimizer's
  // future state held; from 8, doubling, up to 1024 and this process's share of the windows.
  std::vector<fabric::Fabric::BatchSizeTrial> batch_size_trials;
  int64_t batch_size = 0;
  if (c.is_auto("data.batch_size")) {
    const int64_t most =
        std::min<int64_t>(1024, std::max<int64_t>(1, train_data->size() / f.data_parallel_size()));
    batch_size = f.find_batch_size(
        *model, *optimizer,
        [&](int64_t b) {
          std::vector<int64_t> rows(static_cast<size_t>(b));
          for (int64_t i = 0; i < b; ++i) rows[static_cast<size_t>(i)] = i % train_data->size();
          const fabric::Batch batch = f.to_device(train_data->get_batch(rows));
          return step_loss(batch.data, batch.target);
        },
        std::min<int64_t>(8, most), most, &batch_size_trials);
  } else {
    batch_size = c.get_int("data.batch_size");
  }
  auto loader_options = [&] {
    return fabric::DataLoaderOptions()
        .batch_size(batch_size)
        .num_workers(c.get_int("data.num_workers"))
        .prefetch(c.get_int("data.prefetch"));
  };
  auto train = f.setup_dataloader(
      train_data,
      loader_options().shuffle(c.get_bool("data.shuffle")).drop_last(c.get_bool("data.drop_last")));
  auto val = f.setup_dataloader(val_data, loader_options());

  // No full batch under data.drop_last: refused (no step would run; the start would export).
  const examples::StepCount steps =
      examples::count_steps(f, train.size(), train_data->size(), batch_size, "windows");
  const int64_t accumulate = steps.accumulate;
  int64_t total_steps = steps.total_steps;  // the plan; after a resume from where it stands
  const int64_t max_epochs = c.get_int("trainer.max_epochs");
  fabric::LRScheduler scheduler(
      *optimizer, fabric::LRSchedule::from_config(c, std::max<int64_t>(total_steps, 1)));
  const int64_t log_every = c.get_int("logging.log_every_n_steps");
  const int64_t eval_every = c.get_int("gpt.eval_every_n_steps");
  const int64_t tokens_per_batch = batch_size * sequence;

  // tokens/s, TFLOP/s and MFU: GPTConfig::flops_per_token (documented there) unless
  // throughput.flops_per_unit says otherwise; the peak from throughput.peak_tflops or the table.
  fabric::Throughput throughput = examples::make_throughput(f);
  if (!throughput.has_flops()) throughput.set_flops_per_unit(choice.flops_per_token(), "formula");

  fabric::CheckpointState state;
  state.add("model", model).add("optimizer", *optimizer).add("scheduler", scheduler);
  state.add("train_loader", train);
  // trainer.ema_decay: averaged weights, updated after every optimizer step; the validation loss
  // and the exported <stem>_ema weights use them.
  const std::unique_ptr<fabric::ExponentialMovingAverage> ema = examples::make_ema(f, *model);
  if (ema) ema->add_to(state, "ema");
  for (auto& callback : fabric::make_callbacks(c, model.get(), optimizer.get()))
    f.add_callback(std::move(callback));
  fabric::add_stateful_callbacks(f, state);  // callbacks.*: checkpointed when stateful
  examples::PlateauReport plateau(f);        // scheduler.name: plateau, at every evaluation
  plateau.add_to(state);
  fabric::Checkpointer checkpoints(f, state);
  checkpoints.set_hf_export([&](const fabric::StateDict& whole, const fs::path& folder) {
    examples::gpt::export_hf(c, choice, whole, folder);
  });
  f.print("gpt: ", choice.describe(c), "; ", train_data->tokens(), " train / ", val_data->tokens(),
          " val tokens; strategy ", f.strategy().name(), ", world size ", f.world_size(),
          ", device ", f.device().str(), ", precision ", fabric::to_string(f.precision().mode()),
          ", ", f.threads_description(), "; ", total_steps, " steps of ",
          tokens_per_batch * accumulate * f.data_parallel_size(), " tokens; run directory ",
          f.run_directory().path().string());

  auto validate = [&]() {
    auto averaged = ema ? ema->swap_into_model() : fabric::ScopeGuard();
    auto means = f.evaluate(
        val,
        [&](const fabric::Batch& b) -> std::map<std::string, torch::Tensor> {
          if constexpr (kStaged) {  // each sequence's mean, from the last stage
            return {{"loss", pipe->evaluate(model, local(b.data), local(b.target))}};
          } else {
            const torch::Tensor logits = f.forward(model, local(b.data));
            const torch::Tensor per_token =
                torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                          local(b.target).reshape({-1}), {}, at::Reduction::None);
            return {{"loss", per_token.view({b.data.size(0), -1}).mean(1)}};
          }
        },
        c.get_int("trainer.limit_eval_batches"));
    return means.at("loss");
  };

  fabric::GraphedStepOptions step_options;
  if (c.get_string("trainer.gradient_clip_algorithm") == "norm") {
    step_options.clip_norm(c.get_double("trainer.gradient_clip_val"));
  } else {
    step_options.clip_value(c.get_double("trainer.gradient_clip_val"));
  }
  std::optional<fabric::GraphedStep> train_step;
  if (!pipe)
    train_step.emplace(
        f, *optimizer,
        [&](const std::vector<torch::Tensor>& b) {
          auto guard = f.autocast();
          return step_loss(b[0], b[1]);
        },
        step_options);

  int64_t step = checkpoints.step(), epoch = checkpoints.epoch();
  total_steps =
      examples::steps_after_resume(f, steps, step, epoch, train.state().batches, train.size());
  double last_loss = NAN, val_loss = NAN, train_seconds = 0;
  int64_t tokens = 0, window = 0, window_tokens = 0;
  const int64_t tp_ranks = f.world_size() / f.data_parallel_size();
  auto window_loss = torch::zeros({}, torch::dtype(torch::kFloat).device(f.device()));
  auto window_start = Clock::now();
  fabric::ProgressBar& bar = f.progress_bar(total_steps, max_epochs, step);
  fabric::NonFiniteGuard nonfinite(f);
  std::string stopped;
  bool stop_early = false;  // a callback asked (callbacks.early_stopping)
  f.call("on_fit_start", step);
  for (; epoch < max_epochs && step < total_steps && stopped.empty() && !stop_early; ++epoch) {
    torch::Tensor group_loss;
    // Micro-batches group from where this pass starts: a mid-epoch resume with another
    // trainer.accumulate_grad_batches starts a whole group (at the saver's, the same groups).
    const int64_t start = train.state().batches;
    int64_t in_epoch = start;
    const auto epoch_start = Clock::now();
    for (fabric::Batch& batch : train) {
      const auto micro =
          fabric::MicroBatch::in_epoch(in_epoch++ - start, train.size() - start, accumulate);
      torch::Tensor micro_loss;
      if constexpr (kStaged)
        micro_loss = pipe->train(model, *optimizer, local(batch.data), local(batch.target));
      else
        micro_loss = (*train_step)({local(batch.data), local(batch.target)}, micro);
      group_loss = micro.first() ? micro_loss : group_loss + micro_loss;
      // A rank's share of the tokens: its batch, split over its tensor-parallel partners.
      window_tokens += batch.data.numel() / tp_ranks;
      tokens += batch.data.numel() / tp_ranks;
      if (!micro.last()) continue;
      const torch::Tensor loss = micro.count == 1 ? group_loss : group_loss / micro.count;
      if (ema) ema->update();
      scheduler.step();
      ++step;
      f.call("on_train_batch_end", step);  // no loss value: that would sync with the device
      plateau.step(loss);
      window_loss += loss.detach().to(torch::kFloat);
      ++window;
      if (step % log_every == 0 || step == total_steps) {
        last_loss = f.all_reduce(window_loss / static_cast<double>(window)).item<double>();
        const double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
        const auto rates = throughput.rates(static_cast<double>(window_tokens), secs);
        bar.set_metrics(last_loss, scheduler.get_lr(), rates.job);
        bar.set_throughput(rates.job, "tok/s", rates.mfu);
        auto metrics = fabric::Throughput::metrics(rates, "tokens");
        metrics["train/loss"] = last_loss;
        metrics["lr"] = scheduler.get_lr();
        f.log_dict(metrics, step);
        window_loss.zero_();
        window = window_tokens = 0;
        window_start = Clock::now();
      }
      bar.step(step, epoch);
      checkpoints.step_end();
      if (nonfinite.update(loss, step)) {
        stopped = nonfinite.message();
        break;
      }
      if (eval_every > 0 && step % eval_every == 0 && step < total_steps) {
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
  if (stopped.empty()) {
    val_loss = validate();
    f.print("step ", step, " val loss ", val_loss);
    f.log_dict({{"val/loss", val_loss}}, step);
    checkpoints.finish();
    examples::export_ema_weights(f, *model, ema.get(), checkpoints.export_weights());
  } else {
    f.print("stopped: ", stopped, "; the state is in ",
            checkpoints.save_aside("nonfinite").string());
  }
  const double tokens_per_s =
      static_cast<double>(tokens * f.world_size()) / std::max(train_seconds, 1e-9);  // all ranks
  // Weights that diverged without stopping the run (fewer than trainer.stop_on_nonfinite
  // non-finite losses) sample nothing, and summary.json is still written.
  std::string text;
  if (stopped.empty() && !std::isfinite(val_loss) && c.get_int("gpt.sample_tokens") > 0) {
    text = "(no sample: the validation loss is not finite)";
    f.print("gpt: no sample: the validation loss is ", val_loss,
            " (the weights diverged: lower optimizer.lr, clip gradients with "
            "trainer.gradient_clip_val, or stop sooner with trainer.stop_on_nonfinite)");
  } else if (kStaged && stopped.empty() && c.get_int("gpt.sample_tokens") > 0) {
    text = "(no sample under pipeline parallelism)";
    // The export is the whole model (every stage's tensors joined on rank 0): this program on
    // one process, with no step, samples from it (a weights.pt; an hf export is a folder).
    const std::string& exported = checkpoints.export_weights();
    const bool file = !exported.empty() && c.get_string("checkpoint.export_format") != "hf";
    f.print(
        "gpt: no sample under pipeline parallelism (each rank holds some of the blocks); "
        "sample from the exported weights with the same config and fabric.devices=1 "
        "fabric.strategy=auto trainer.max_steps=0 model.init_weights=",
        file ? exported
             : std::string("FILE (export them first: checkpoint.export_weights, format pt)"));
  } else if constexpr (!kStaged) {
    if (cp_positions.defined()) model->set_context_parallel(nullptr);  // whole prompts
    if (stopped.empty())
      text = sample(
          f, *model, [&](const torch::Tensor& x) { return f.forward(model, x); },
          choice.positions(), meta,
          choice.pretrained ? choice.pretrained->eos_token_ids : std::vector<int64_t>{});
    if (!text.empty())
      f.print("sample (gpt.prompt, ", c.get_int("gpt.sample_tokens"), " tokens):\n", text);
  }

  const auto rates = throughput.rates(static_cast<double>(tokens), train_seconds);
  // The most tensor memory any rank held, where it was counted from the start (CUDA, or the CPU
  // under fabric.tensor_memory_limit_gb; fabric/accelerators/memory.h).
  nlohmann::json peak_tensor_bytes = nullptr;
  if (fabric::memory_counted(f.device()))
    peak_tensor_bytes = static_cast<int64_t>(f.all_reduce(
        static_cast<double>(fabric::memory_stats(f.device()).peak), fabric::ReduceOp::kMax));
  nlohmann::json search = nullptr;  // data.batch_size: auto's trials, [[size, fits], ...]
  for (const auto& t : batch_size_trials) {
    if (search.is_null()) search = nlohmann::json::array();
    search.push_back({t.batch_size, t.fits});
  }
  nlohmann::json summary = {
      {"name", f.run_name()},
      {"config_hash", c.hash()},
      {"strategy", f.strategy().name()},
      {"precision", fabric::to_string(f.precision().mode())},
      {"device", f.device().str()},
      {"world_size", f.world_size()},
      {"parameters", choice.parameters()},
      {"pretrained", choice.pretrained ? nlohmann::json(choice.pretrained->folder.string())
                                       : nlohmann::json(nullptr)},
      {"steps", step},
      {"train_loss", last_loss},
      {"val_loss", val_loss},
      {"tokens_per_s", tokens_per_s},
      {"tokens_per_s_per_rank", rates.per_rank},
      {"flops_per_token", throughput.flops_per_unit()},
      {"flops_source", throughput.flops_source()},
      {"tflops", rates.tflops},
      {"mfu", rates.mfu >= 0 ? nlohmann::json(rates.mfu) : nlohmann::json(nullptr)},
      {"wall_seconds", std::chrono::duration<double>(Clock::now() - start).count()},
      {"batch_size", batch_size},
      {"batch_size_search", search},
      {"peak_tensor_bytes", peak_tensor_bytes},
      {"data", root.string()},
      {"resumed_from", checkpoints.resumed_from()},
      {"stopped", stopped},
      {"stopped_early",
       f.stop_reason().empty() ? nlohmann::json(nullptr) : nlohmann::json(f.stop_reason())},
      {"sample", text},
  };
  f.print(f.run_directory().write_summary(summary).string());
  return !stopped.empty() && f.is_global_zero() ? 3 : 0;
}

int train(fabric::Fabric& f) {
  const fabric::Config& c = f.config();
  const fs::path root = data_root(f);
  Meta meta = read_meta(root);
  const auto choice =
      examples::gpt::choose_model(c, c.get_int("model.vocab_size") > 0 ? 0 : meta.vocab_size);
  if (choice.pretrained) examples::gpt::check_tokenizer(f, *choice.pretrained, meta);
  if (f.pipeline_parallel_size() > 1) {
    // Every rank builds the whole model (the same values from the same seed) and keeps its
    // stages; the other blocks are freed when `whole` goes. Under context parallelism too the
    // whole model gets the cp group first, and the activations are the rank's share of each
    // sequence.
    const int64_t width =
        choice.is_llama() ? choice.pretrained->llama->hidden_size : choice.gpt.n_embd;
    const auto cp = f.strategy().context_parallel_group();
    examples::gpt::Pipeline pipe(f, c.get_int("data.batch_size"),
                                 choice.window / (cp ? cp->getSize() : 1), width);
    const auto& r = pipe.runner();
    if (choice.is_llama()) {
      const fabric::models::LlamaConfig lc = *choice.pretrained->llama;
      return train_model(
          f, choice, root, std::move(meta),
          [&] {
            fabric::models::Llama whole(lc);
            fabric::check_param_group_rules(c, *whole);
            if (cp) whole->set_context_parallel(cp);
            return fabric::models::LlamaStages(whole, r.local_stages(), r.stages());
          },
          &pipe);
    }
    return train_model(
        f, choice, root, std::move(meta),
        [&] {
          fabric::models::GPT whole(choice.gpt);
          fabric::check_param_group_rules(c, *whole);
          if (cp) whole->set_context_parallel(cp);
          return fabric::models::GPTStages(whole, r.local_stages(), r.stages());
        },
        &pipe);
  }
  if (choice.is_llama()) {
    const fabric::models::LlamaConfig lc = *choice.pretrained->llama;
    return train_model(f, choice, root, std::move(meta), [&] { return fabric::models::Llama(lc); });
  }
  return train_model(f, choice, root, std::move(meta),
                     [&] { return fabric::models::GPT(choice.gpt); });
}

}  // namespace

int main(int argc, char** argv) {
  return fabric::run_main(argc, argv, examples::gpt::schema(), [](const fabric::Config& config) {
    // Before any process starts: ConfigErrors (exit 2, never restarted by fabric.max_restarts).
    examples::gpt::check_parallel_keys(config, examples::gpt::choose_model(config, 0));
    examples::check_evaluation_keys(
        config, {"gpt.eval_every_n_steps", {"val/loss"}, {"val/loss", "train/loss"}});
    fabric::Fabric fabric(config);
    return fabric.launch(train);
  });
}
