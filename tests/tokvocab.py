"""Real vocabularies for the tokenizer tests: llama.cpp's ggml-vocab-*.gguf files (with their expected
ids, .inp/.out) from the llama-cpp-python 0.3.36 sdist that `toolchain/dev.sh setup` caches under
.venv/share/, turned into HF tokenizer.json by transformers' GGUF loader, plus the test strings."""

from __future__ import annotations

import ctypes
import fcntl
import json
import random
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / ".venv" / "share" / "llama-cpp-python-0.3.36" / "vendor" / "llama.cpp" / "models"
SEP = "\n__ggml_vocab_test__\n"


def llamacpp_cases(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's own test strings for a vocabulary and the ids llama.cpp expects."""
    inp = (MODELS / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split(SEP)
    out = (MODELS / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    return [(s, [int(x) for x in o.split()]) for s, o in zip(inp, out, strict=False)]


CONVERTED = ROOT / ".venv" / "share" / "colibri-tokvocab"  # the conversions, made once


def gguf_to_hf(name: str, tmp: Path) -> Path:
    """The vocabulary as tokenizer.json + tokenizer_config.json (transformers' GGUF conversion), cached."""
    import transformers

    dest = CONVERTED / f"{name}-transformers-{transformers.__version__}"
    CONVERTED.mkdir(parents=True, exist_ok=True)
    # one conversion even when test files on two workers (pytest -n 2) ask for it at once
    with open(CONVERTED / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (dest / "tokenizer.json").is_file():
            tok = transformers.AutoTokenizer.from_pretrained(str(MODELS), gguf_file=f"ggml-vocab-{name}.gguf")
            tok.save_pretrained(str(tmp))
            if dest.exists():  # what an interrupted conversion left
                shutil.rmtree(dest)
            tmp.rename(dest)
    return dest


def variant(src: Path, dest: Path, edit) -> Path:
    """A copy of a tokenizer directory with tokenizer.json edited by `edit(dict)`."""
    dest.mkdir(parents=True, exist_ok=True)
    j = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    edit(j)
    (dest / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
    (dest / "tokenizer_config.json").write_text((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    return dest


def train_bytelevel(path: Path, vocab: int = 320, specials: tuple[str, ...] = ("<|endoftext|>",)) -> Path:
    """A small byte-level BPE tokenizer.json trained by HF tokenizers (GPT-2 pre-tokenizer), with these
    special tokens first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["Hello world, hello there. 123+456=579; spaces and lines"] * 50, trainer)
    tok.save(str(path / "tokenizer.json"))
    return path


def build_lib(dest: Path, *cflags: str) -> ctypes.CDLL:
    """runtime_c/src/text/ (TEXT_SRC) as a shared library, with the build's warning flags."""
    from colibri.runtime.text import compile_library
    from colibri.toolchain.csources import WARN_CFLAGS

    return ctypes.CDLL(str(compile_library(dest, *WARN_CFLAGS, *cflags)))


# Hand-picked strings: scripts, emoji with ZWJ, combining marks, whitespace, digits, code, contractions.
HAND = [
    "", " ", "  ", "\t", "\n", "\n\n\n", " \n \n", "\r\n", "\t\t x", "a", "A", "Hello, world", " Hello", "  Hello",
    "Hello  world", "Hello\nworld", "hello world!!!", "I'm", "I'M", "you'll", "YOU'LL", "we've", "they're", "it's",
    "'s", "don't", "can't stop", "'", "''", "'''s", "a'b", "123", "1234567", "3.14159", "1,000,000", "12ab34",
    "٣٤٥ ١٢", "١٢٣٤٥", "Ⅻ ⅷ", "½ ¾", "x²+y³", "Привет, мир!", "Ελληνικά γράμματα", "שלום עולם", "مرحبا بالعالم",
    "नमस्ते दुनिया", "বাংলা ভাষা", "ਪੰਜਾਬੀ", "தமிழ்", "తెలుగు", "ಕನ್ನಡ", "മലയാളം", "ไทย ภาษา", "ລາວ", "ქართული",
    "Հայերեն", "አማርኛ", "ᠮᠣᠩᠭᠣᠯ", "བོད་ཡིག", "ខ្មែរ", "မြန်မာ", "한국어 텍스트", "日本語のテキスト", "カタカナ ひらがな",
    "中文文本测试", "繁體中文", "𠀀𠀁 𪚥", "Tiếng Việt có dấu", "Zürich Straße", "café naïve", "œuvre Æsir",
    "ﬁ ﬂ ligatures", "e\u0301 a\u0308 o\u0302", "Z\u0351\u0361a\u036bl\u0364g\u0366o", "\u0627\u064e\u0644",
    "👋", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👍🏽", "🇫🇷🇩🇪", "❤️", "😀😃😄 😁", "1️⃣", "🧑‍💻 coding", "emoji: 🤖!",
    "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; i++) { a[i] = b[i]; }", "if x==1:\n\tpass",
    "<html><body>Hi</body></html>", "{\"key\": [1, 2, 3]}", "SELECT * FROM t WHERE id = 42;", "a->b::c",
    "https://example.com/path?q=1&r=2", "user@example.com", "#include <stdio.h>", "    indented", "trailing   ",
    "\u00a0nbsp\u00a0", "\u3000ideographic space", "\u2003em space", "zero\u200bwidth", "soft\u00adhyphen",
    "mixed\u2028line\u2029sep", "\x0bvt\x0cff", "\x1c\x1d\x1e\x1f", "\x85nel", "ſtraße 'ſ", "ǅ ǈ ǋ",
    "ＡＢＣ　ｆｕｌｌｗｉｄｔｈ", "㍿ ㈱", "₀₁₂ ⁰¹²", "−5 – — …", "«quotes» “curly” ‘single’", "¿Qué? ¡Sí!",
    "\ufeffBOM", "\ufffd", "\U0010ffff", "\U0001f600\U0001f600\U0001f600", "ab" * 50, "a" * 300, " " * 40,
    "1" * 40, "!" * 40, "\n" * 10 + "x", "<s>", "</s>", "<unk>", "<|endoftext|>", "<|begin_of_text|>",
    "<|im_start|>user", "a<s>b</s>c", "<s> hello", "hello<|endoftext|>world", "<|end_of_text|><|end_of_text|>",
]

POOL = ("the quick brown fox jumps over the lazy dog Hello WORLD I'm we'll 0 42 1234 3.5 , . ! ? ; : ' \" ( ) [ ] "
        "{ } < > = + - * / \\ # @ $ % ^ & | ~ ` _ é ñ ü ß ø Ж я λ Ω א ب ह ক ก 가 日 本 の ア 😀 👨‍💻 🇯🇵 ✓ € £ ¥ "
        "\u0301 \u0308 \u200d \t \n \r\n   \u00a0 ① ½ ٣").split(" ")


def strings(n_random: int = 260, seed: int = 16) -> list[str]:
    """HAND, plus llama.cpp-style random mixtures of POOL (fixed seed), plus one long text."""
    rng = random.Random(seed)
    out = list(HAND)
    for _ in range(n_random):
        k = rng.randint(1, 24)
        out.append("".join(rng.choice(POOL) + rng.choice(["", " ", "", "  "]) for _ in range(k)))
    out.append(" ".join(HAND[10:120]) * 3)  # a long text (~6 KB)
    return out
