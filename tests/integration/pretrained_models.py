"""Small Hugging Face model folders with tokenizers, and the checks against transformers, for the
examples that take model.pretrained (examples/gpt.cc, examples/generate.cc).

usage:
  pretrained_models.py make OUT_DIR TEXT_FILE
      OUT_DIR/llama (GQA, llama3 rope scaling, untied, bos added by the tokenizer config),
      OUT_DIR/qwen2 (q/k/v biases, tied, no bos) and OUT_DIR/gpt2: random weights (perturbed so
      that every tensor matters), each with a byte-level BPE tokenizer.json trained by `tokenizers`
      on TEXT_FILE (vocabulary 300 of the model's 320 ids) and an eos id in
      generation_config.json; OUT_DIR/llama_adapter and OUT_DIR/gpt2_adapter: peft LoRA
      adapters (r 4, alpha 8; q_proj, v_proj, down_proj / c_attn, c_fc) with lora_B random, so
      that they change the model.
  pretrained_models.py generate FOLDER GEN_JSON PROMPT [ADAPTER]
      examples:generate's JSON against transformers: prompt_ids are `tokenizers`' ids of PROMPT
      (after the bos id where the tokenizer config adds one), ids are generate(do_sample=False)'s
      new ids in float32 (stopping at the same eos), text is the tokenizer's decoding of ids;
      with ADAPTER, of peft's PeftModel on FOLDER merged (merge_and_unload).
  pretrained_models.py val_loss FOLDER DATA_ROOT WINDOW BATCHES SUMMARY_JSON
      the model in FOLDER (transformers, float32) on the first BATCHES x 1 windows of
      DATA_ROOT/val.bin as fabric::TokenDataset cuts them (consecutive, non-overlapping windows of
      WINDOW + 1 ids): the mean loss equals summary.json's val_loss to 1e-4 relative.
  pretrained_models.py checks FILE
      the checks FILE lists, one JSON list per line: ["generate", FOLDER, GEN_JSON, PROMPT] or
      ["val_loss", FOLDER, DATA_ROOT, WINDOW, BATCHES, SUMMARY_JSON] (transformers imported once).
Prints "ok ..." lines; exits 1 with the difference on a mismatch.
"""
import json
import os
import sys

import torch


def make(out, text_file):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                              Qwen2Config, Qwen2ForCausalLM)

    def tokenizer(folder, bos):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        special = ["<|end|>"] + (["<|begin|>"] if bos else [])
        trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=special,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train([text_file], trainer)
        tok.save(os.path.join(folder, "tokenizer.json"))
        cfg = {"eos_token": "<|end|>", "add_bos_token": bos}
        if bos:
            cfg["bos_token"] = "<|begin|>"
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f)
        return tok.token_to_id("<|end|>"), tok.token_to_id("<|begin|>") if bos else None

    def save(model, name, bos, seed):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        eos, bos_id = tokenizer(folder, bos)
        model.config.eos_token_id = eos
        model.config.bos_token_id = bos_id
        model.generation_config.eos_token_id = eos
        model.generation_config.bos_token_id = bos_id
        model.save_pretrained(folder, safe_serialization=True)

    common = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                  max_position_embeddings=128)
    torch.manual_seed(1)
    save(LlamaForCausalLM(LlamaConfig(
        **common, rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
        "llama", True, 2)
    torch.manual_seed(3)
    save(Qwen2ForCausalLM(Qwen2Config(**common, rope_theta=1000.0, tie_word_embeddings=True)),
         "qwen2", False, 4)
    torch.manual_seed(5)
    save(GPT2LMHeadModel(GPT2Config(vocab_size=320, n_positions=128, n_embd=64, n_layer=2,
                                    n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
         "gpt2", False, 6)
    adapter(out, "llama", ["q_proj", "v_proj", "down_proj"], 7)
    adapter(out, "gpt2", ["c_attn", "c_fc"], 8)
    print("ok made", out)


def adapter(out, name, targets, seed):
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(load(os.path.join(out, name)),
                           LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0,
                                      fan_in_fan_out=name == "gpt2"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    model.save_pretrained(os.path.join(out, name + "_adapter"))


def load(folder):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                 attn_implementation="eager")
    return model.eval()


def fail(message):
    print("MISMATCH:", message)
    sys.exit(1)


def generate(folder, gen_json, prompt, adapter=None):
    from tokenizers import Tokenizer
    got = json.load(open(gen_json))
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    cfg = json.load(open(os.path.join(folder, "tokenizer_config.json")))
    ids = ([tok.token_to_id(cfg["bos_token"])] if cfg.get("add_bos_token") else []) + \
        tok.encode(prompt, add_special_tokens=False).ids
    if got["prompt_ids"] != ids:
        fail(f"prompt_ids {got['prompt_ids']} != tokenizers' {ids}")
    model = load(folder)
    if adapter:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()
    n = len(got["ids"])
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                             dtype=torch.long), do_sample=False, max_new_tokens=max(n, 1),
                             pad_token_id=model.generation_config.eos_token_id)
    want = out[0, len(ids):].tolist()
    if got["ids"] != want:
        fail(f"ids {got['ids']} != transformers' {want}")
    text = tok.decode(want, skip_special_tokens=False)
    if got["text"] != text:
        fail(f"text {got['text']!r} != {text!r}")
    print(f"ok generate {folder}{' + ' + adapter if adapter else ''}: {n} ids equal "
          f"transformers'{' + peft' if adapter else ''}")


def val_loss(folder, root, window, batches, summary):
    import numpy as np
    meta = json.load(open(os.path.join(root, "meta.json")))
    dtype = np.uint32 if meta.get("vocab_size", 0) > 65535 else np.uint16
    data = torch.from_numpy(np.fromfile(os.path.join(root, "val.bin"), dtype=dtype).astype(np.int64))
    window = int(window)
    n = min(int(batches), (len(data) - 1) // window)
    model = load(folder)
    losses = []
    with torch.no_grad():
        for i in range(n):
            x = data[i * window: i * window + window + 1]
            logits = model(x[None, :-1]).logits[0]
            losses.append(torch.nn.functional.cross_entropy(logits, x[1:]).item())
    want = sum(losses) / len(losses)
    got = json.load(open(summary))["val_loss"]
    if abs(got - want) > 1e-4 * abs(want):
        fail(f"val_loss {got} != transformers' {want} over {n} windows")
    print(f"ok val_loss {folder}: {got} vs transformers' {want}")


def checks(file):
    for line in open(file):
        if line.strip():
            check = json.loads(line)
            {"generate": generate, "val_loss": val_loss}[check[0]](*[str(a) for a in check[1:]])


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    {"make": make, "generate": generate, "val_loss": val_loss, "checks": checks}[command](*args)
