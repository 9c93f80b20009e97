"""Trains byte-level BPE tokenizers with Hugging Face `tokenizers` (GPT-2's, Llama 3's and Qwen2's
pre-tokenizer, normalizer and ignore_merges; added and special tokens; merges saved as pairs and as
"a b" strings) on Python standard library sources, has `transformers` write GPT-2's and Qwen2's
tokenizer.json for the GPT-2-style vocabulary (as their converters do for the real models),
encodes other text with them and with //tools:tokenize, and checks that the ids are the same and
that --decode gives the text back.
Writes the files hf_tokenizer_test's error cases read. Prints "ok N cases" or the first mismatch.

    python3 hf_tokenizer_parity.py TOKENIZE_BINARY OUT_DIR
"""
import json
import os
import random
import subprocess
import sys
import sysconfig
import unicodedata

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")

TRAIN_FILES = ["json/decoder.py", "json/encoder.py", "textwrap.py", "string.py", "calendar.py",
               "email/utils.py"]
UNICODE = ("Café naïve résumé über straße Ελληνικά γλώσσα 日本語のテキスト。 Emoji 🙂👍 "
           "Arabic مَرْحَبًا ١٢٣ Devanagari नमस्ते Hangul 한국어 numerals Ⅻ ² ½ ① ")
CASES = [
    "Hello world", "Hello   world\n\n\n    indented\tand\t\ttabs  \r\n  trailing   ",
    "I'm you're we've they'll he'd it's don't WON'T 'S ''s I'M 'Re 'LL 'x",
    "numbers 1234567890 and 3.14159, x2y3 007 12 345",
    "punctuation!!! ?? -- ... (a) [b] {c} <d> ((nested)) \"quoted\" 'single'",
    "def f(x):\n    return x ** 2  # comment\n\n\nclass A:\n\tpass\n",
    "Cafe\u0301 nai\u0308ve e\u0301 A\u030a \u1100\u1161\u11a8 decomposed marks",
    "mixed\u00a0nbsp and\u3000ideographic space\u2003em",
    "<|endoftext|>", "a<|endoftext|>b <|endoftext|> c",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "say <tool> now<tool>glued [NAME] and [NAME]x and x[NAME]",
    "", " ", "\n", "  \n\n  x", "end with spaces   ", UNICODE,
    # Letters and digits Unicode 15 and 16 added (Python 3.11's unicodedata, Unicode 14, does not
    # know them; tokenizers does): CJK Ext H, Cyrillic TJE, Nag Mundari, Kawi digits; and letters
    # of Unicode 17 (Sidetic, Tolong Siki), which tokenizers does not class as letters yet.
    "abc\U00031350def \U00031351\U00031352 x\u1c89y \U0001E4D0\U0001E4D1z "
    "\U00011F50\U00011F51 7\U0001E4F0 a\U00010940b \U00011DB0c",
]
# Added tokens: special ones, and plain ones with lstrip / rstrip / single_word.
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PLAIN = [AddedToken("<tool>", lstrip=True, rstrip=True), AddedToken("[NAME]", single_word=True)]


def train(family, text_files, out):
    tok = Tokenizer(models.BPE(ignore_merges=family == "llama3"))
    if family == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3 if family == "llama3" else QWEN2), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if family == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(text_files, trainer)
    tok.add_tokens(PLAIN)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "tokenizer.json")
    tok.save(path)
    return path


def with_string_merges(path, out):
    """The same tokenizer with merges written as "a b" strings (the older format)."""
    j = json.load(open(path, encoding="utf-8"))
    merges = j["model"]["merges"]
    assert merges and isinstance(merges[0], list), "tokenizers saved merges as pairs"
    j["model"]["merges"] = [" ".join(m) for m in merges]
    os.makedirs(out, exist_ok=True)
    new = os.path.join(out, "tokenizer.json")
    json.dump(j, open(new, "w", encoding="utf-8"), ensure_ascii=False)
    return new


def with_duplicate_merges(path, out):
    """The same tokenizer with three merges listed a second time, at the end: `tokenizers` keeps
    each pair's last rank (a map built in order), so these three now merge last."""
    j = json.load(open(path, encoding="utf-8"))
    merges = j["model"]["merges"]
    j["model"]["merges"] = merges + [merges[0], merges[5], merges[30]]
    os.makedirs(out, exist_ok=True)
    json.dump(j, open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8"))
    return os.path.join(out, "tokenizer.json")


def run(binary, path, data, decode=False):
    args = [binary, "--tokenizer=" + path] + (["--decode"] if decode else [])
    r = subprocess.run(args, input=data, capture_output=True)
    if r.returncode != 0:
        sys.exit(f"FAIL {' '.join(args)}: exit {r.returncode}: {r.stderr.decode()}")
    return r.stdout


def random_cases(rng, n):
    pool = (list("abcXYZ  \t\n\r'.,!?-_0123456789") + ["'s", "'LL", "é", "e\u0301", "日本",
            "١٢", "½", "🙂", "\u00a0", "\u3000", "<|endoftext|>", "<tool>", "[NAME]", "  \n ",
            "ſ", "Ǆ", "\u0308"])
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def nfc_probe():
    """Every combining mark of Python's tables after a mark of a higher class (where NFC moves a
    mark it knows ahead), and every code point with a canonical decomposition: tokenizers' NFC is
    of an older Unicode (U+0898 is no mark there), and Qwen2's ids must be its ids."""
    parts = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c, d = chr(cp), unicodedata.decomposition(chr(cp))
        k = unicodedata.combining(c)
        if k:
            parts.append("x\u0345" + c if k < 240 else "x" + c + "\u0334")
        elif d and not d.startswith("<"):
            parts.append(c)
    return " ".join(parts)


def main():
    binary, out = sys.argv[1], sys.argv[2]
    stdlib = sysconfig.get_paths()["stdlib"]
    train_files = [os.path.join(stdlib, f) for f in TRAIN_FILES]
    # Words with letters and digits of Unicode 15 and 16, often enough that merges join them to
    # their ASCII neighbours, which only a pre-tokenizer that classes them as tokenizers does (one
    # piece "abc\U00031350def") can apply.
    newer = os.path.join(out, "newer_unicode.txt")
    os.makedirs(out, exist_ok=True)
    with open(newer, "w", encoding="utf-8") as f:
        f.write(("abc\U00031350def x\u1c89y \U0001E4D0\U0001E4D1z 7\U0001E4F0 \U00011F50\U00011F51 "
                 "the\U00031351re ") * 2000)
    train_files.append(newer)
    # Text the tokenizers were not trained on.
    other = open(os.path.join(stdlib, "argparse.py"), encoding="utf-8").read()[:6000]
    cases = CASES + [other, other[:3000] + UNICODE + "<|endoftext|>" + other[3000:]]
    # Long pieces without whitespace (one word of 20,000 letters; runs of one letter): the merges
    # come from a heap there, whose order must be the loop's.
    letters = random.Random(1)
    cases += ["".join(letters.choice("etaoinshrdlu") for _ in range(20000)), "a" * 5000,
              "ab" * 3000 + "ba" * 3000]
    cases += random_cases(random.Random(int(os.environ.get("SEED", "0"))),
                          int(os.environ.get("RANDOM_CASES", "40")))
    cases.append(nfc_probe())
    checked = 0
    paths = []
    for family in ["gpt2", "llama3", "qwen2"]:
        path = train(family, train_files, os.path.join(out, family))
        paths += [(family, path), (family + " (merges as strings)",
                                   with_string_merges(path, os.path.join(out, family + "_strings")))]
        if family == "gpt2":
            paths.append((family + " (duplicate merges)",
                          with_duplicate_merges(path, os.path.join(out, family + "_duplicates"))))
    # The same vocabulary and merges as transformers' GPT-2 and Qwen2 tokenizers write them.
    from transformers import GPT2TokenizerFast, Qwen2TokenizerFast
    trained = json.load(open(paths[0][1], encoding="utf-8"))["model"]
    for name, cls in [("transformers-gpt2", GPT2TokenizerFast),
                      ("transformers-qwen2", Qwen2TokenizerFast)]:
        cls(vocab=trained["vocab"], merges=[tuple(m) for m in trained["merges"]]).save_pretrained(
            os.path.join(out, name))
        paths.append((name, os.path.join(out, name, "tokenizer.json")))
    for name, path in paths:
        tok = Tokenizer.from_file(path)
        for text in cases:
            want = tok.encode(text, add_special_tokens=False).ids
            got = [int(x) for x in run(binary, path, text.encode()).split()]
            if got != want:
                sys.exit(f"FAIL {name}: ids of {text[:200]!r}:\n  tokenizers {want}\n  ours       {got}")
            back = run(binary, path, " ".join(map(str, got)).encode(), decode=True).decode()
            # The text itself (NFC for Qwen2's), but for the spaces that <tool> strips.
            expect = normalizers.NFC().normalize_str(text) if "qwen2" in name else text
            hf = tok.decode(got, skip_special_tokens=False)
            if back != hf or ("<tool>" not in text and back != expect):
                sys.exit(f"FAIL {name}: decode of {text[:200]!r} gave {back[:200]!r}, "
                         f"tokenizers {hf[:200]!r}")
            checked += 1
    # Ids no text encodes to: a lone lead byte (one U+FFFD) and an id past the vocabulary
    # (skipped, as a model's padded vocabulary may hold).
    tok = Tokenizer.from_file(paths[0][1])
    ids = [tok.token_to_id("H"), tok.token_to_id("\u00e2"), tok.get_vocab_size() + 5,
           tok.token_to_id("i")]
    back = run(binary, paths[0][1], " ".join(map(str, ids)).encode(), decode=True).decode()
    if back != tok.decode(ids, skip_special_tokens=False):
        sys.exit(f"FAIL decode of {ids}: {back!r}, tokenizers {tok.decode(ids)!r}")
    # bos/eos from tokenizer_config.json and generation_config.json.
    llama = Tokenizer.from_file(paths[2][1])
    json.dump({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}},
              open(os.path.join(out, "llama3", "tokenizer_config.json"), "w"))
    json.dump({"bos_token_id": 5, "eos_token_id": [0, 2]},
              open(os.path.join(out, "qwen2", "generation_config.json"), "w"))
    json.dump({"bos": llama.token_to_id("<|im_start|>"), "eos": llama.token_to_id("<|im_end|>")},
              open(os.path.join(out, "llama3_bos_eos.json"), "w"))
    # Tokenizers of other kinds, for the error cases.
    for kind, model in [("unigram", models.Unigram([("<unk>", 0.0), ("a", -1.0)], 0)),
                        ("wordpiece", models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))]:
        os.makedirs(os.path.join(out, kind), exist_ok=True)
        Tokenizer(model).save(os.path.join(out, kind, "tokenizer.json"))
    print(f"ok {checked} cases")


if __name__ == "__main__":
    main()
