"""transformers' greedy generations for the parity tests (imported by make_llamas.py and
make_gpt2.py).

write(model, path, seed, new, low): PATH (a .gen.safetensors file) holds transformers' greedy
generate (do_sample=False, exactly `new` new tokens, float32, no eos) after one prompt
("single.prompt" [1, 7] -> "single.new" [1, new]) and after a batch of 3 prompts of lengths 5, 9,
3, left-padded with 0 and masked ("batch.prompt" [3, 9], "batch.lengths" [3] -> "batch.new"
[3, new]); prompt ids drawn from [low, vocab_size) with a generator seeded `seed`.
"""
import torch
from safetensors.torch import save_file


def write(model, path, seed, new, low):
    g = torch.Generator().manual_seed(seed)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0

    def run(ids, mask):
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                 max_new_tokens=new, min_new_tokens=new, eos_token_id=None,
                                 pad_token_id=0)
        assert out.shape[1] == ids.shape[1] + new, out.shape
        return out[:, ids.shape[1]:].contiguous()

    single = torch.randint(low, model.config.vocab_size, (1, 7), generator=g)
    lengths = torch.tensor([5, 9, 3])
    batch = torch.zeros(3, 9, dtype=torch.long)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        batch[i, 9 - n:] = torch.randint(low, model.config.vocab_size, (n,), generator=g)
        mask[i, 9 - n:] = 1
    save_file({"single.prompt": single, "single.new": run(single, torch.ones_like(single)),
               "batch.prompt": batch, "batch.lengths": lengths, "batch.new": run(batch, mask)},
              path)
