#!/usr/bin/env python3
"""The PyTorch side of the GPT throughput comparison (the C++ side: tools/bench/throughput.cc
--model=gpt2).

The model is fabric::models::GPT (fabric/models/gpt.cc) written in PyTorch: pre-LN blocks, causal
attention through F.scaled_dot_product_attention, GELU (tanh approximation) MLP, learned
positions, the output projection tied to the token embedding, GPT-2 initialization (N(0, 0.02),
residual projections N(0, 0.02 / sqrt(2 n_layer)), biases 0). The step is the C++ one: random token
windows cycled from a pool of 4 batches on the device, bf16 autocast, next-token cross-entropy in
float32, AdamW (lr 6e-4, betas 0.9/0.95, weight decay 0.1 on matrices only; fused), optional
clipping. --mode=eager runs it as written, --mode=compile under torch.compile(model).

Prints one line: RESULT {"framework": "pytorch-eager"|"pytorch-compile", "tokens_per_s": ...,
"mfu": ..., ...} (JSON), as throughput.cc does.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024, block_size=1024, vocab_size=50304),
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280, block_size=1024, vocab_size=50304),
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600, block_size=1024, vocab_size=50304),
    "gpt-tiny": dict(n_layer=4, n_head=4, n_embd=128, block_size=256, vocab_size=256),
}


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head = c["n_head"]
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"])

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"])
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"])

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["n_embd"])
        self.attn = Attention(c)
        self.ln_2 = nn.LayerNorm(c["n_embd"])
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["block_size"], c["n_embd"])
        self.h = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(c["n_embd"])
        residual_std = 0.02 / math.sqrt(2 * c["n_layer"])
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, residual_std)
            elif p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith(".bias") and not name.startswith("ln") and ".ln_" not in name:
                nn.init.zeros_(p)

    def forward(self, tokens):
        T = tokens.size(1)
        x = self.wte(tokens) + self.wpe(torch.arange(T, device=tokens.device))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def flops_per_token(c, parameters):
    # GPTConfig::flops_per_token: 6 N (N without the position embedding) + 12 L d T.
    n = parameters - c["block_size"] * c["n_embd"]
    return 6.0 * n + 12.0 * c["n_layer"] * c["n_embd"] * c["block_size"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt2", choices=sorted(PRESETS))
    ap.add_argument("--mode", default="eager", choices=["eager", "compile"])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=0, help="tokens per sequence (0: block_size)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "32-true"])
    ap.add_argument("--clip", type=float, default=0.0)
    ap.add_argument("--peak_tflops", type=float, default=989.0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--profile", default="",
                    help="write a Chrome trace of --profile_steps timed steps (from timed step "
                         "min(20, steps/2) on) to this path, as throughput.cc --profile does")
    ap.add_argument("--profile_steps", type=int, default=8)
    args = ap.parse_args()

    torch.manual_seed(0)
    c = dict(PRESETS[args.model])
    if args.seq:
        c["block_size"] = args.seq
    device = torch.device(args.device)
    model = GPT(c).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=6e-4, betas=(0.9, 0.95), fused=True)
    step_model = torch.compile(model) if args.mode == "compile" else model
    T = c["block_size"]
    gen = torch.Generator().manual_seed(0)
    pool = [torch.randint(0, c["vocab_size"], (args.batch, T + 1), generator=gen).to(device)
            for _ in range(4)]
    amp = args.precision == "bf16-mixed"

    def step(i):
        w = pool[i % len(pool)]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = step_model(w[:, :T])
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for i in range(args.warmup):
        step(i)
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    profile_from = min(20, args.steps // 2)
    profile_to = min(args.steps, profile_from + args.profile_steps)
    prof = None
    t0 = time.perf_counter()
    for i in range(args.steps):
        if args.profile and i == profile_from:
            sync()
            activities = [torch.profiler.ProfilerActivity.CPU]
            if device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            prof = torch.profiler.profile(activities=activities)
            prof.__enter__()
        with torch.profiler.record_function("train_step"):
            step(i)
        if prof is not None and i + 1 == profile_to:
            sync()
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(args.profile)
            prof = None
    sync()
    seconds = time.perf_counter() - t0
    tokens_per_s = args.steps * args.batch * T / seconds
    tflops = flops_per_token(c, parameters) * tokens_per_s / 1e12
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else 0.0
    print("RESULT " + json.dumps({
        "framework": "pytorch-" + args.mode, "model": args.model, "batch": args.batch, "seq": T,
        "precision": args.precision, "clip": args.clip, "parameters": parameters,
        "steps": args.steps, "seconds": round(seconds, 6), "tokens_per_s": round(tokens_per_s, 1),
        "step_ms": round(1000 * seconds / args.steps, 4), "tflops": round(tflops, 2),
        "mfu": round(tflops / args.peak_tflops, 4), "peak_device_mib": round(peak, 1),
        "device": str(device), "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
