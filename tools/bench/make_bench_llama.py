"""The tiny Llama of docs/benchmarks.md "Pretrained Llama on CPU" (not committed data: written to
a folder of your choice).

usage: make_bench_llama.py OUT [--prepare_text=bazel-bin/tools/prepare_text] [--gpt2]
                               [hidden=256 intermediate=704 layers=4 heads=8 kv_heads=4 vocab=4096]
                               [model_vocab=0]

Writes
  OUT/model   a Hugging Face Llama folder (LlamaForCausalLM, float32, random N(0, 0.02) weights with
              seed 0, untied lm_head, 2048 positions) with a byte-level BPE tokenizer.json trained
              by `tokenizers` on this repository's README.md and docs/*.md (vocab ids, eos
              <|end|>, no bos);
  OUT/tokens  train.bin / val.bin / meta.json of those documents through our prepare_text
              --tokenizer=OUT/model/tokenizer.json (skipped when the binary is missing:
              `bazel build //tools:prepare_text`).
The defaults: about 4.9M parameters (2.1M of them the embedding and the head).

--gpt2: OUT/model is a GPT-2 instead (GPT2LMHeadModel: n_embd = hidden, n_layer = layers, n_head =
heads, 1024 positions, tied embeddings, gelu_new; intermediate and kv_heads unused), random
N(0, 0.02) weights with seed 0 and LayerNorms of 1 and 0. model_vocab: the model's vocabulary when
larger than the tokenizer's (e.g. GPT-2 124M: --gpt2 hidden=768 layers=12 heads=12
model_vocab=50257); 0: the tokenizer's.
"""
import glob
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def main():
    out = None
    prepare = os.path.join(REPO, "bazel-bin/tools/prepare_text")
    a = dict(hidden=256, intermediate=704, layers=4, heads=8, kv_heads=4, vocab=4096,
             model_vocab=0)
    gpt2 = False
    for arg in sys.argv[1:]:
        if arg == "--gpt2":
            gpt2 = True
        elif arg.startswith("--prepare_text="):
            prepare = arg.split("=", 1)[1]
        elif "=" in arg:
            k, v = arg.split("=", 1)
            if k not in a:
                sys.exit(f"make_bench_llama.py: unknown argument {k} (one of {', '.join(a)})")
            a[k] = int(v)
        elif out is None:
            out = arg
        else:
            sys.exit(__doc__)
    if out is None:
        sys.exit(__doc__)
    texts = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs/*.md")))
    folder = os.path.join(out, "model")
    os.makedirs(folder, exist_ok=True)

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a["vocab"], special_tokens=["<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train(texts, trainer)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|end|>", "add_bos_token": False}, f)
    eos = tok.token_to_id("<|end|>")

    torch.manual_seed(0)
    vocab = max(tok.get_vocab_size(), a["model_vocab"])
    if gpt2:
        config = GPT2Config(vocab_size=vocab, n_embd=a["hidden"], n_layer=a["layers"],
                            n_head=a["heads"], n_positions=1024, activation_function="gelu_new",
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            eos_token_id=eos, bos_token_id=eos)
        with torch.device("meta"):
            model = GPT2LMHeadModel(config)
    else:
        config = LlamaConfig(vocab_size=vocab, hidden_size=a["hidden"],
                             intermediate_size=a["intermediate"], num_hidden_layers=a["layers"],
                             num_attention_heads=a["heads"], num_key_value_heads=a["kv_heads"],
                             max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
                             tie_word_embeddings=False, eos_token_id=eos, bos_token_id=None)
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or ".ln_" in name:  # Llama's RMSNorms, GPT-2's LayerNorms
                p.copy_(torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p))
            else:
                p.copy_(torch.randn_like(p) * 0.02)
        if gpt2:
            model.tie_weights()
    model.generation_config.eos_token_id = eos
    model.save_pretrained(folder, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"{folder}: {n / 1e6:.2f}M parameters, vocabulary {config.vocab_size}")

    tokens = os.path.join(out, "tokens")
    if os.path.exists(prepare):
        subprocess.run([prepare, *[f"--input={t}" for t in texts], f"--output={tokens}",
                        f"--tokenizer={os.path.join(folder, 'tokenizer.json')}"], check=True)
        with open(os.path.join(tokens, "meta.json")) as f:
            meta = json.load(f)
        print(f"{tokens}: {meta.get('train_tokens')} train, {meta.get('val_tokens')} val tokens")
    else:
        print(f"{prepare}: missing; run it yourself: --tokenizer={folder}/tokenizer.json "
              f"--output={tokens}")


if __name__ == "__main__":
    main()
