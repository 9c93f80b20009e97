"""Tiny random Llama-family models saved by Hugging Face transformers, with reference outputs.

usage: make_llamas.py OUT_DIR

Writes OUT_DIR/NAME/ (save_pretrained, safetensors) and OUT_DIR/NAME.ref.safetensors holding the
token ids, transformers' float32 logits, the loss of one step and every parameter's gradient
("grad." + name) for:
  llama       GQA (4 heads, 2 key/value heads), llama3 rope scaling, untied lm_head, sharded
  qwen2       q/k/v biases, tied embeddings, one model.safetensors
  qwen2_bf16  the qwen2 model saved in bfloat16 (the reference: transformers loading it as float32)
and, for llama and qwen2, OUT_DIR/NAME.gen.safetensors: transformers' greedy generate
(do_sample=False, 32 new tokens, float32, no eos) after one prompt ("single.prompt" [1, 7] →
"single.new" [1, 32]) and after a batch of 3 prompts of lengths 5, 9, 3, left-padded with 0 and
masked ("batch.prompt" [3, 9], "batch.lengths" [3] → "batch.new" [3, 32]).
"""
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import greedy_reference  # beside this script

out = sys.argv[1]
common = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
              attn_implementation="eager")


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
llama = LlamaForCausalLM(LlamaConfig(
    **common, max_position_embeddings=64, rope_theta=500000.0, tie_word_embeddings=False,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}))
randomize(llama, 2)
llama.save_pretrained(os.path.join(out, "llama"), safe_serialization=True, max_shard_size="40KB")
reference(llama, "llama", 3)
greedy_reference.write(llama, os.path.join(out, "llama.gen.safetensors"), 7, new=32, low=3)

torch.manual_seed(4)
qwen = Qwen2ForCausalLM(Qwen2Config(**common, max_position_embeddings=64, rope_theta=1000.0,
                                    tie_word_embeddings=True))
randomize(qwen, 5)
qwen.save_pretrained(os.path.join(out, "qwen2"), safe_serialization=True)
reference(qwen, "qwen2", 6)
greedy_reference.write(qwen, os.path.join(out, "qwen2.gen.safetensors"), 8, new=32, low=3)

qwen.to(torch.bfloat16).save_pretrained(os.path.join(out, "qwen2_bf16"), safe_serialization=True)
# transformers' own float32 load of the bfloat16 file (a model converted back and forth in memory
# would hold rounded rotary frequencies too).
reference(Qwen2ForCausalLM.from_pretrained(os.path.join(out, "qwen2_bf16"), dtype=torch.float32,
                                           attn_implementation="eager"), "qwen2_bf16", 6)
