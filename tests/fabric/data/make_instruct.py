"""Instruction data and its reference ids and loss masks for instruct_test.cc.

usage: make_instruct.py OUT_DIR TEXT_FILE

Writes OUT_DIR/tokenizer.json (a byte-level BPE that `tokenizers` trains on TEXT_FILE, with the
special tokens <|end|> (eos), <|im_start|>, <|im_end|>) and tokenizer_config.json, and
  alpaca.jsonl + alpaca.ref.json: each example's ids as `tokenizers` encodes the whole rendered
      text at once (the Stanford Alpaca prompt, then the response, then eos) and the mask LitGPT
      uses (the first len(encode(prompt)) ids are the prompt's);
  chat.jsonl + chat.ref.json: each conversation's ids and assistant mask as transformers'
      apply_chat_template(return_assistant_tokens_mask=True) gives them under a ChatML template
      whose assistant turns are {% generation %} blocks, then eos;
  text.jsonl + text.ref.json: under the template "Q: {prompt}\nA: {response}", the ids of the
      whole rendered text and the tokens holding any response character, then eos;
  chat/: a folder whose tokenizer_config.json has a chat template in Llama 3's style, with
      chat.jsonl + chat.ref.json: the ids and assistant mask of apply_chat_template under the same
      template with {% generation %} blocks (chat_generation.jinja), and prompt.ref.json.
"""
import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

out, text_file = sys.argv[1], sys.argv[2]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
special = ["<|end|>", "<|im_start|>", "<|im_end|>"]
tok.train([text_file], trainers.BpeTrainer(vocab_size=400, special_tokens=special,
                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(os.path.join(out, "tokenizer.json"))
with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<|end|>"}, f)
eos = tok.token_to_id("<|end|>")

alpaca = [
    {"prompt": "Name the strategy that shards parameters.", "response": "fsdp shards them."},
    {"prompt": "Translate to French:", "input": "the model trains", "response": "le modèle apprend"},
    {"prompt": "Count: one, two,", "response": " three, four\n\nfive."},
]
intro = ("Below is an instruction that describes a task. Write a response that appropriately "
         "completes the request.\n\n")
intro_input = ("Below is an instruction that describes a task, paired with an input that provides "
               "further context. Write a response that appropriately completes the request.\n\n")
ref = []
for e in alpaca:
    if e.get("input"):
        p = intro_input + "### Instruction:\n" + e["prompt"] + "\n\n### Input:\n" + e["input"] + \
            "\n\n### Response:\n"
    else:
        p = intro + "### Instruction:\n" + e["prompt"] + "\n\n### Response:\n"
    ids = tok.encode(p + e["response"]).ids + [eos]
    n = len(tok.encode(p).ids)
    ref.append({"ids": ids, "mask": [False] * n + [True] * (len(ids) - n)})
with open(os.path.join(out, "alpaca.jsonl"), "w") as f:
    for e in alpaca:
        f.write(json.dumps(e, ensure_ascii=False) + "\n")
json.dump(ref, open(os.path.join(out, "alpaca.ref.json"), "w"))

chats = [
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "What does ddp all-reduce?"},
     {"role": "assistant", "content": "The gradients."}],
    [{"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Say 3 words."},
     {"role": "assistant", "content": "One two three"}],
]
template = ("{% for m in messages %}{% if m['role'] == 'assistant' %}<|im_start|>assistant\n"
            "{% generation %}{{ m['content'] }}<|im_end|>\n{% endgeneration %}"
            "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
            "{% endfor %}")
fast = PreTrainedTokenizerFast(tokenizer_object=tok)
fast.chat_template = template
ref = []
for c in chats:
    r = fast.apply_chat_template(c, tokenize=True, return_dict=True,
                                 return_assistant_tokens_mask=True)
    ids = list(r["input_ids"]) + [eos]
    mask = [bool(m) for m in r["assistant_masks"]] + [True]
    ref.append({"ids": ids, "mask": mask})
with open(os.path.join(out, "chat.jsonl"), "w") as f:
    for c in chats:
        f.write(json.dumps({"messages": c}) + "\n")
json.dump(ref, open(os.path.join(out, "chat.ref.json"), "w"))

# A text template whose prompt part ends in a space: the ids `tokenizers` gives the whole rendered
# text, and the tokens holding any response character (as transformers' assistant mask), then eos.
texts = [
    {"prompt": "Which strategy shards?", "response": "It is fsdp."},
    {"prompt": "What does ddp average?", "response": "the gradients."},
    {"prompt": "Which one shards?", "response": "fsdp shards them."},
    {"prompt": "Count to three", "response": "\n1 2 3"},
    {"prompt": "Café?", "response": "Oui, café."},
]
ref = []
joined = 0  # examples whose whole text encodes otherwise than its parts
for e in texts:
    prompt = "Q: " + e["prompt"] + "\nA: "
    enc = tok.encode(prompt + e["response"])
    # A token is the response's when its character span overlaps the response's (char_to_token
    # would name only the first of the tokens a character's bytes are split into: "é" in two).
    begin, end = len(prompt), len(prompt) + len(e["response"])
    mask = [a < end and b > begin for a, b in enc.offsets]
    ref.append({"ids": enc.ids + [eos], "mask": mask + [True]})
    joined += enc.ids != tok.encode(prompt).ids + tok.encode(e["response"]).ids
assert joined >= 2, "the text examples must include responses whose first word joins the space"
with open(os.path.join(out, "text.jsonl"), "w") as f:
    for e in texts:
        f.write(json.dumps(e, ensure_ascii=False) + "\n")
json.dump(ref, open(os.path.join(out, "text.ref.json"), "w"))
# chat/: the same tokenizer with Llama 3's markers, and a chat template in Llama 3's style whose
# assistant turns (content and <|eot_id|>, nothing after) are {% generation %} blocks: the ids and
# assistant mask transformers' apply_chat_template gives, which data.template chat_template must
# give without the blocks (chat_plain.jinja, the same template without them, read as a FILE).
chat_dir = os.path.join(out, "chat")
os.makedirs(chat_dir, exist_ok=True)
markers = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
tok.add_special_tokens(markers)
tok.save(os.path.join(chat_dir, "tokenizer.json"))
chat_template = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system = 'You are helpful.' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\n\n' + system + '<|eot_id|>' }}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}\n"
    "    {%- if message['role'] == 'assistant' %}{% generation %}"
    "{{- message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}\n"
    "    {%- else %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{%- endif %}\n")
plain = chat_template.replace("{% generation %}", "").replace("{% endgeneration %}", "")
with open(os.path.join(chat_dir, "tokenizer_config.json"), "w") as f:
    json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
               "chat_template": plain}, f)
with open(os.path.join(chat_dir, "chat_generation.jinja"), "w") as f:
    f.write(chat_template)
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                               eos_token="<|eot_id|>")
fast.chat_template = chat_template
llama_chats = chats + [
    [{"role": "user", "content": "  Which strategy shards?  "},
     {"role": "assistant", "content": "It is fsdp.\n"},
     {"role": "user", "content": "Café?"},
     {"role": "assistant", "content": "Oui, café."}],
]
ref = []
for c in llama_chats:
    r = fast.apply_chat_template(c, tokenize=True, return_dict=True,
                                 return_assistant_tokens_mask=True)
    ids, mask = list(r["input_ids"]), [bool(m) for m in r["assistant_masks"]]
    assert ids[0] == tok.token_to_id("<|begin_of_text|>") and ids[-1] == tok.token_to_id("<|eot_id|>")
    ref.append({"ids": ids, "mask": mask})
with open(os.path.join(chat_dir, "chat.jsonl"), "w") as f:
    for c in llama_chats:
        f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")
json.dump(ref, open(os.path.join(chat_dir, "chat.ref.json"), "w"))
# The generation prompt for one user message, as generate and finetune.sample_prompt render it.
json.dump({"text": fast.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                            add_generation_prompt=True)},
          open(os.path.join(chat_dir, "prompt.ref.json"), "w"))
print("ok", out)
