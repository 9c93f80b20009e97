"""A tiny Hugging Face Llama with a peft LoRA adapter, and peft's outputs, for lora_test.cc.

usage: make_lora.py OUT_DIR            writes the reference (below)
       make_lora.py OUT_DIR ADAPTER    loads ADAPTER (our save_lora_adapter's folder) onto
                                       OUT_DIR/base with peft and writes its logits on the
                                       reference ids to ADAPTER.logits.safetensors ("logits")

Writes OUT_DIR/base/ (transformers' save_pretrained: a Llama with 2 layers, grouped-query
attention, random weights), OUT_DIR/adapter/ (peft's save_pretrained of
get_peft_model(LoraConfig(r=4, lora_alpha=8, target_modules=[q_proj, v_proj, down_proj],
lora_dropout=0)) with lora_B random (seeded), so gradients reach lora_A) and
OUT_DIR/ref.safetensors: "ids" [2, 12], "logits" (eval, with the adapter), "loss" (next-token
cross-entropy of ids[:, :-1] against ids[:, 1:]), "grad." + each adapter tensor's name in the
adapter file (its gradient of that loss), and "merged_logits" (after peft's merge_and_unload).
"""
import os
import sys

import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

out = sys.argv[1]
config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                     attn_implementation="eager")
ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(3))

if len(sys.argv) == 3:
    base = LlamaForCausalLM.from_pretrained(os.path.join(out, "base"), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, sys.argv[2]).eval()
    with torch.no_grad():
        logits = model(ids).logits.contiguous()
    save_file({"logits": logits}, sys.argv[2].rstrip("/") + ".logits.safetensors")
    sys.exit(0)

torch.manual_seed(0)
base = LlamaForCausalLM(config)
g = torch.Generator().manual_seed(1)
with torch.no_grad():  # Hugging Face's init leaves norms at 1: perturb everything
    for p in base.parameters():
        p.add_(torch.randn(p.shape, generator=g) * 0.05)
base.save_pretrained(os.path.join(out, "base"))

model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                        target_modules=["q_proj", "v_proj", "down_proj"]))
g = torch.Generator().manual_seed(2)
with torch.no_grad():
    for n, p in model.named_parameters():
        if "lora_B" in n:
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
model.save_pretrained(os.path.join(out, "adapter"))

model.eval()  # dropout 0: train and eval agree; eval for the logits as ours
with torch.no_grad():
    logits = model(ids).logits.contiguous()
model.zero_grad()
loss = F.cross_entropy(model(ids[:, :-1]).logits.flatten(0, 1), ids[:, 1:].flatten())
loss.backward()
tensors = {"ids": ids, "logits": logits, "loss": loss.detach().reshape(1)}
for n, p in model.named_parameters():
    if p.requires_grad:
        tensors["grad." + n.replace(".default", "")] = p.grad.contiguous()
merged = model.merge_and_unload()
with torch.no_grad():
    tensors["merged_logits"] = merged(ids).logits.contiguous()
save_file(tensors, os.path.join(out, "ref.safetensors"))
