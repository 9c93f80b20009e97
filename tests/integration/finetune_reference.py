"""The Python side of finetune_example_test: what transformers, peft and tokenizers make of
examples:finetune's exports.

  finetune_reference.py loss --model=DIR --adapter=[DIR] [--model=DIR --adapter=[DIR] ...]
                             --data=FILE.jsonl --template=TEXT --block_size=N
      The validation loss as examples:finetune defines it, computed by transformers (the model
      folder, float32: a Llama-family or GPT-2 model) with peft's adapter loaded onto it when
      --adapter is given (PeftModel.from_pretrained; a warning of peft's, e.g. that it had to set
      fan_in_fan_out for GPT-2's Conv1D layers, is an error): each example's rendered text (the
      template before {response}, then the response) encoded whole by `tokenizers`, the tokens
      overlapping the response's characters its targets, the eos id after the response, ids cut to block_size + 1, targets -100 on the prompt, examples
      without a response target dropped; transformers' loss with those labels
      (model(input_ids, labels=...).loss) times each example's response targets, summed over the
      file, over their count. Prints "LOSS <value>" for each --model in turn (each paired
      with the --adapter at its place; an empty one: none), so one Python start (transformers'
      and peft's imports take 10-15 s on 2 vCPUs) serves several folders.
  finetune_reference.py same A B
      Exit 0 when safetensors files A and B hold the same names with bitwise equal tensors.
"""
import argparse
import json
import sys

import torch


def loss(a):
    if len(a.model) != len(a.adapter):
        sys.exit(f"{len(a.model)} --model but {len(a.adapter)} --adapter (give --adapter= for none)")
    for folder, adapter in zip(a.model, a.adapter):
        one_loss(a, folder, adapter)


def one_loss(a, folder, adapter):
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(f"{folder}/tokenizer.json")
    eos = json.load(open(f"{folder}/config.json"))["eos_token_id"]
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    if adapter:
        import warnings
        from peft import PeftModel
        with warnings.catch_warnings():  # peft warns when it has to fix fan_in_fan_out (Conv1D)
            warnings.simplefilter("error", UserWarning)
            model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    head, tail = a.template.split("{response}")
    total, count = 0.0, 0
    with torch.no_grad():
        for line in open(a.data):
            if not line.strip():
                continue
            e = json.loads(line)
            # The rendered text encoded whole; a token is the response's when its characters
            # overlap the response's (transformers' assistant mask).
            prompt = head.replace("{prompt}", e["prompt"])
            enc = tok.encode(prompt + e["response"], add_special_tokens=False)
            begin, end = len(prompt), len(prompt) + len(e["response"])
            ids = enc.ids + [eos]
            labels = [t if a < end and b > begin else -100
                      for t, (a, b) in zip(enc.ids, enc.offsets)] + [eos]
            ids, labels = ids[: a.block_size + 1], labels[: a.block_size + 1]
            n = sum(1 for t in labels[1:] if t != -100)
            if n == 0:
                continue
            # transformers' own loss with -100 labels (it shifts them: position i predicts
            # labels[i + 1]), a mean over the example's response targets.
            out = model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels]))
            total += out.loss.item() * n
            count += n
    print(f"LOSS {total / count:.9f}", flush=True)


def same(a):
    from safetensors.torch import load_file

    x, y = load_file(a.a), load_file(a.b)
    if sorted(x) != sorted(y):
        sys.exit(f"different names: {sorted(set(x) ^ set(y))[:4]}")
    for k in x:
        if not torch.equal(x[k], y[k]):
            sys.exit(f"{k}: differs by {(x[k].float() - y[k].float()).abs().max().item():.3e}")
    print(f"bitwise equal: {len(x)} tensors")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("loss")
    q.add_argument("--model", action="append", required=True)
    q.add_argument("--adapter", action="append", default=[])
    q.add_argument("--data", required=True)
    q.add_argument("--template", required=True)
    q.add_argument("--block_size", type=int, required=True)
    s = sub.add_parser("same")
    s.add_argument("a")
    s.add_argument("b")
    a = p.parse_args()
    torch.set_num_threads(1)
    {"loss": loss, "same": same}[a.cmd](a)


if __name__ == "__main__":
    main()
