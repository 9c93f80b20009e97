"""transformers loading folders that fabric::hf::save_llama / save_gpt2 (or ckpt hf) wrote.

usage: check_export.py IDS_FILE FOLDER...

For each FOLDER: AutoModelForCausalLM.from_pretrained(FOLDER, dtype=float32) must load with no
missing, unexpected or mismatched tensor; its float32 logits on the int64 "ids" of IDS_FILE (a
.safetensors file) are written to FOLDER.logits.safetensors ("logits"), and the loaded class and
config's dtype are printed.
"""
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

ids = load_file(sys.argv[1])["ids"]
for folder in sys.argv[2:]:
    model, info = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(key), "%s: %s %s" % (folder, key, info[key])
    model.eval()
    with torch.no_grad():
        logits = model(ids).logits
    save_file({"logits": logits.contiguous()}, folder.rstrip("/") + ".logits.safetensors")
    print(folder, type(model).__name__, model.config.dtype)
