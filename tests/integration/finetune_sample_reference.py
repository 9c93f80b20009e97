"""The Python side of finetune_example_test's sample check: transformers' greedy answer to
examples:finetune's finetune.sample_prompt.

  finetune_sample_reference.py --model=DIR [--adapter=DIR] --prompt=TEXT --template=TEXT
                               --max_new_tokens=N --summary=SUMMARY_JSON
      The model folder (transformers, float32) with peft's adapter loaded onto it when --adapter
      is given; the prompt part of the template (the text before {response}, {prompt} replaced)
      encoded by the folder's tokenizer.json as examples:finetune encodes it (no bos: the
      folder's tokenizer adds none); generate(do_sample=False, max_new_tokens=N), stopping at
      generation_config's eos id; the new ids decoded by `tokenizers` (special tokens kept) must
      equal SUMMARY_JSON's "sample". Prints "ok sample ..." or exits 1 with both texts.
"""
import argparse
import json
import sys

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--adapter", default="")
    p.add_argument("--prompt", required=True)
    p.add_argument("--template", required=True)
    p.add_argument("--max_new_tokens", type=int, required=True)
    p.add_argument("--summary", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(f"{a.model}/tokenizer.json")
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    if a.adapter:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, a.adapter)
    model.eval()
    head = a.template.split("{response}")[0].replace("{prompt}", a.prompt)
    ids = tok.encode(head, add_special_tokens=False).ids
    eos = model.generation_config.eos_token_id
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]),
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=a.max_new_tokens, pad_token_id=eos)
    want = tok.decode(out[0, len(ids):].tolist(), skip_special_tokens=False)
    got = json.load(open(a.summary))["sample"]
    if got != want:
        print(f"MISMATCH: sample {got!r} != transformers' {want!r}")
        sys.exit(1)
    print(f"ok sample: {len(out[0]) - len(ids)} ids equal transformers' greedy ones: {want!r}")


if __name__ == "__main__":
    main()
