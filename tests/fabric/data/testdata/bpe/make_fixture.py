"""Writes this folder's BPE fixture with Hugging Face `tokenizers` (pip install tokenizers):
a byte-level BPE of 700 symbols (GPT-2's kind: the same byte stand-ins, pre-tokenizer pattern
and vocab.json/merges.txt format) trained on a dozen Python standard library files plus
accented, Greek, Japanese and emoji text, and expected.json: test strings with the ids
`tokenizers` gives them. bpe_test checks that fabric::BpeTokenizer gives the same ids.
--cases-only keeps vocab.json/merges.txt and rewrites expected.json (how the Unicode cases,
whose letters and numbers are not ASCII, combining marks among them, were added).

    PYTHONPATH=<tokenizers> python3 tests/fabric/data/testdata/bpe/make_fixture.py [--cases-only]
"""
import glob
import json
import os
import sys
import sysconfig
import tempfile

from tokenizers import ByteLevelBPETokenizer

OUT = os.path.dirname(os.path.abspath(__file__))
CASES = [
    "Hello world", "Hello  world", "Hello   world", "  leading spaces", "trailing spaces   ",
    "tabs\tand\nnewlines\n\n  indented", "\n\nfoo", "line\r\nbreak",
    "I'm you're we've they'll he'd it's don't WON'T 'S ''s",
    "numbers 12345 and 3.14159, x2y3", "punctuation!!! ?? -- ... (a) [b] {c} <d>",
    "def f(x):\n    return x ** 2  # comment\n",
    "Café naïve résumé über straße", "Ελληνικά γλώσσα", "日本語のテキスト。", "Emoji 🙂👍 done!",
    "mixed\u00a0nbsp and\u3000ideographic space", "", " ", "a", "\t\t", "ends with newline\n",
    "import json\nfrom email import message_from_string\n",
    # Letters, marks and numbers outside ASCII: \p{L} and \p{N} by Unicode's categories.
    "Khmer ភាសាខ្មែរ ៈ៉ and Thai ภาษาไทย", "Devanagari नमस्ते दुनिया", "Hebrew שָׁלוֹם",
    "Arabic مَرْحَبًا ١٢٣", "numerals Ⅻ ² ½ ① 〇 ٣ ፲", "marks e\u0301 a\u0308\u0323 x\u20dd",
    "Hangul 한국어 Tamil தமிழ் Georgian ქართული", "math 𝐀𝐁 𝟙𝟚 and ℕ ℝ",
]


def write_expected(tok):
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump([{"text": c, "ids": tok.encode(c).ids} for c in CASES], f, ensure_ascii=False,
                  indent=0)


def main():
    if "--cases-only" in sys.argv[1:]:
        write_expected(ByteLevelBPETokenizer(os.path.join(OUT, "vocab.json"),
                                             os.path.join(OUT, "merges.txt")))
        return
    lib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(lib + "/json/*.py") + glob.glob(lib + "/email/*.py"))[:12]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as extra:
        extra.write("Café naïve résumé über straße. Ελληνικά γλώσσα. 日本語のテキスト。 "
                    "Emoji 🙂👍 done!\n" * 50 + "I'm you're we've they'll he'd it's don't WON'T\n" * 50)
    tok = ByteLevelBPETokenizer(add_prefix_space=False)
    tok.train(files + [extra.name], vocab_size=700, min_frequency=2,
              special_tokens=["<|endoftext|>"])
    os.unlink(extra.name)
    tok.save_model(OUT)
    write_expected(tok)


if __name__ == "__main__":
    main()
