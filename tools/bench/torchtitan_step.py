#!/usr/bin/env python3
"""TorchTitan's Llama 3 trained at our bench shape: issue 72 item 3's reference row.

  torchtitan_step.py [--config=LLAMA/config.json | --shape=1b|tiny|debugmodel] --batch=B --seq=T
                     [--warmup=5] [--steps=20] [--device=cuda] [--precision=bf16-mixed|32-true]
                     [--mode=eager|compile] [--fsdp=1] [--peak_tflops=X] [--lr=3e-4]
                     [--float8=none|tensorwise|rowwise]

The model is torchtitan.models.llama3's own Transformer (TorchTitan 0.2.2, the last release that
imports under torch 2.11: 0.3.0 needs torch.distributed.fsdp.DataParallelMeshDims, a nightly
name), SDPA attention (attn_type "sdpa", causal), built the way TorchTitan's trainer builds it:
on the meta device, torch.compile per TransformerBlock (its apply_compile, fullgraph, with the
loss compiled too) under --mode=compile, FSDP2 (fully_shard) with its MixedPrecisionPolicy
(bf16 parameters, float32 reduction under bf16-mixed) on a one-rank process group (gloo on a
CPU, nccl on CUDA), then to_empty + init_weights. With --fsdp=0, TorchTitan's single-device path:
float32 parameters under torch.autocast(bf16). No activation checkpointing (TorchTitan's default
is selective; ours and transformers run none). Shapes: --config reads the random Llama folder's
config.json (hidden, layers, heads, key/value heads, intermediate, vocabulary, rope llama3
scaling, tied embeddings) so the row trains what ours does; --shape=1b is the same
Llama-3.2-1B shape built in, tiny the CPU one, debugmodel TorchTitan's llama3_args["debugmodel"].
Tied embeddings (Llama 3.2; TorchTitan 0.2.2's llama3 has no tying, 0.3.0's 1B has): output
shares tok_embeddings' weight, and FSDP then groups each block, and the root (embedding, norm,
output) once, instead of TorchTitan's separate embedding and norm + output groups.

--float8: TorchTitan's own float8 training (torchtitan.components.quantization.float8's
Float8LinearConverter, torchao's Float8Linear), applied where its trainer applies model
converters: to the meta-device model, before compile and FSDP. tensorwise is its default recipe
(dynamic scales, one per tensor; float8 all-gather off, as TorchTitan turns it off without
sharding), rowwise its recipe_name "rowwise"; filter_fqns ["output"] as its llama3 float8
configs, and Linear layers with a dimension not a multiple of 16 stay bf16. On a device without
float8 GEMMs (a CPU) its emulate mode (float8 casts, matmuls in high precision; eager only):
checks the row's logic, not the speed. Needs torchao (carried in bench/torchtitan.tar.gz).

Data: random token ids (torch.randint, a fresh batch of T + 1 ids per row each step), the loss
TorchTitan's (cross_entropy over float32 logits, summed, over the token count), AdamW
(betas 0.9, 0.95, weight decay 0.1, fused on CUDA as TorchTitan's "fused" default), gradients
clipped to 1.0 (torchtitan.distributed.utils.clip_grad_norm_). Timed: --steps after --warmup,
synchronised; tokens/s = B T steps / seconds; peak memory torch.cuda.max_memory_allocated over
the timed steps (None on a CPU). FLOPs per token as llama_hf_train.py counts them (6 N + 12
layers heads head_dim T, N without the lookup table when untied), MFU over --peak_tflops (else
the dense bf16 peak by device name). Prints one line `RESULT {json}`, the keys of the other
training rows of llama_gpu_bench.sh.

Only the model's modules are used: torchtitan.models.llama3 imports its trainer's pieces
(datasets, torch.utils.tensorboard, tokenizers) at module import; when one of those is missing
here, an empty stand-in module is put in sys.modules first (named on stderr), its names are
never called. Needs on the path: torchtitan, torchdata, tyro, docstring_parser, typeguard,
typing_extensions (gpu_check.sh build carries them as bench/torchtitan.tar.gz).
"""
import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import types


def stub_missing():
    """Empty modules for what only TorchTitan's trainer uses, when not installed."""
    stubbed = []

    class Stub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)

            def unavailable(*args, **kwargs):
                raise RuntimeError(f"torchtitan_step.py: {self.__name__}.{name} is a stand-in")
            return type(name, (), {"__init__": unavailable, "__call__": unavailable})

    def have(name):
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    for top, subs in (("datasets", ("datasets.distributed",)), ("tokenizers", ())):
        if not have(top):
            for name in (top, *subs):
                sys.modules[name] = Stub(name)
            stubbed.append(top)
    if not have("tensorboard"):  # torch.utils.tensorboard raises ImportError without it
        sys.modules["torch.utils.tensorboard"] = Stub("torch.utils.tensorboard")
        stubbed.append("torch.utils.tensorboard")
    return stubbed


SHAPES = {
    "1b": dict(hidden=2048, intermediate=8192, layers=16, heads=32, kv_heads=8, vocab=128256,
               tied=True, rope_theta=500000.0, rope_factor=32.0, low=1.0, high=4.0, original=8192),
    "tiny": dict(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=1024,
                 tied=True, rope_theta=500000.0, rope_factor=32.0, low=1.0, high=4.0,
                 original=8192),
}


def shape_from_config(path):
    with open(path) as f:
        c = json.load(f)
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    return dict(hidden=c["hidden_size"], intermediate=c["intermediate_size"],
                layers=c["num_hidden_layers"], heads=c["num_attention_heads"],
                kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
                vocab=c["vocab_size"], tied=bool(c.get("tie_word_embeddings", False)),
                rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 500000.0))),
                rope_factor=float(rope.get("factor", 8.0)),
                low=float(rope.get("low_freq_factor", 1.0)),
                high=float(rope.get("high_freq_factor", 4.0)),
                original=int(rope.get("original_max_position_embeddings", 8192)))


def convert_float8(model, a, cuda):
    """TorchTitan's Float8LinearConverter on `model` (meta device); what it did, for RESULT."""
    import torchao
    from torchtitan.components.quantization.float8 import Float8LinearConverter
    from torchtitan.config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchao.float8.float8_linear import Float8Linear

    jc = JobConfig()
    jc.model.converters = ["quantize.linear.float8"]
    f8 = jc.quantize.linear.float8
    f8.recipe_name = None if a.float8 == "tensorwise" else a.float8
    f8.filter_fqns = ["output"]
    emulate = not (cuda and torch_capability() >= (8, 9))
    if emulate and (a.mode == "compile" or a.float8 == "rowwise"):
        sys.exit("torchtitan_step.py: without float8 GEMMs (a GPU of compute capability 8.9+) "
                 "--float8 is emulated: tensorwise and eager only")
    f8.emulate = emulate
    jc.compile.enable = a.mode == "compile"
    jc.compile.components = ["model", "loss"]
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    converter = Float8LinearConverter(jc, dims)
    if not converter.enabled:
        sys.exit("torchtitan_step.py: TorchTitan's Float8LinearConverter did not enable itself")
    converter.convert(model)
    converted = sum(isinstance(m, Float8Linear) for m in model.modules())
    if converted == 0:
        sys.exit("torchtitan_step.py: --float8 converted no Linear layer")
    return {"recipe": a.float8, "torchao": torchao.__version__, "layers": converted,
            "emulate": emulate}


def torch_capability():
    import torch
    return torch.cuda.get_device_capability()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="")
    p.add_argument("--shape", default="1b", choices=["1b", "tiny", "debugmodel"])
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "32-true"])
    p.add_argument("--mode", default="eager", choices=["eager", "compile"])
    p.add_argument("--fsdp", type=int, default=1)
    p.add_argument("--peak_tflops", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--float8", default="none", choices=["none", "tensorwise", "rowwise"])
    a = p.parse_args()

    stubbed = stub_missing()
    if stubbed:
        print(f"torchtitan_step.py: stand-ins for {', '.join(stubbed)} (not installed; "
              "only TorchTitan's trainer uses them)", file=sys.stderr)
    import torch
    import torch.distributed as dist
    import torchtitan
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.config.job_config import Compile as CompileConfig
    from torchtitan.distributed.utils import clip_grad_norm_
    from torchtitan.models.llama3 import Transformer, TransformerModelArgs, llama3_args
    from torchtitan.models.llama3.infra.parallelize import apply_compile, apply_fsdp
    from torchtitan.models.llama3.model.args import RoPEScalingArgs

    version = getattr(torchtitan, "__version__", "?")
    if a.config:
        s = shape_from_config(a.config)
        flavor = os.path.basename(os.path.dirname(os.path.abspath(a.config))) or "config"
    elif a.shape != "debugmodel":
        s, flavor = SHAPES[a.shape], a.shape
    else:
        s, flavor = None, "debugmodel"
    if s is None:
        margs = llama3_args["debugmodel"]
        margs.max_seq_len = a.seq
        tied = False
    else:
        # SwiGLU hidden: TorchTitan's int(multiplier * int(8 dim / 3)) rounded up to multiple_of;
        # multiple_of = intermediate and that multiplier give intermediate exactly.
        base = int(2 * 4 * s["hidden"] / 3)
        margs = TransformerModelArgs(
            dim=s["hidden"], n_layers=s["layers"], n_heads=s["heads"], n_kv_heads=s["kv_heads"],
            vocab_size=s["vocab"], multiple_of=s["intermediate"],
            ffn_dim_multiplier=s["intermediate"] / base, norm_eps=1e-5, rope_theta=s["rope_theta"],
            rope_scaling_args=RoPEScalingArgs(
                scaling_factor=s["rope_factor"], low_freq_factor=s["low"],
                high_freq_factor=s["high"], original_max_position_embeddings=s["original"]),
            max_seq_len=a.seq, attn_type="sdpa", attn_mask_type="causal")
        tied = s["tied"]

    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    mixed = a.precision == "bf16-mixed"
    store_dir = None
    if a.fsdp:
        store_dir = tempfile.mkdtemp(prefix="torchtitan_step_")
        dist.init_process_group("nccl" if cuda else "gloo",
                                store=dist.FileStore(os.path.join(store_dir, "store"), 1),
                                rank=0, world_size=1)
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp_shard",))

    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer(margs)
    if tied:
        model.output.weight = model.tok_embeddings.weight
    w1 = model.layers["0"].feed_forward.w1.out_features
    if s is not None and w1 != s["intermediate"]:
        sys.exit(f"torchtitan_step.py: feed-forward width {w1}, not {s['intermediate']}")
    float8 = convert_float8(model, a, cuda) if a.float8 != "none" else None
    loss_fn = cross_entropy_loss
    if a.mode == "compile":
        apply_compile(model, CompileConfig(enable=True, backend="inductor"))
        loss_fn = torch.compile(loss_fn, backend="inductor")
    if a.fsdp:
        param_dtype = torch.bfloat16 if mixed else torch.float32
        if not tied:
            apply_fsdp(model, mesh, param_dtype=param_dtype, reduce_dtype=torch.float32,
                       pp_enabled=False)
        else:  # a shared weight must sit in one FSDP group: the root's
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
            for block in model.layers.values():
                fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
            fully_shard(model, mesh=mesh, mp_policy=mp)
    model.to_empty(device=device)
    if tied and not a.fsdp:  # to_empty moves each module's parameters apart
        model.output.weight = model.tok_embeddings.weight
    with torch.no_grad():
        model.init_weights(buffer_device=device)
    if tied:
        assert model.output.weight is model.tok_embeddings.weight
    model.train()
    n_unique = sum(p.numel() for p in model.parameters())
    lookup = 0 if tied else margs.vocab_size * margs.dim
    head_dim = margs.dim // margs.n_heads
    T, B = a.seq, a.batch
    fpt = 6.0 * (n_unique - lookup) + 12.0 * margs.n_layers * margs.n_heads * head_dim * T
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95),
                                  weight_decay=0.1, eps=1e-8, fused=cuda)
    autocast = mixed and not a.fsdp  # FSDP's policy casts; without it TorchTitan uses AMP
    gen = torch.Generator(device=device)
    gen.manual_seed(0)

    def step():
        w = torch.randint(0, margs.vocab_size, (B, T + 1), device=device, generator=gen)
        x, y = w[:, :-1], w[:, 1:]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            pred = model(x)
        loss = loss_fn(pred, y) / (B * T)
        del pred
        loss.backward()
        if a.clip > 0:
            clip_grad_norm_([p for p in model.parameters()], a.clip, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    t0 = time.time()
    losses = []
    for _ in range(a.warmup):
        losses.append(step().item())
    sync()
    warm_s = time.time() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.time()
    for _ in range(a.steps):
        loss = step()
    sync()
    secs = time.time() - t0
    losses.append(loss.item())
    tps = B * T * a.steps / secs
    # The same peak as the transformers rows (llama_hf_train.py sits beside this file).
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from llama_hf_train import peak_tflops
    peak = peak_tflops(a.device, a.peak_tflops)
    result = {
        "side": f"torchtitan-{'' if float8 is None else 'fp8-'}{a.mode}", "torchtitan": version,
        "torch": torch.__version__,
        "device": a.device, "precision": a.precision, "flavor": flavor, "tied": tied,
        "fsdp": bool(a.fsdp), "attention": margs.attn_type, "stand_ins": stubbed,
        "float8": float8,
        "batch": B, "block_size": T, "steps": a.steps, "warmup": a.warmup,
        "warmup_s": round(warm_s, 2), "loss0": losses[0], "loss": losses[-1],
        "parameters": n_unique, "tokens_per_s": tps, "step_ms": 1000 * secs / a.steps,
        "flops_per_token": fpt, "tflops": tps * fpt / 1e12, "peak_tflops": peak or None,
        "mfu": tps * fpt / (peak * 1e12) if peak else None,
        "peak_device_mib": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None,
    }
    print("RESULT " + json.dumps(result), flush=True)
    if a.fsdp:
        dist.destroy_process_group()
        import shutil
        shutil.rmtree(store_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
