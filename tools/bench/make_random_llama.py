"""A random Hugging Face Llama folder for tools/bench:pretrained_memory (not a test input; written
to a temporary folder, never committed).

usage: make_random_llama.py OUT_DIR [hidden=1024 intermediate=2816 layers=12 heads=16 kv_heads=8
                                     vocab=32000 dtype=float32]

save_pretrained(OUT_DIR, safe_serialization=True): config.json and model.safetensors (or shards
over 2 GB). The defaults make about 205M parameters (820 MB in float32).
"""
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

out = sys.argv[1]
a = dict(hidden=1024, intermediate=2816, layers=12, heads=16, kv_heads=8, vocab=32000,
         dtype="float32")
for arg in sys.argv[2:]:
    k, v = arg.split("=", 1)
    if k not in a:
        sys.exit(f"make_random_llama.py: unknown argument {k} (one of {', '.join(a)})")
    a[k] = v if k == "dtype" else int(v)
torch.manual_seed(0)
config = LlamaConfig(vocab_size=a["vocab"], hidden_size=a["hidden"],
                     intermediate_size=a["intermediate"], num_hidden_layers=a["layers"],
                     num_attention_heads=a["heads"], num_key_value_heads=a["kv_heads"],
                     max_position_embeddings=2048, tie_word_embeddings=False)
with torch.device("meta"):
    model = LlamaForCausalLM(config)
# Random values without transformers' (slow) init: every tensor N(0, 0.02), norms 1.
model = model.to_empty(device="cpu")
with torch.no_grad():
    for name, p in model.named_parameters():
        p.copy_(torch.ones_like(p) if "norm" in name else torch.randn_like(p) * 0.02)
model.to(getattr(torch, a["dtype"])).save_pretrained(out, safe_serialization=True,
                                                     max_shard_size="2GB")
n = sum(p.numel() for p in model.parameters())
print(f"{out}: {n / 1e6:.1f}M parameters ({a['dtype']})")
