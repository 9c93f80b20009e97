"""Tiny random GPT-2 models saved by Hugging Face transformers, with reference outputs.

usage: make_gpt2.py OUT_DIR

Writes OUT_DIR/NAME/ and OUT_DIR/NAME.ref.safetensors holding the token ids, transformers' float32
logits, the loss of one step and every parameter's gradient ("grad." + name, transformers' names),
and OUT_DIR/NAME.gen.safetensors holding greedy generate() ids (20 new ids after one prompt of 7
and after a left-padded batch of prompts of 5, 9 and 3 ids with its attention_mask; no eos) for:
  gpt2       gelu_new, tied embeddings, as transformers 5's save_pretrained writes it
             (transformer.h.0.attn.c_attn.weight, ...)
  gpt2_bare  another model with the exact gelu, in the original openai-community/gpt2 layout:
             bare names (h.0.attn.c_attn.weight), the attn.bias causal-mask buffers, no lm_head
"""
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

import greedy_reference  # beside this script

out = sys.argv[1]
common = dict(vocab_size=96, n_positions=32, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
              embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5, bos_token_id=95,
              eos_token_id=95, attn_implementation="eager")


def randomize(model, seed):
    # Hugging Face initializes biases to 0 and norms to 1: perturb everything so each matters.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def reference(model, name, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=g)
    model.eval()
    with torch.no_grad():
        logits = model(ids).logits
    model.zero_grad()
    loss = F.cross_entropy(model(ids[:, :-1]).logits.flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    tensors = {"ids": ids, "logits": logits.contiguous(), "loss": loss.detach().reshape(1)}
    for n, p in model.named_parameters():
        tensors["grad." + n] = p.grad.contiguous()
    save_file(tensors, os.path.join(out, name + ".ref.safetensors"))


torch.manual_seed(1)
gpt2 = GPT2LMHeadModel(GPT2Config(**common, activation_function="gelu_new"))
randomize(gpt2, 2)
gpt2.save_pretrained(os.path.join(out, "gpt2"), safe_serialization=True)
reference(gpt2, "gpt2", 3)
greedy_reference.write(gpt2, os.path.join(out, "gpt2.gen.safetensors"), 7, new=20, low=0)

torch.manual_seed(4)
bare = GPT2LMHeadModel(GPT2Config(**common, activation_function="gelu"))
randomize(bare, 5)
folder = os.path.join(out, "gpt2_bare")
bare.save_pretrained(folder, safe_serialization=True)
os.remove(os.path.join(folder, "model.safetensors"))
n = common["n_positions"]
tensors = {k[len("transformer."):]: v.contiguous() for k, v in bare.state_dict().items()
           if k.startswith("transformer.")}
for i in range(common["n_layer"]):
    tensors["h.%d.attn.bias" % i] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
reference(bare, "gpt2_bare", 6)
greedy_reference.write(bare, os.path.join(out, "gpt2_bare.gen.safetensors"), 8, new=20, low=0)
