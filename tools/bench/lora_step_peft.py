"""One LoRA fine-tuning step on CPU in transformers + peft: the reference for
//tools/bench:lora_step (docs/benchmarks.md, "LoRA fine-tuning step on CPU").

usage: lora_step_peft.py --model=DIR [--threads=N] [--warmup=3] [--steps=10] [--batch=8]
                         [--seq=256] [--rank=8] [--alpha=16] [--targets=q_proj,k_proj,v_proj,o_proj]
                         [--lr=1e-3] [--seed=0] [--load_adapter=DIR] [--profile]
                         [--device=cpu|cuda] [--precision=32-true|bf16-mixed]

The Hugging Face Llama folder --model (tools/bench/make_bench_llama.py) loads as
LlamaForCausalLM(attn_implementation="sdpa", float32, CPU); peft's LoraConfig puts adapters of
--rank, --alpha and dropout 0 on the --targets layers (lora_A drawn after
torch.manual_seed(--seed); --load_adapter: the adapter folder lora_step --save_adapter wrote, so
both start from the same weights); torch.optim.AdamW(fused=True) (lr --lr, weight decay 0.01)
trains the adapters only. The batch: --batch windows of --seq + 1 ids from
torch.manual_seed(--seed) + torch.randint (the ids lora_step draws); inputs the first --seq,
targets the next. Each step: forward (use_cache off), loss = mean cross-entropy over every
position, backward, step, zero_grad; --warmup untimed steps, then --steps timed ones.

--device=cuda --precision=bf16-mixed: the model on the GPU under torch.autocast(bfloat16)
(weights float32, the loss in float32), "peak_mib" torch.cuda.max_memory_allocated.
--threads: torch.set_num_threads and set_num_interop_threads; without it torch's default.
--profile: torch.profiler over 3 more steps after the timed ones, its op table (self CPU time)
to stderr.

Prints one line: RESULT {json} with lora_step's keys (impl "peft").
"""
import json
import statistics
import sys
import time

import torch


def parse(argv):
    a = dict(model=None, threads=0, warmup=3, steps=10, batch=8, seq=256, rank=8, alpha=16.0,
             targets="q_proj,k_proj,v_proj,o_proj", lr=1e-3, seed=0, load_adapter=None,
             profile=False, device="cpu", precision="32-true")
    for arg in argv:
        if arg == "--profile":
            a["profile"] = True
            continue
        if not arg.startswith("--") or "=" not in arg:
            sys.exit(__doc__)
        key, value = arg[2:].split("=", 1)
        if key not in a:
            sys.exit(__doc__)
        default = a[key]
        a[key] = type(default)(value) if default is not None else value
    if a["model"] is None or a["steps"] < 1:
        sys.exit(__doc__)
    return a


def main():
    a = parse(sys.argv[1:])
    if a["threads"] > 0:
        torch.set_num_threads(a["threads"])
        torch.set_num_interop_threads(a["threads"])

    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(a["model"], attn_implementation="sdpa",
                                            dtype=torch.float32)
    if a["load_adapter"]:
        model = PeftModel.from_pretrained(base, a["load_adapter"], is_trainable=True)
    else:
        torch.manual_seed(a["seed"])  # peft's random lora_A, the same every run
        config = LoraConfig(r=a["rank"], lora_alpha=a["alpha"], lora_dropout=0.0,
                            target_modules=a["targets"].split(","), bias="none",
                            task_type="CAUSAL_LM")
        model = get_peft_model(base, config)
    model.to(a["device"])
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=a["lr"], weight_decay=0.01, fused=True)

    torch.manual_seed(a["seed"])
    vocab = base.config.vocab_size
    ids = torch.randint(0, vocab, (a["batch"], a["seq"] + 1), dtype=torch.long)
    x, y = ids[:, :-1].contiguous().to(a["device"]), ids[:, 1:].contiguous().to(a["device"])
    bf16 = a["precision"] == "bf16-mixed"

    def step():
        with torch.autocast(device_type=a["device"].split(":")[0], dtype=torch.bfloat16,
                            enabled=bf16):
            logits = model(input_ids=x, use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    losses, step_ms = [], []
    for i in range(a["warmup"] + a["steps"]):
        start = time.perf_counter()
        losses.append(step())
        ms = (time.perf_counter() - start) * 1e3
        if i >= a["warmup"]:
            step_ms.append(ms)
    if a["profile"]:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15),
              file=sys.stderr)

    median = statistics.median(step_ms)
    result = {"impl": "peft", "threads": torch.get_num_threads(), "batch": a["batch"],
              "seq": a["seq"], "tokens_per_s": a["batch"] * a["seq"] / (median / 1e3),
              "step_ms_median": median, "step_ms_min": min(step_ms),
              "trainable_params": sum(p.numel() for p in trainable), "loss0": losses[0],
              "loss": losses[-1], "losses": losses, "tokens_sum": int(ids.sum()),
              "device": a["device"], "precision": a["precision"],
              "peak_mib": torch.cuda.max_memory_allocated() / 2**20
              if a["device"].startswith("cuda") else None}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
