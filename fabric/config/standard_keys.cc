// The standard key catalogue (fabric/config/standard_keys.h): every key Fabric reads, with its
// default and documentation; configs/README.md lists the same keys (tested by
// //tests/fabric/config:config_test).
#include "fabric/config/standard_keys.h"

namespace fabric {

ConfigSchema default_schema() {
  ConfigSchema s;
  s.section_doc("fabric", "How and where to run: devices, strategy, precision.");
  s.add("fabric.accelerator", KeySpec::choice({"auto", "cpu", "cuda"}, "auto")
                                  .alias("gpu", "cuda")
                                  .noun("an accelerator")
                                  .doc("auto: cuda when a CUDA device is usable, else cpu"));
  s.add("fabric.devices",
        KeySpec::devices().doc(
            "auto: 1 device; N (on cpu: N processes); -1 = all CUDA devices; [ids]"));
  s.add("fabric.num_nodes", KeySpec::integer(1).min(1).doc("machines in the job"));
  s.add("fabric.strategy",
        KeySpec::choice({"auto", "single_device", "dp", "ddp", "fsdp", "model_parallel"}, "auto")
            .noun("a strategy")
            .doc("auto: ddp for more than one process, else single_device; fsdp: parameters, "
                 "gradients and optimizer state sharded; model_parallel: tensor parallel inside "
                 "groups of fabric.model_parallel.tensor_parallel_size ranks, fsdp across them"));
  s.add("fabric.precision",
        KeySpec::choice(
            {"32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "fp8-mixed"},
            "32-true")
            .alias("32", "32-true")
            .alias("64", "64-true")
            .alias("16", "16-mixed")
            .alias("bf16", "bf16-mixed")
            .alias("fp8", "fp8-mixed")
            .noun("a precision")
            .doc("*-mixed: autocast + fp32 weights (16-mixed scales the loss); *-true: weights in "
                 "that dtype; fp8-mixed: bf16-mixed with fabric::nn::Linear GEMMs in float8"));
  s.add("fabric.fp8.exclude_modules",
        KeySpec::string("").doc(
            "fp8-mixed: comma-separated module-name patterns ('*' = one name component, e.g. "
            "transformer.h.0.*) whose Linear layers stay in bf16; auto_filter_small_kn: also "
            "those too small to gain (torchao's thresholds, as TorchTitan's filter)"));
  s.add("fabric.fp8.recipe",
        KeySpec::choice({"tensorwise", "rowwise", "delayed"}, "tensorwise")
            .doc("fp8-mixed scales: one per tensor, or one per row of each GEMM operand "
                 "(rowwise: CUDA compute capability >= 9.0 only), or one per tensor from the "
                 "largest magnitudes of its last fabric.fp8.amax_history steps (delayed: no pass "
                 "over the tensor before its cast)"));
  s.add("fabric.fp8.amax_history",
        KeySpec::integer(16).min(1).doc(
            "fp8-mixed with recipe delayed: steps of amax history each operand's scale comes "
            "from (their largest)"));
  s.add("fabric.fp8.grad_margin",
        KeySpec::integer(3).min(0).max(15).doc(
            "fp8-mixed with recipe delayed: the output gradient's scale leaves 2^grad_margin of "
            "headroom above its history's largest amax, so a gradient that outgrows its last "
            "steps' does not saturate (0: none, Transformer Engine's default margin)"));
  s.add("fabric.fp8.fast_accumulation",
        KeySpec::boolean(true).doc(
            "fp8-mixed on CUDA: the GEMMs torchao runs with _scaled_mm's fast accumulation "
            "(the forward's; rowwise: all three) do so; false: every GEMM accumulates precisely"));
  s.add("fabric.sync_batchnorm",
        KeySpec::boolean(false).doc("ddp: BatchNorm statistics over the global batch"));
  s.add("fabric.sync_before_step",
        KeySpec::boolean(true).doc(
            "ddp, ZeRO-1, fsdp: when every backward since the last synchronization ran inside "
            "no_backward_sync, clip_gradients and step synchronize those gradients first; "
            "false: each rank keeps its own (local SGD)"));
  s.add("fabric.seed",
        KeySpec::integer(42).min(0).doc("seeds every RNG (torch, data order, augmentation)"));
  s.add(
      "fabric.deterministic",
      KeySpec::boolean(false).doc("deterministic kernels (slower); implies cudnn_benchmark false"));
  s.add("fabric.cudnn_benchmark",
        KeySpec::choice({"auto", "true", "false"}, "auto").doc("auto: true unless deterministic"));
  s.add("fabric.matmul_precision", KeySpec::choice({"highest", "high", "medium"}, "highest")
                                       .doc("float32 matmul: high/medium allow TF32 on CUDA"));
  s.add("fabric.channels_last",
        KeySpec::choice({"auto", "true", "false"}, "false")
            .doc("4-D weights and batches in channels-last memory format; auto: on CUDA only"));
  s.add("fabric.num_threads",
        KeySpec::integer(0).min(0).doc(
            "intra-/inter-op threads per process; 0 (auto): OMP_NUM_THREADS if set, else the "
            "CPUs this process may use / the job's processes on this machine"));
  s.add("fabric.cuda_graphs",
        KeySpec::boolean(false).doc(
            "capture each training step once as a CUDA graph and replay it (fabric::GraphedStep; "
            "CUDA; single_device, or ddp without sync_batchnorm and find_unused_parameters)"));
  s.add("fabric.memory_limit_gb",
        KeySpec::real(0.0).min(0).doc(
            "each process: fail at the first optimizer step after its peak resident host memory "
            "exceeds this (GiB); 0: off"));
  s.add("fabric.tensor_memory_limit_gb",
        KeySpec::real(0.0).min(0).doc(
            "each process: the most tensor memory (GiB) it may hold on its device; an allocation "
            "past it raises an out-of-memory error (CPU: counted by a wrapper of LibTorch's "
            "allocator; CUDA: the caching allocator's memory fraction); 0: off"));
  s.add("fabric.empty_init",
        KeySpec::boolean(false).doc(
            "Fabric::init_module builds the model without parameter memory; setup gives it the "
            "values of a full init with the same seed (fsdp: each rank only its shards)"));
  s.add("fabric.strict_keys",
        KeySpec::boolean(false).doc(
            "keys the config sets (to non-default values) that the program never read: false "
            "warns, true fails the run with exit 2, when the function given to launch returns"));
  s.add("fabric.max_restarts",
        KeySpec::integer(0).min(0).doc(
            "self-launched jobs: when a rank fails, restart every rank from the newest complete "
            "checkpoint of the job, up to this many times (fabric/distributed/restart_agent.h)"));
  s.add("fabric.restart_backoff_s",
        KeySpec::real(1.0).min(0).doc("seconds between a failure and the restart"));
  s.add("fabric.grad_scaler.init_scale",
        KeySpec::real(65536.0).min(0, false).doc("16-mixed loss scale at start"));
  s.add("fabric.grad_scaler.growth_factor", KeySpec::real(2.0).min(1, false));
  s.add("fabric.grad_scaler.backoff_factor", KeySpec::real(0.5).min(0, false).max(1, false));
  s.add("fabric.grad_scaler.growth_interval",
        KeySpec::integer(2000).min(1).doc("finite steps before growing"));
  s.add("fabric.ddp.bucket_cap_mb", KeySpec::real(25.0).min(0, false).doc("DDP"));
  s.add("fabric.ddp.find_unused_parameters", KeySpec::boolean(false).doc("DDP"));
  s.add("fabric.ddp.broadcast_buffers", KeySpec::boolean(true).doc("DDP"));
  s.add("fabric.ddp.gradient_as_bucket_view", KeySpec::boolean(false).doc("DDP"));
  s.add("fabric.ddp.static_graph", KeySpec::boolean(false).doc("DDP"));
  s.add("fabric.ddp.comm_hook", KeySpec::choice({"none", "fp16", "bf16"}, "none").doc("DDP"));
  s.add("fabric.ddp.shard_optimizer_state",
        KeySpec::boolean(false).doc(
            "ZeRO-1: each rank keeps the optimizer state of 1/N of the parameters (gradients "
            "reduce-scattered, parameters all-gathered; the bytes of one all-reduce)"));
  s.add("fabric.ddp.cpu_backend",
        KeySpec::choice({"auto", "gloo", "shm"}, "auto")
            .doc("CPU all-reduces: shm (shared memory, one machine), gloo; auto: shm when every "
                 "rank is on this machine"));
  s.add("fabric.ddp.cuda_backend",
        KeySpec::choice({"auto", "nccl", "gloo"}, "auto")
            .doc("collectives on CUDA tensors: nccl, gloo (slower: through host memory); auto: "
                 "nccl, or gloo when fabric.ddp.ranks_per_gpu > 1"));
  s.add("fabric.ddp.ranks_per_gpu",
        KeySpec::integer(1).min(1).doc(
            "testing mode: N processes share each GPU of fabric.devices (Gloo only: NCCL refuses "
            "two ranks on one GPU); 1: one process per GPU"));
  s.add("fabric.ddp.timeout_s", KeySpec::real(300.0).min(0, false).doc("DDP"));
  s.add("fabric.ddp.debug_collectives",
        KeySpec::boolean(false).doc("check that every rank issues the same collectives (slow)"));
  s.add("fabric.ddp.heartbeat_timeout_s",
        KeySpec::real(5.0).min(0).doc(
            "external launchers: a rank silent this long ends the job naming it; 0: off"));

  s.add("fabric.fsdp.sharding_strategy",
        KeySpec::choice({"full_shard", "shard_grad_op", "no_shard"}, "full_shard")
            .noun("a sharding strategy")
            .doc("full_shard (ZeRO-3): a unit's parameters whole only while used; shard_grad_op "
                 "(ZeRO-2): whole from forward until their gradients are reduced; no_shard: ddp"));
  s.add("fabric.fsdp.reshard_after_forward",
        KeySpec::choice({"auto", "true", "false"}, "auto")
            .doc("free a unit's gathered parameters once the forward moves on to the next unit "
                 "(gathered again in backward); false keeps them until their gradients are "
                 "reduced: less communication, more memory; auto: true under full_shard, false "
                 "under shard_grad_op"));
  s.add(
      "fabric.fsdp.prefetch",
      KeySpec::choice({"auto", "true", "false"}, "auto")
          .doc("start the all-gather of the unit the previous step used next (forward and "
               "backward) while this one computes: one more unit gathered; auto: when "
               "collectives run beside compute (NCCL, Gloo), not with the shared-memory backend"));
  s.add("fabric.fsdp.cpu_offload",
        KeySpec::boolean(false).doc(
            "keep the shards (fp32 masters), their gradients and the optimizer state in host "
            "memory (pinned under CUDA) and step there (fused CPU kernels): the device holds "
            "only the units gathered for compute; the same weights, bitwise"));
  for (const char* key : {"fabric.fsdp.param_dtype", "fabric.fsdp.reduce_dtype"})
    s.add(key,
          KeySpec::choice({"auto", "fp32", "bf16", "fp16"}, "auto")
              .doc(std::string(key) == "fabric.fsdp.param_dtype"
                       ? "the dtype units are all-gathered in for compute (the shards keep "
                         "the parameters' dtype; checkpoints and exports gather exactly); "
                         "auto: the parameters' dtype"
                       : "the dtype gradients are reduce-scattered in (added into the "
                         "shards' gradients in their own dtype); auto: the parameters' dtype"));
  s.add("fabric.fsdp.wrap_modules",
        KeySpec::string("").doc(
            "comma-separated module types that become units (Linear, MyBlock; C++ type names, "
            "namespace and Impl optional)"));
  s.add("fabric.fsdp.min_unit_params",
        KeySpec::integer(1000000).min(0).doc(
            "a submodule holding at least this many parameters not in an inner unit becomes a "
            "unit; 0: off; the rest is the root unit"));

  s.add("fabric.model_parallel.tensor_parallel_size",
        KeySpec::integer(1).min(1).or_auto().doc(
            "ranks that split each layer (consecutive ranks; model_parallel only); auto: the "
            "processes of one node (with pipeline_parallel_size P: the largest count dividing "
            "both those and world size / P)"));
  s.add("fabric.model_parallel.data_parallel_size",
        KeySpec::integer(1).min(1).or_auto().doc(
            "data-parallel ranks, each its share of the batch (model_parallel only); auto: world "
            "size / (tensor_parallel_size x pipeline_parallel_size)"));
  s.add("fabric.model_parallel.data_parallel_replicate_size",
        KeySpec::integer(1).min(1).doc(
            "hybrid sharding (HSDP): copies of the fsdp-sharded model among the data-parallel "
            "ranks, fsdp over data_parallel_size / this ranks in each, gradients all-reduced "
            "across the copies; 1: fsdp over all of them"));
  s.add("fabric.model_parallel.sequence_parallel",
        KeySpec::boolean(false).doc(
            "activations cut along the sequence between the split layers (norms, dropout and "
            "residuals on T / tp positions)"));
  s.add("fabric.model_parallel.pipeline_parallel_size",
        KeySpec::integer(1).min(1).doc(
            "pipeline stages, the outermost mesh dimension: each rank holds 1 / this of the "
            "model's blocks (the first stage the embeddings, the last the norm, head and loss) "
            "and the batch runs through them in micro-batches (fabric.pipeline.*)"));
  s.add("fabric.model_parallel.context_parallel_size",
        KeySpec::integer(1).min(1).doc(
            "ranks that split each sequence (context parallelism: attention by ring over them, "
            "each rank on 2 of 2 x this chunks of every sequence; the GPT and the Llama family); "
            "their parameters are sharded together with dp's"));
  s.add("fabric.pipeline.schedule",
        KeySpec::choice({"gpipe", "1f1b", "interleaved_1f1b"}, "1f1b")
            .doc("the order of the micro-batches' forwards and backwards on each stage: gpipe "
                 "(all forwards, then all backwards), 1f1b (one of each, at most "
                 "pipeline_parallel_size micro-batches' activations held), interleaved_1f1b "
                 "(1f1b over virtual_stages stages per rank: a smaller bubble)"));
  s.add("fabric.pipeline.micro_batches",
        KeySpec::integer(0).min(0).doc(
            "micro-batches each batch is cut into (they must divide data.batch_size); 0: 2 x "
            "pipeline_parallel_size x virtual_stages (a 1f1b bubble of at most 1/3)"));
  s.add("fabric.pipeline.virtual_stages",
        KeySpec::integer(1).min(1).doc(
            "stages per rank under interleaved_1f1b (rank r holds stages r, r + pp, ...); 1 "
            "otherwise"));
  s.set_default("fabric.model_parallel.tensor_parallel_size", "auto");
  s.set_default("fabric.model_parallel.data_parallel_size", "auto");

  s.section_doc("logging", "Where results go.");
  s.add("logging.run_dir", KeySpec::string("runs/{name}/{timestamp}")
                               .doc("run directory template; fields {name}, {timestamp}, {hash}; "
                                    "relative to where the command was run"));
  s.add("logging.log_every_n_steps",
        KeySpec::integer(50).min(1).doc("progress line and metrics period (steps)"));
  s.add("logging.progress_bar",
        KeySpec::choice({"auto", "true", "false"}, "auto")
            .doc("true: redrawn in place; false: a plain line every log_every_n_steps; auto: in "
                 "place on a terminal"));
  s.add("logging.loggers",
        KeySpec::choice_list({"csv", "tensorboard"}, {"csv", "tensorboard"})
            .noun("a logger")
            .doc("where Fabric::log writes (rank 0): csv = metrics.csv in the "
                 "run directory; tensorboard = events.out.tfevents.* there; [] = nowhere"));

  s.section_doc("checkpoint", "Checkpoint policy (fabric::Checkpointer; docs/checkpoints.md).");
  s.add("checkpoint.dir", KeySpec::string("{run_dir}/checkpoints")
                              .doc("where checkpoints go; fields {run_dir}, {name}; relative to "
                                   "where the command was run"));
  s.add("checkpoint.every_n_steps",
        KeySpec::integer(0).min(0).doc("save every N optimizer steps; 0: never"));
  s.add("checkpoint.every_n_epochs",
        KeySpec::integer(1).min(0).doc("save every N epochs; 0: never"));
  s.add("checkpoint.keep_last",
        KeySpec::integer(3).min(0).doc("newest checkpoints kept in dir; 0: keep all"));
  s.add("checkpoint.save_last", KeySpec::boolean(true).doc("save when training ends"));
  s.add("checkpoint.format",
        KeySpec::choice({"auto", "full", "sharded"}, "auto")
            .doc("full: one file (rank 0 writes, everything gathered to it); sharded: a folder "
                 "to which every rank writes its own part in parallel (docs/checkpoints.md); "
                 "auto: sharded under a strategy that splits parameters or optimizer state over "
                 "the ranks (fsdp, fabric.ddp.shard_optimizer_state), else full"));
  s.add("checkpoint.async",
        KeySpec::boolean(false).doc(
            "copy the state to host memory at the save (the only stall) and write the file in a "
            "background thread while training goes on; one write in flight, the next save waits "
            "(sharded folders: every rank writes its part)"));
  s.add("checkpoint.resume",
        KeySpec::string("none").doc("none | auto (newest complete checkpoint of earlier runs of "
                                    "this name) | PATH (a .ckpt file or a checkpoint folder)"));
  s.add("checkpoint.export_weights",
        KeySpec::string("{run_dir}/weights.pt")
            .doc("model weights for Python's torch.load(weights_only=True) at the end; none: off"));
  s.add("checkpoint.export_format",
        KeySpec::choice({"pt", "safetensors", "hf"}, "pt")
            .doc("the exported weights' format: pt (torch.save's zip), safetensors (Hugging "
                 "Face's; a .pt name in checkpoint.export_weights becomes .safetensors) or hf (a "
                 "Hugging Face model folder that transformers loads, from programs with such an "
                 "architecture: examples:gpt; export_weights names the folder, .pt dropped)"));
  s.add("checkpoint.export_shard_gb",
        KeySpec::real(5.0).min(0, false).doc(
            "hf: model.safetensors above this many GB is written as shards of at most it, with "
            "model.safetensors.index.json (as save_pretrained's max_shard_size)"));
  return s;
}

void add_profiler_keys(ConfigSchema& s) {
  s.section_doc("profiler",
                "LibTorch's profiler on a schedule of steps (optimizer steps; decode steps in "
                "examples/generate) (fabric/training/profiler.h); "
                "traces in <run dir>/profiler/.");
  s.add("profiler.enabled", KeySpec::boolean(false));
  s.add("profiler.wait", KeySpec::integer(1).min(0).doc("steps skipped at the start of a cycle"));
  s.add("profiler.warmup",
        KeySpec::integer(1).min(0).doc("steps the profiler runs unrecorded before recording"));
  s.add("profiler.active", KeySpec::integer(3).min(1).doc("steps recorded into one trace"));
  s.add("profiler.repeat", KeySpec::integer(1).min(0).doc("cycles; 0: until the run ends"));
  s.add("profiler.activities",
        KeySpec::choice_list({"cpu", "cuda"}, {"cpu", "cuda"})
            .doc("what is recorded: CPU ops, CUDA kernels (cuda is left out on a CPU device)"));
  s.add("profiler.record_shapes", KeySpec::boolean(false).doc("input shapes of each op"));
  s.add("profiler.profile_memory", KeySpec::boolean(false).doc("allocations and frees"));
  s.add("profiler.with_stack", KeySpec::boolean(false).doc("source locations (slower)"));
  s.add("profiler.row_limit", KeySpec::integer(15).min(1).doc("rows of the printed table"));
}

ConfigSchema training_schema() {
  ConfigSchema s = default_schema();
  s.add("model.init_weights",
        KeySpec::string("none").doc(
            "start from these weights (.pt from torch.save(state_dict) or save_weights, or "
            ".safetensors; told apart by contents), loaded strictly into the first module "
            "Fabric::setup gets, unless the program read this key before; none: the model's own "
            "initialisation"));
  s.section_doc("callbacks", "Built-in callbacks (fabric/callbacks.h).");
  s.add("callbacks.early_stopping.monitor",
        KeySpec::string("").doc("stop when this metric of the validation stops improving "
                                "(cifar10 and the image examples: test/accuracy; gpt: val/loss); "
                                "\"\": off"));
  s.add("callbacks.early_stopping.mode",
        KeySpec::choice({"auto", "max", "min"}, "auto")
            .doc("max | min | auto (min for a name with \"loss\" in it, else max)"));
  s.add("callbacks.early_stopping.patience",
        KeySpec::integer(3).min(1).doc("evaluations without improvement before stopping"));
  s.add("callbacks.early_stopping.min_delta",
        KeySpec::real(0.0).min(0).doc("an improvement must exceed this"));
  s.add("callbacks.model_summary",
        KeySpec::boolean(false).doc("print the parameters of each top-level module at the start"));
  s.add("callbacks.lr_monitor",
        KeySpec::boolean(false).doc("log lr/group_N of every parameter group each "
                                    "logging.log_every_n_steps steps"));
  add_profiler_keys(s);
  s.section_doc("trainer", "Loop bounds.");
  s.add("trainer.max_epochs", KeySpec::integer(10).min(1));
  s.add("trainer.max_steps",
        KeySpec::integer(-1).min(-1).doc("-1: no limit (max_epochs bounds the run)"));
  s.add("trainer.eval_every_n_epochs",
        KeySpec::integer(1).min(0).doc("0: evaluate only at the end"));
  s.add("trainer.limit_eval_batches",
        KeySpec::integer(-1).min(-1).except(0).doc("-1: the whole test split"));
  s.add("trainer.accumulate_grad_batches",
        KeySpec::integer(1).min(1).doc("batches per optimizer step (gradients accumulated)"));
  s.add("trainer.ema_decay", KeySpec::real(0.0).min(0).max(1, false).doc(
                                 "average of the weights per optimizer step (e.g. 0.999); 0: off"));
  s.add("trainer.ema_warmup",
        KeySpec::boolean(true).doc("decay min(ema_decay, (1 + n) / (10 + n)) at update n"));
  s.add("trainer.gradient_clip_val",
        KeySpec::real(0.0).min(0).doc(
            "0: no clipping; Fabric::step clips the optimizer's gradients to it when the "
            "program did not read it and did not clip that step"));
  s.add("trainer.gradient_clip_algorithm", KeySpec::choice({"norm", "value"}, "norm"));
  s.add("trainer.stop_on_nonfinite",
        KeySpec::integer(10).min(0).doc(
            "stop (every rank, exit 3) after this many consecutive non-finite losses; 0: never"));

  s.section_doc("throughput", "The examples' throughput monitor (fabric/training/throughput.h).");
  s.add("throughput.peak_tflops",
        KeySpec::real(0.0).min(0).doc("one device's dense peak TFLOP/s for MFU; 0: "
                                      "fabric::peak_dense_tflops by device and precision"));
  s.add("throughput.flops_per_unit",
        KeySpec::real(0.0).min(0).doc("FLOPs of one sample's (the GPT: token's) training step; "
                                      "0: counted (fabric::FlopCounter) or the model's formula"));

  s.section_doc("data", "Loading.");
  s.add("data.root",
        KeySpec::string("").doc("dataset folder; relative to where the command was run"));
  s.add("data.batch_size",
        KeySpec::integer(128).min(1).or_auto().doc(
            "per process; auto: the largest power-of-two multiple of 8 (up to 4096 and the "
            "process's share of the data) whose training step fits in memory "
            "(Fabric::find_batch_size)"));
  s.add("data.shuffle",
        KeySpec::boolean(true).doc("reshuffled each epoch from fabric.seed + epoch"));
  s.add("data.drop_last", KeySpec::boolean(false));
  s.add(
      "data.num_workers",
      KeySpec::integer(-1).min(-1).doc(
          "background loader threads; 0 = in the loop; -1 = automatic: 0 for in-memory "
          "datasets without augmentation on CPU (a hand-over costs more than the batch), else 1"));
  s.add("data.prefetch", KeySpec::integer(2).min(1).doc("batches prepared ahead"));
  s.add("data.shuffle_buffer",
        KeySpec::integer(0).min(0).doc(
            "0: a global shuffle of every example; N: stream shards as WebDataset does, each rank "
            "reading its part of the epoch's shard order front to back through a shuffle buffer "
            "of N examples (fabric/data/sampler.h)"));
  s.add("data.on_device", KeySpec::choice({"auto", "true", "false"}, "auto")
                              .doc("keep in-memory datasets on the GPU as uint8 and augment "
                                   "there (auto: on CUDA); no effect on CPU"));

  s.section_doc("optimizer", "Built by fabric::make_optimizer.");
  s.add("optimizer.name", KeySpec::choice({"sgd", "adam", "adamw"}, "sgd").noun("an optimizer"));
  s.add("optimizer.lr", KeySpec::real(0.1).min(0, false).doc("peak learning rate"));
  s.add("optimizer.momentum", KeySpec::real(0.9).min(0).max(1, false).doc("sgd"));
  s.add("optimizer.nesterov", KeySpec::boolean(false).doc("sgd"));
  s.add("optimizer.weight_decay", KeySpec::real(0.0).min(0));
  s.add("optimizer.no_weight_decay",
        KeySpec::string_list({}).doc(
            "parameters trained without weight decay: name globs or type:GLOB module types, "
            "e.g. [\"*.bias\", \"type:*Norm*\"] (fabric/training/param_groups.h)"));
  s.add("optimizer.lr_scale",
        KeySpec::string_list({}).doc(
            "per-parameter learning-rate factors SELECTOR=FACTOR, first match wins, e.g. "
            "[\"fc.*=10\"]; schedules keep the ratios"));
  s.add("optimizer.betas",
        KeySpec::real_list({0.9, 0.999}).min(0).max(1, false).doc("adam, adamw"));
  s.add("optimizer.eps", KeySpec::real(1e-8).min(0, false).doc("adam, adamw"));
  s.add("optimizer.implementation",
        KeySpec::choice({"auto", "fused", "foreach", "for_loop"}, "auto")
            .doc("auto = fused: one kernel per step (fabric/training/fast_optimizers.h)"));

  s.section_doc("scheduler", "Learning rate per optimizer step (never scaled by world size).");
  s.add("scheduler.name",
        KeySpec::choice({"none", "cosine", "one_cycle", "linear", "step", "multistep", "plateau"},
                        "none")
            .alias("constant", "none")
            .alias("reduce_on_plateau", "plateau")
            .noun("a scheduler")
            .doc("cosine: to min_lr; one_cycle: up then down; linear: to min_lr; step: times "
                 "gamma every step_size steps; multistep: times gamma at each milestone; "
                 "plateau: times gamma when `monitor` stops improving"));
  s.add("scheduler.warmup_steps",
        KeySpec::integer(0).min(0).doc("linear warm-up from 0 (all but one_cycle)"));
  s.add("scheduler.min_lr",
        KeySpec::real(0.0).min(0).doc("cosine, linear: the end; plateau: the floor"));
  s.add("scheduler.step_size",
        KeySpec::integer(1000).min(1).doc("step: optimizer steps per decay"));
  s.add("scheduler.gamma",
        KeySpec::real(0.1).min(0, false).doc("step, multistep, plateau: decay factor"));
  s.add("scheduler.milestones",
        KeySpec::real_list({}).min(0).doc("multistep: optimizer steps, increasing"));
  s.add("scheduler.monitor",
        KeySpec::choice({"test/accuracy", "train/loss", "val/loss"}, "test/accuracy")
            .doc("plateau: the metric reported at each evaluation (accuracy: higher is better; "
                 "train/loss: the mean training loss since the last evaluation, val/loss: the "
                 "validation loss (the GPT example's default), lower is better)"));
  s.add("scheduler.patience",
        KeySpec::integer(10).min(0).doc(
            "plateau: evaluations without improvement tolerated before a reduction"));
  s.add("scheduler.threshold",
        KeySpec::real(1e-4).min(0).doc("plateau: relative improvement that counts"));
  s.add("scheduler.cooldown",
        KeySpec::integer(0).min(0).doc("plateau: evaluations ignored after a reduction"));
  s.add("scheduler.pct_start", KeySpec::real(0.3).min(0, false).max(1, false).doc("one_cycle"));
  s.add("scheduler.div_factor",
        KeySpec::real(25.0).min(0, false).doc("one_cycle: initial lr = lr / div_factor"));
  s.add("scheduler.final_div_factor",
        KeySpec::real(1e4).min(0, false).doc("one_cycle: final lr = initial / this"));
  return s;
}

}  // namespace fabric
