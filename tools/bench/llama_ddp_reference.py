"""The transformers side of docs/benchmarks.md "Pretrained Llama on CPU".

Training: the Hugging Face Llama folder as LlamaForCausalLM (attn_implementation="sdpa", float32)
in WORLD processes (self-launched, rank 0 is this one) over Gloo with
torch.nn.parallel.DistributedDataParallel (PyTorch's defaults: bucket_cap_mb 25,
broadcast_buffers), torch.optim.AdamW, the windows examples/gpt trains on (fabric/data/tokens.h:
window i is the block_size + 1 tokens from token i * block_size of train.bin, input its first
block_size, target its last; each epoch a permutation seeded by seed + epoch, rank r taking every
WORLD-th window from r), the loss as ours computes it (float32 logits of every position,
cross-entropy against the shifted window). Prints the training rate as examples/gpt's summary.json
tokens_per_s computes it: every rank's tokens over the training loop's time (first step included,
model loading, imports and process start excluded).

  python3 tools/bench/llama_ddp_reference.py train --model=DIR --data=TOKENS
      [--config=RUN/config.yaml] [--batch_size=8 --block_size=256 --steps=12 --lr=3e-4
       --betas=0.9,0.999 --eps=1e-8 --weight_decay=0.1 --seed=42] [--world=2] [--threads=1]
      [--optimizer=fused|foreach|for_loop] [--phases] [--profile]

--config reads optimizer.{lr,betas,eps,weight_decay,implementation}, data.batch_size,
model.block_size, trainer.max_steps and fabric.seed from a run directory's resolved config.yaml of
examples/gpt (flags given win over it). --optimizer: torch.optim.AdamW(fused=True) (ours: auto =
fused, fabric/training/fast_optimizers.h), foreach=True, or foreach=False (the single-tensor loop,
torch::optim::AdamW's). --threads: torch.set_num_threads and set_num_interop_threads in every
process (ours prints "N thread(s) per process"; 0: leave PyTorch's default). --phases: also time
forward, backward (with DDP's all-reduces) and the optimizer step per step (barrier-free
wall-clock splits of rank 0, medians over the steps). --profile: torch.profiler over steps 5-7
(as ours with profiler.enabled=true profiler.wait=3 profiler.warmup=1 profiler.active=3), rank 0's
ops by self time.

Decode: transformers.generate on the folder's model (AutoModelForCausalLM: a Llama, Qwen2 or
GPT-2), greedy (do_sample=False), no eos stop (as our generate.stop_at_eos=false), batch 1, a
key/value cache (DynamicCache, the default), the prompt encoded by the folder's tokenizer.json with
`tokenizers` (the ids our tokenizer gives; --prompt_ids=FILE takes them from examples/generate's
generate.output JSON instead). Decode tokens/s as fabric/models/generate.cc computes it: (new
tokens - 1) over the time from the first new token to the last.

  python3 tools/bench/llama_ddp_reference.py decode --model=DIR --prompt=TEXT
      [--max_new_tokens=256] [--threads=2] [--prompt_ids=FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["train", "decode", "_rank"])
    p.add_argument("--model", required=True)
    p.add_argument("--data")
    p.add_argument("--config")
    p.add_argument("--batch_size", type=int)
    p.add_argument("--block_size", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--betas")
    p.add_argument("--eps", type=float)
    p.add_argument("--weight_decay", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--optimizer", choices=["fused", "foreach", "for_loop"])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--phases", action="store_true")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--prompt", default="def ")
    p.add_argument("--prompt_ids")
    p.add_argument("--max_new_tokens", type=int, default=256)
    a = p.parse_args(argv)
    defaults = dict(batch_size=8, block_size=256, steps=12, lr=3e-4, betas="0.9,0.999", eps=1e-8,
                    weight_decay=0.1, seed=42, optimizer="fused")
    from_config = {}
    if a.config:
        import yaml
        with open(a.config) as f:
            c = yaml.safe_load(f)
        o = c["optimizer"]
        if o["name"] != "adamw":
            sys.exit(f"{a.config}: optimizer.name {o['name']}, not adamw")
        impl = o.get("implementation", "auto")
        from_config = dict(lr=float(o["lr"]), betas=",".join(str(b) for b in o["betas"]),
                           eps=float(o["eps"]), weight_decay=float(o["weight_decay"]),
                           optimizer="fused" if impl == "auto" else impl,
                           batch_size=int(c["data"]["batch_size"]),
                           block_size=int(c["model"]["block_size"]),
                           steps=int(c["trainer"]["max_steps"]), seed=int(c["fabric"]["seed"]))
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, from_config.get(k, v))
    if a.threads is None:
        a.threads = 1 if a.mode != "decode" else 2
    return a


def set_threads(torch, n):
    if n > 0:
        torch.set_num_threads(n)
        torch.set_num_interop_threads(n)


def launch(argv, a):
    """rank 0 here, ranks 1.. as child processes of this script (as ours self-launches)."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port),
               WORLD_SIZE=str(a.world))
    children = [subprocess.Popen([sys.executable, __file__, "_rank", *argv[2:], f"--rank={r}"],
                                 env=dict(env, RANK=str(r))) for r in range(1, a.world)]
    os.environ.update(env, RANK="0")
    rc = run_rank(a)
    for ch in children:
        rc = rc or ch.wait()
    return rc


def run_rank(a):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM
    set_threads(torch, a.threads)
    rank, world = a.rank, a.world
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(a.seed)
    model = LlamaForCausalLM.from_pretrained(a.model, dtype=torch.float32,
                                             attn_implementation="sdpa")
    model.train()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    betas = tuple(float(b) for b in a.betas.split(","))
    kind = {"fused": dict(fused=True), "foreach": dict(foreach=True),
            "for_loop": dict(foreach=False)}[a.optimizer]
    opt = torch.optim.AdamW(ddp.parameters(), lr=a.lr, betas=betas, eps=a.eps,
                            weight_decay=a.weight_decay, **kind)

    with open(os.path.join(a.data, "meta.json")) as f:
        meta = json.load(f)
    dtype = np.uint32 if meta.get("token_dtype") == "uint32" or meta["vocab_size"] > 65536 \
        else np.uint16
    data = np.memmap(os.path.join(a.data, "train.bin"), dtype=dtype, mode="r")
    T = a.block_size
    windows = (len(data) - 1) // T

    def epoch_order(epoch):
        g = torch.Generator().manual_seed(a.seed + epoch)
        return torch.randperm(windows, generator=g)[rank::world].tolist()

    def batches():
        epoch = 0
        while True:
            order = epoch_order(epoch)
            for i in range(0, len(order), a.batch_size):
                rows = np.stack([np.asarray(data[w * T:w * T + T + 1], dtype=np.int64)
                                 for w in order[i:i + a.batch_size]])
                t = torch.from_numpy(rows)
                yield t[:, :-1], t[:, 1:]
            epoch += 1

    stream = batches()
    dist.barrier()
    tokens = 0
    phases = {"data": [], "forward": [], "backward": [], "optimizer": []}
    prof = None
    if a.profile and rank == 0:
        from torch.profiler import ProfilerActivity, profile, schedule
        prof = profile(activities=[ProfilerActivity.CPU],
                       schedule=schedule(wait=3, warmup=1, active=3, repeat=1))
        prof.start()
    start = time.perf_counter()
    for _ in range(a.steps):
        t0 = time.perf_counter()
        x, y = next(stream)
        t1 = time.perf_counter()
        logits = ddp(input_ids=x).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        tokens += x.numel()
        if prof:
            prof.step()
        if a.phases:
            for k, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                phases[k].append(1e3 * v)
    seconds = time.perf_counter() - start
    if prof:
        prof.stop()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30), flush=True)
    last = loss.detach()
    dist.all_reduce(last)
    if rank == 0:
        rate = tokens * world / seconds
        print(f"reference: tokens/s {rate:.1f} ({tokens * world} tokens of {world} ranks in "
              f"{seconds:.3f} s; {a.steps} steps, batch {a.batch_size} per rank, window {T}, "
              f"AdamW {a.optimizer} lr {a.lr} betas {betas} eps {a.eps} weight_decay "
              f"{a.weight_decay}, {torch.get_num_threads()} thread(s) per process, Gloo; "
              f"last loss {last.item() / world:.4f})", flush=True)
        if a.phases:
            med = {k: float(np.median(v)) for k, v in phases.items()}
            print("reference phases (rank 0, median ms per step): " +
                  ", ".join(f"{k} {v:.1f}" for k, v in med.items()) +
                  f"; first step {sum(p[0] for p in phases.values()):.1f} ms", flush=True)
        print(json.dumps({"tokens_per_s": rate, "seconds": seconds, "steps": a.steps}), flush=True)
    dist.destroy_process_group()
    return 0


def decode(a):
    import torch
    from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList
    set_threads(torch, a.threads)
    if a.prompt_ids:
        with open(a.prompt_ids) as f:
            ids = json.load(f)["prompt_ids"]
    else:
        from tokenizers import Tokenizer
        ids = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json")).encode(a.prompt).ids
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0

    stamps = []

    class Stamp(StoppingCriteria):  # called once per new token, after it is chosen
        def __call__(self, input_ids, scores, **kwargs):
            stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    x = torch.tensor([ids], dtype=torch.int64)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=a.max_new_tokens, min_new_tokens=0,
                             stopping_criteria=StoppingCriteriaList([Stamp()]))
        total = time.perf_counter() - t0
    new = out.shape[1] - x.shape[1]
    rate = (new - 1) / (stamps[-1] - stamps[0]) if new > 1 else 0.0
    print(f"reference generate: {len(ids)} prompt ids, {new} new ids; decode {rate:.1f} tokens/s "
          f"(prefill {1e3 * (stamps[0] - t0):.1f} ms, total {total:.3f} s, "
          f"{torch.get_num_threads()} thread(s))", flush=True)
    print(json.dumps({"decode_tokens_per_second": rate, "ids": out[0, x.shape[1]:].tolist()}),
          flush=True)
    return 0


def main():
    a = parse(sys.argv[1:])
    if a.mode == "decode":
        return decode(a)
    if a.mode == "_rank":
        return run_rank(a)
    return launch(sys.argv, a)


if __name__ == "__main__":
    sys.exit(main())
