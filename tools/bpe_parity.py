"""GPT-2 BPE parity: tools/prepare_text (fabric::BpeTokenizer) against tiktoken on the same files,
with GPT-2's own encoder.json and vocab.bpe. Prints the token counts, the seconds each side took
and IDENTICAL, or the first difference (exit 1). docs/data.md has the result and how to get the
files from PyPI.

    python3 tools/bpe_parity.py PREPARE_TEXT ENCODER_JSON VOCAB_BPE OUT_DIR FILE_LIST
FILE_LIST: a text file naming one UTF-8 input per line (encoded in that order, each followed by
<|endoftext|>, as prepare_text does).
"""
import os, subprocess, sys, time
import numpy as np
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
prep, enc_json, vocab_bpe, out, listing = sys.argv[1:6]
files = [l.strip() for l in open(listing) if l.strip()]
ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe, enc_json)
enc = tiktoken.Encoding("gpt2-local", pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
                        mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})
t0 = time.time()
ref = []
for f in files:
    ref.extend(enc.encode_ordinary(open(f, encoding="utf-8", newline="").read()))
    ref.append(50256)
t_ref = time.time() - t0
args = [prep, f"--output={out}", f"--vocab={enc_json}", f"--merges={vocab_bpe}", "--val_fraction=0.1"] + [f"--input={f}" for f in files]
t0 = time.time()
subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
t_ours = time.time() - t0
ours = np.concatenate([np.fromfile(os.path.join(out, n), dtype=np.uint16) for n in ("train.bin", "val.bin")])
ref = np.array(ref, dtype=np.int64)
nbytes = sum(os.path.getsize(f) for f in files)
print(f"files {len(files)}, {nbytes} bytes; tokens ours {len(ours)}, tiktoken {len(ref)}; seconds ours {t_ours:.1f}, tiktoken {t_ref:.1f}")
n = min(len(ours), len(ref))
diff = np.nonzero(ours[:n].astype(np.int64) != ref[:n])[0]
if len(ours) == len(ref) and len(diff) == 0:
    print("IDENTICAL")
else:
    i = int(diff[0]) if len(diff) else n
    print(f"FIRST DIFFERENCE at token {i}: ours {ours[max(0,i-3):i+5].tolist()} tiktoken {ref[max(0,i-3):i+5].tolist()}")
    print("ours text:", repr(enc.decode(ours[max(0,i-3):i+5].tolist())), "tiktoken text:", repr(enc.decode(ref[max(0,i-3):i+5].tolist())))
    sys.exit(1)
