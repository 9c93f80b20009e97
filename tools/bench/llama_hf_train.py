"""The transformers side of gpu_check.sh --suite=pretrained (tools/bench/llama_gpu_bench.sh).

  llama_hf_train.py make OUT --text=FILE [--text=FILE ...] [--tiny] [--device=cuda]
                    [--vocab=4096] [--corpus_mb=4]
      OUT/model: a Llama-3.2-1B-shaped random Hugging Face folder (hidden 2048, 16 layers, 32
      heads, 8 key/value heads, head_dim 64, intermediate 8192, vocabulary 128,256, tied
      embeddings, rope llama3 scaling as Llama 3.2: theta 500,000, factor 32, low 1, high 4,
      original 8192; 1.24B parameters) written by save_pretrained in bfloat16 (no download:
      built on the meta device from the config, then N(0, 0.02) on --device, norms 1, seed 0);
      a byte-level BPE tokenizer.json (--vocab ids, eos <|end|>, no bos) trained by `tokenizers`
      on the --text files; OUT/corpus.txt: those files repeated to --corpus_mb MB for
      prepare_text. --tiny: hidden 64, 2 layers, 4 heads, 2 key/value heads, intermediate 128,
      vocabulary 1024 (the same code, for a CPU).
  llama_hf_train.py train --model=DIR --data=TOKENS [--batch=8 --block_size=2048 --steps=20
                    --warmup=5 --device=cuda --precision=bf16-mixed --mode=eager|compile
                    --peak_tflops=0 --lr=3e-4 --clip=1.0]
      LlamaForCausalLM.from_pretrained(DIR, attn_implementation="sdpa") in float32 (master
      weights as ours keep them under bf16-mixed) under torch.autocast(bfloat16),
      torch.optim.AdamW(fused=True) on CUDA (betas 0.9/0.95, weight decay 0.1, one group),
      clip_grad_norm_ (--clip; 0: none), the loss as HF computes it (float32 cross-entropy of
      every position). Windows of block_size + 1 tokens of TOKENS/train.bin (ids as
      meta.json says), input the first block_size, target the last. --mode=compile: each
      LlamaDecoderLayer under torch.compile (as TorchTitan compiles each block). --warmup
      untimed steps, then --steps timed between two device synchronizations. 32-true: no
      autocast.
  llama_hf_train.py decode --model=DIR --prompt_ids=FILE.json [--new_tokens=128 --device=cuda
                    --weights=float32|bfloat16]
      transformers.generate, greedy, exactly --new_tokens new ids (no eos stop), the prompt ids of
      examples/generate's generate.output (FILE.json "prompt_ids"); float32 weights run under
      torch.autocast(bfloat16) on CUDA (as ours under bf16-mixed), bfloat16 weights without it.
      The decode rate as ours computes it (generate.cc: new ids after the first over the
      time after the first): (N - 1) / (time of N new ids - time of 1), both after a warm-up.

Each prints one line `RESULT {json}` (train: tokens_per_s, mfu, step_ms, flops_per_token,
peak_device_mib; decode: decode_tokens_per_second, ids). FLOPs per token as ours count them
(fabric/models/llama.cc, LlamaConfig::flops_per_token): 6 N + 12 layers heads head_dim T, N the
parameters without the input embedding's lookup table (counted once, as the output layer, when
tied). MFU: over --peak_tflops (gpu_check passes ours' tflops / mfu so both use one peak), else
the dense bf16 peak by the device's name (H100 SXM, H200: 989; H100 PCIe: 756; A100: 312).
"""
import argparse
import glob
import json
import os
import sys
import time

import torch

FULL = dict(hidden=2048, intermediate=8192, layers=16, heads=32, kv_heads=8, head_dim=64,
            vocab=128256)
TINY = dict(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=1024)


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_tflops(device, given):
    if given > 0:
        return given
    if not device.startswith("cuda"):
        return 0.0
    name = torch.cuda.get_device_name()
    if "H100" in name and "PCIe" in name:
        return 756.0
    if "H100" in name or "H200" in name:
        return 989.0
    if "A100" in name:
        return 312.0
    return 0.0


def flops_per_token(config, n_params_unique, sequence):
    lookup = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 6.0 * (n_params_unique - lookup) + 12.0 * (
        config.num_hidden_layers * config.num_attention_heads * head_dim * sequence)


def make(a):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.time()
    texts = [t for pattern in a.text for t in sorted(glob.glob(pattern)) if os.path.isfile(t)]
    if not texts:
        sys.exit("llama_hf_train.py make: no --text files")
    folder = os.path.join(a.out, "model")
    os.makedirs(folder, exist_ok=True)
    shape = TINY if a.tiny else FULL
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    vocab = min(a.vocab, shape["vocab"])
    tok.train(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|end|>"],
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                         show_progress=False))
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|end|>", "add_bos_token": False}, f)
    eos = tok.token_to_id("<|end|>")
    # The text prepare_text turns into tokens: the files, repeated to --corpus_mb MB.
    body = "".join(open(t, encoding="utf-8", errors="replace").read() + "\n" for t in texts)
    with open(os.path.join(a.out, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write(body * max(1, int(a.corpus_mb * 1e6 / max(len(body), 1)) + 1))
    t_tok = time.time() - t0

    config = LlamaConfig(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
        head_dim=shape["head_dim"], max_position_embeddings=131072, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192})
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    # Random values without transformers' init: built empty on the device, N(0, 0.02), norms 1.
    model = model.to_empty(device=a.device)
    model.tie_weights()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    model = model.to(torch.bfloat16)
    sync(a.device)
    t_init = time.time() - t0 - t_tok
    model.generation_config.eos_token_id = eos
    model.save_pretrained(folder)
    n = sum(p.numel() for p in model.parameters())
    size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(folder, "*.safetensors")))
    print(f"{folder}: {n / 1e6:.1f}M parameters (tied), bfloat16, {size / 2**20:,.0f} MiB; "
          f"tokenizer {tok.get_vocab_size()} ids ({t_tok:.1f} s), init on {a.device} "
          f"{t_init:.1f} s, save {time.time() - t0 - t_tok - t_init:.1f} s")


def read_tokens(data):
    import numpy as np
    with open(os.path.join(data, "meta.json")) as f:
        meta = json.load(f)
    dtype = np.uint32 if meta.get("vocab_size", 0) > 65536 else np.uint16
    return np.memmap(os.path.join(data, "train.bin"), dtype=dtype, mode="r")


def train(a):
    import numpy as np
    from transformers import LlamaForCausalLM

    tokens = read_tokens(a.data)
    T, B = a.block_size, a.batch
    windows = (len(tokens) - 1) // T
    if windows < B:
        sys.exit(f"llama_hf_train.py: {a.data}/train.bin holds {windows} windows of {T + 1} "
                 f"tokens, fewer than a batch of {B}")
    model = LlamaForCausalLM.from_pretrained(a.model, dtype=torch.float32,
                                             attn_implementation="sdpa")
    model.config.use_cache = False
    model.to(a.device).train()
    n_unique = sum(p.numel() for p in model.parameters())
    fpt = flops_per_token(model.config, n_unique, T)
    fused = a.device.startswith("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95),
                                  weight_decay=0.1, fused=fused)
    if a.mode == "compile":
        for layer in model.model.layers:
            layer.compile()
    mixed = a.precision == "bf16-mixed"
    device_type = "cuda" if a.device.startswith("cuda") else "cpu"

    def batch(i):
        rows = [(i * B + b) % windows for b in range(B)]
        w = np.stack([np.asarray(tokens[r * T:r * T + T + 1], dtype=np.int64) for r in rows])
        w = torch.from_numpy(w).to(a.device, non_blocking=True)
        return w[:, :-1], w[:, 1:]

    def step(i):
        x, y = batch(i)
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=mixed):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)),
                                                 y.reshape(-1))
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    t0 = time.time()
    for i in range(a.warmup):
        loss = step(i)
    sync(a.device)
    warm_s = time.time() - t0
    if a.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    for i in range(a.warmup, a.warmup + a.steps):
        loss = step(i)
    sync(a.device)
    secs = time.time() - t0
    tps = B * T * a.steps / secs
    peak = peak_tflops(a.device, a.peak_tflops)
    result = {
        "side": f"transformers-{a.mode}", "transformers": __import__("transformers").__version__,
        "torch": torch.__version__, "device": a.device, "precision": a.precision,
        "batch": B, "block_size": T, "steps": a.steps, "warmup": a.warmup,
        "warmup_s": round(warm_s, 2), "loss": loss.item(), "parameters": n_unique,
        "tokens_per_s": tps, "step_ms": 1000 * secs / a.steps, "flops_per_token": fpt,
        "tflops": tps * fpt / 1e12, "peak_tflops": peak or None,
        "mfu": tps * fpt / (peak * 1e12) if peak else None,
        "peak_device_mib": (torch.cuda.max_memory_allocated() / 2**20
                            if a.device.startswith("cuda") else None),
    }
    print("RESULT " + json.dumps(result), flush=True)


def decode(a):
    from transformers import LlamaForCausalLM

    with open(a.prompt_ids) as f:
        prompt = json.load(f)["prompt_ids"]
    dtype = torch.bfloat16 if a.weights == "bfloat16" else torch.float32
    model = LlamaForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation="sdpa")
    model.to(a.device).eval()
    x = torch.tensor([prompt], device=a.device)
    mixed = a.device.startswith("cuda") and dtype == torch.float32
    device_type = "cuda" if a.device.startswith("cuda") else "cpu"

    def run(n):
        sync(a.device)
        t0 = time.time()
        with torch.no_grad(), torch.autocast(device_type, dtype=torch.bfloat16, enabled=mixed):
            out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                 max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
        sync(a.device)
        return time.time() - t0, out[0, len(prompt):].tolist()

    run(a.new_tokens)  # warm-up: every kernel and cache size the timed runs meet
    t1, _ = run(1)
    tn, ids = run(a.new_tokens)
    rate = (a.new_tokens - 1) / max(tn - t1, 1e-9)
    result = {"side": f"transformers-generate-{a.weights}",
              "transformers": __import__("transformers").__version__, "device": a.device,
              "prompt_tokens": len(prompt), "new_tokens": len(ids), "first_token_s": t1,
              "total_s": tn, "decode_tokens_per_second": rate, "ids": ids}
    print("RESULT " + json.dumps(result), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("out")
    m.add_argument("--text", action="append", default=[])
    m.add_argument("--tiny", action="store_true")
    m.add_argument("--device", default="cuda")
    m.add_argument("--vocab", type=int, default=4096)
    m.add_argument("--corpus_mb", type=float, default=4.0)
    t = sub.add_parser("train")
    t.add_argument("--model", required=True)
    t.add_argument("--data", required=True)
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--block_size", type=int, default=2048)
    t.add_argument("--steps", type=int, default=20)
    t.add_argument("--warmup", type=int, default=5)
    t.add_argument("--device", default="cuda")
    t.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "32-true"])
    t.add_argument("--mode", default="eager", choices=["eager", "compile"])
    t.add_argument("--peak_tflops", type=float, default=0.0)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--clip", type=float, default=1.0)
    d = sub.add_parser("decode")
    d.add_argument("--model", required=True)
    d.add_argument("--prompt_ids", required=True)
    d.add_argument("--new_tokens", type=int, default=128)
    d.add_argument("--device", default="cuda")
    d.add_argument("--weights", default="float32", choices=["float32", "bfloat16"])
    a = p.parse_args()
    {"make": make, "train": train, "decode": decode}[a.command](a)


if __name__ == "__main__":
    main()
