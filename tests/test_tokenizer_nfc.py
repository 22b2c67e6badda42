"""NFC composition in C (runtime_c/src/text/nfc.c, tables from codegen/tokenizer/nfc.py) and DeepSeek's
pre-tokenizer (runtime_c/src/text/pre_deepseek.c) against HF `tokenizers`: the Qwen2 vocabulary with an NFC
normalizer declared, and llama.cpp's DeepSeek LLM vocabulary with DeepSeek's exact pre-tokenizer."""

from __future__ import annotations

import json
import random
import struct
import subprocess
import unicodedata

import pytest

from colibri.codegen.errors import ExportError
from colibri.codegen.tokenizer import deepseek, load_tokenizer, nfc, pack
from colibri.runtime.text import Tokenizer, TokenizerError
from colibri.toolchain.csources import TEXT_SRC

from cbuild import SAN_ENV, SAN_MARKERS
from tokvocab import MODELS, ROOT, build_lib, gguf_to_hf, llamacpp_cases, strings, train_bytelevel, variant

needs_models = pytest.mark.skipif(not MODELS.is_dir(), reason=f"{MODELS} missing: run `bash toolchain/dev.sh setup`")
E_SECTION, E_VERSION, E_NFC = -102, -103, -107


def _nfc(j):
    j["normalizer"] = {"type": "NFC"}


def _deepseek(j):  # DeepSeek LLM / MoE's tokenizer.json: no normalizer, its Sequence pre-tokenizer
    j["normalizer"] = {"type": "Sequence", "normalizers": []}
    j["pre_tokenizer"] = deepseek.pre_tokenizer()


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return build_lib(tmp_path_factory.mktemp("nfclib"))


@pytest.fixture(scope="module")
def qwen2_nfc(tmp_path_factory):
    root = tmp_path_factory.mktemp("qn")
    return variant(gguf_to_hf("qwen2", root / "q"), root / "qwen2-nfc", _nfc)


@pytest.fixture(scope="module")
def spm_nfc(tmp_path_factory):  # SentencePiece-style BPE (Metaspace) with NFC declared
    root = tmp_path_factory.mktemp("sn")
    return variant(gguf_to_hf("llama-spm", root / "s"), root / "llama-spm-nfc", _nfc)


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    return variant(gguf_to_hf("deepseek-llm", root / "d"), root / "deepseek", _deepseek)


def _hf(d):
    from tokenizers import Tokenizer as HF

    return HF.from_file(str(d / "tokenizer.json"))


MARKS = [chr(c) for c in range(0x300, 0x370)] + ["\u0591", "\u05b4", "\u05bc", "\u05c1", "\u093c", "\u094d",
                                                "\u0bcd", "\u0e38", "\u0e48", "\u1dc0", "\u20d0", "\u302a", "\u3099"]
BASES = list("aeiouAEIOUnNcCsSzZyYwWgGkKrRlL") + ["\u03b1", "\u03c9", "\u0397", "\u0438", "\u0415", "\u05e9",
                                                   "\u0915", "\u0921", "\u0b47", "\u0bc6", "\u0cc6", " ", "1"]
PRECOMPOSED = [chr(c) for c in range(0xC0, 0x250) if unicodedata.decomposition(chr(c))] + ["\u1ea0", "\u1ec7",
                                                                                               "\u1f82", "\u1e69"]
HANGUL = ([chr(c) for c in range(0x1100, 0x1113)] + [chr(c) for c in range(0x1161, 0x1176)]
          + [chr(c) for c in range(0x11A8, 0x11C3)] + ["\uac00", "\uac01", "\ud55c", "\uae00", "\ud7a3", "\uc0ac"])
SINGLETONS = ["\u212b", "\u2126", "\u212a", "\u0340", "\u0341", "\u0343", "\u0374", "\u037e", "\u0387", "\u1fee",
              "\u1ffd", "\u2000", "\u2001", "\uf900", "\ufa10", "\U0002f800"]
EXCLUSIONS = ["\u0958", "\u0959", "\u095f", "\u09dc", "\u0a33", "\u0b5c", "\u0f43", "\u0f73", "\u0f75", "\ufb1d",
              "\ufb2a", "\ufb4e", "\u2adc", "\U0001d15e", "\U0001d1bb", "\u0344"]
VIETNAMESE = ["Tiếng Việt có dấu", "Người ta nói rằng", "Hà Nội mùa thu", "chữ Quốc ngữ", "đường phố Sài Gòn"]
DEVANAGARI = ["नमस्ते दुनिया", "क़ ख़ ग़ ज़ ड़ ढ़ फ़ य़", "\u0915\u093c\u0916\u093c", "हिन्दी भाषा", "ऩ ऱ ऴ", "\u0928\u093c"]


def nfc_strings(n_random: int = 300, seed: int = 16) -> list[str]:
    """Text heavy in combining marks, Hangul jamo, precomposed/decomposed Latin, Vietnamese, Devanagari,
    singletons and composition exclusions, each also in NFD; plus fixed-seed random mixtures of them."""
    rng = random.Random(seed)
    out = [*VIETNAMESE, *DEVANAGARI, "".join(SINGLETONS), "".join(EXCLUSIONS), "".join(HANGUL),
           "e\u0301 a\u0308 o\u0302", "a\u0316\u0301\u0300", "a\u0301\u0316", "\u1100\u1161\u11a8 \u1100\u1161",
           "\uac00\u11a8", "\u0b47\u0b3e \u0b47\u0b57", "\u0bc6\u0bbe", "\u1fbf\u0301", "\u0041\u030a\u0301",
           "Z\u0351\u0361a\u036bl\u0364g\u0366o", "\u0301start", "\u0301\u0316", "x" + "\u0301" * 60]
    out += [unicodedata.normalize("NFD", s) for s in out]
    pools = (MARKS, BASES, PRECOMPOSED, HANGUL, SINGLETONS, EXCLUSIONS)
    for _ in range(n_random):
        parts = []
        for _ in range(rng.randint(1, 20)):
            pool = rng.choice(pools)
            parts.append(rng.choice(pool) + (rng.choice(MARKS) * rng.randint(0, 3) if rng.random() < 0.4 else ""))
        s = "".join(parts)
        out.append(unicodedata.normalize("NFD", s) if rng.random() < 0.3 else s)
    return out


def test_unicode_versions_agree_on_the_strings():
    """nfc.py's tables come from Python's unicodedata (UNICODE_VERSION); HF tokenizers' NFC carries its own,
    older tables: on every string tested the two NFC agree, and most strings are changed by NFC."""
    from tokenizers.normalizers import NFC

    texts = nfc_strings()
    assert len(texts) >= 300
    hf = NFC()
    assert [hf.normalize_str(s) for s in texts] == [unicodedata.normalize("NFC", s) for s in texts]
    assert sum(unicodedata.normalize("NFC", s) != s for s in texts) > len(texts) // 2


def _same_as_hf(hf, tok, texts: list[str]) -> None:
    """The C tokenizer's ids and decoded text are HF's for every text (the binding's default ids buffer
    covers NFC's expansion of a text up to 3 times)."""
    bad = []
    for s in texts:
        want = hf.encode(s, add_special_tokens=False).ids
        got = tok.encode(s)
        if got != want or tok.decode(got) != hf.decode(want, skip_special_tokens=False):
            bad.append((s, want[:12], got[:12]))
    assert not bad, f"{len(bad)} of {len(texts)} differ, first: {bad[:3]}"


@needs_models
@pytest.mark.parametrize("which", ["qwen2_nfc", "spm_nfc"])
def test_nfc_same_ids_and_text_as_hf(request, which, lib):
    d = request.getfixturevalue(which)
    hf, tok = _hf(d), Tokenizer.from_bytes(lib, pack(load_tokenizer(d)))
    texts = nfc_strings() + strings()
    _same_as_hf(hf, tok, texts)


@needs_models
def test_nfc_bounded_sequence_and_scratch(qwen2_nfc, lib):
    """a combining sequence over COLIBRI_NFC_MAX_SEQ (64) is an error, never a crash or a different id"""
    tok = Tokenizer.from_bytes(lib, pack(load_tokenizer(qwen2_nfc)))
    hf = _hf(qwen2_nfc)
    ok = "x" + "\u0301" * 63
    assert tok.encode(ok) == hf.encode(ok, add_special_tokens=False).ids
    with pytest.raises(TokenizerError) as e:
        tok.encode("x" + "\u0301" * 64)
    assert e.value.status == E_NFC


def _trained(tmp_path):
    d = train_bytelevel(tmp_path)
    (d / "tokenizer_config.json").write_text("{}")
    return d


def test_tables_only_with_nfc(tmp_path):
    """a tokenizer without NFC carries no NFC table (header word 14 is 0); with NFC, the block plus the Q ranges"""
    d = _trained(tmp_path)
    plain = pack(load_tokenizer(d))
    with_nfc = pack(load_tokenizer(variant(d, tmp_path / "n", _nfc)))
    hp, hn = struct.unpack_from("<16I", plain), struct.unpack_from("<16I", with_nfc)
    assert hp[1] == hn[1] == 2 and hp[13] == hp[14] == 0
    block = nfc.block()
    assert hn[14] == len(block) and len(with_nfc) - len(plain) == 4 * len(block) + 8 * hn[13]
    assert 40_000 < 4 * len(block) < 48_000  # 43,924 bytes with Python 3.11's Unicode 14.0.0


def _nfc_section(tmp_path):
    d = variant(_trained(tmp_path), tmp_path / "n", _nfc)
    return bytearray(pack(load_tokenizer(d)))


def _block_at(sec: bytearray) -> int:
    h = struct.unpack_from("<16I", sec)
    return h[12] - ((h[11] + 3) & ~3) - 4 * h[14]


def test_malformed_nfc_tables_refused(tmp_path, lib):
    sec = _nfc_section(tmp_path)
    Tokenizer.from_bytes(lib, bytes(sec))
    at = _block_at(sec)
    nd, npool, ncc, nk = struct.unpack_from("<4I", sec, at)
    dec, pool = at + 16, at + 16 + 8 * nd
    ccc = pool + 4 * npool
    comp = ccc + 8 * ncc

    def w(off, v):
        s = bytearray(sec)
        struct.pack_into("<I", s, off, v)
        return bytes(s)

    cases = {
        "count": w(at, nd + 1), "decomp order": w(dec + 8, 0), "decomp length 0": w(dec + 4, 0),
        "decomp length 5": w(dec + 4, 5 << 24), "pool offset": w(dec + 4, (1 << 24) | npool),
        "pool codepoint": w(pool, 0x110000),
        "ccc zero": w(ccc + 4, struct.unpack_from("<I", sec, ccc + 4)[0] & 0xFFFFFF),
        "ccc order": w(ccc + 8, 0), "ccc range": w(ccc, 0x10FFFF), "comp order": w(comp + 12, 0),
        "comp codepoint": w(comp + 8, 0x200000),
        "no nfc flag": w(8, struct.unpack_from("<I", sec, 8)[0] & ~(4 << 16)),
        "no block": w(56, 0), "version 1": w(4, 1),
    }
    nf = struct.unpack_from("<I", sec, 56)[0]
    cut = bytearray(sec[:at] + sec[at + 4 * nf:])  # the block taken out, the header's sizes made to agree
    struct.pack_into("<I", cut, 56, 0)
    struct.pack_into("<I", cut, 48, struct.unpack_from("<I", sec, 48)[0] - 4 * nf)
    cases["Q ranges without a block"] = bytes(cut)
    for name, bad in cases.items():
        with pytest.raises(TokenizerError) as e:
            Tokenizer.from_bytes(lib, bad)
        assert e.value.status == (E_VERSION if name == "version 1" else E_SECTION), name


def _driver(cc: str, exe, *flags: str):
    """runtime_c/test/tok_driver.c with the text runtime (TEXT_SRC), the build's warning flags"""
    srcs = [ROOT / "runtime_c" / "test" / "tok_driver.c", *(ROOT / "runtime_c" / "src" / s for s in TEXT_SRC)]
    subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{ROOT / 'runtime_c' / 'include'}",
                    *flags, *map(str, srcs), "-o", str(exe)], check=True)
    return exe


def test_mutated_nfc_sections_never_crash(tmp_path):
    sec = tmp_path / "tokenizer.bin"
    sec.write_bytes(_nfc_section(tmp_path))
    exe = _driver("cc", tmp_path / "drv", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all")
    res = subprocess.run([str(exe), "mutate", str(sec), "3000", "17"], capture_output=True, text=True, env=SAN_ENV,
                         timeout=300)
    assert res.returncode == 0 and not any(m in res.stderr for m in SAN_MARKERS), res.stdout + res.stderr
    accepted, refused = (int(x) for x in res.stdout.split()[1::2])
    assert accepted + refused == 3000 and refused > 1000 and accepted > 0


DEEPSEEK_TEXTS = ["你好，世界！", "中文English混合123", "한국어 텍스트", "  trailing   ", "a\n\nb\r\nc",
                  "x\u3000y\u3000", "\u3000\u3000z", "Ｆｕｌｌ，ｗｉｄｔｈ！", "“quoted” ‘text’", "ΑΒΓ αβγ ώ ΐ Ί",
                  "ᏣᎳᎩ",
                  "𐐀𐐁 𞤀", "123456789", "١٢٣ ½", " 12 ab", "e\u0301", "नमस्ते", "ไทย", "Ⅻ", "$100 & 50%", "\t\ta", " \n",
                  "À Á õ ÿ", "ÀÁ", "naïve café", "Zürich", "\u1f7d\u1fd3\u1fdb \u03ce\u0390\u038a",
                  "a\u07ff\u0800b\u4e00c\u9fa5\u9fa6d\uabff\uac00\ud7ff\ue000",
                  "\u2017\u2018\u2020 \uff00\uff01\uff0f\uff10"]


DEEPSEEK_POOL = ("a b Hello world é Ω ж 你 好 世界 한 국 ア ไทย مرحبا שלום 1 23 ١ ½ ! , . ? “ ” ‘ ’ ， 。 、 ！ ？ "
                 "ＡＢ ｘ 😀 👍🏽 ✓ € \u0301 \u3000 \u00a0 \u2003 \t \r \n \r\n ÀÁ ü ÿ ώ").split(" ") + [" ", "  "]


def deepseek_strings(n: int = 200, seed: int = 7) -> list[str]:
    """Fixed-seed mixtures of what each stage of DeepSeek's Sequence tells apart: whitespace of every kind
    (U+3000 is also in its punctuation class), trailing whitespace, curly quotes and fullwidth forms, CJK,
    Hangul, digits, emoji, CR/LF"""
    rng = random.Random(seed)
    return ["".join(rng.choice(DEEPSEEK_POOL) for _ in range(rng.randint(1, 12))) for _ in range(n)]


@needs_models
def test_deepseek_reproduces_llamacpp_and_hf(deepseek_dir, lib):
    """HF with DeepSeek's pre-tokenizer reproduces llama.cpp's expected ids (transformers' conversion alone
    gives a GPT-2 pre-tokenizer), and the C tokenizer gives HF's ids and text"""
    hf, tok = _hf(deepseek_dir), Tokenizer.from_bytes(lib, pack(load_tokenizer(deepseek_dir)))
    cases = llamacpp_cases("deepseek-llm")
    assert len(cases) >= 40
    assert [hf.encode(s, add_special_tokens=False).ids for s, _ in cases] == [ids for _, ids in cases]
    texts = strings() + [s for s, _ in cases] + DEEPSEEK_TEXTS + deepseek_strings()
    _same_as_hf(hf, tok, texts)


@needs_models
def test_deepseek_variants_refused(deepseek_dir, tmp_path):
    def other_digits(j):
        j["pre_tokenizer"]["pretokenizers"][5]["individual_digits"] = False

    def other_class(j):
        j["pre_tokenizer"]["pretokenizers"][2]["pattern"]["Regex"] = r"\s?[!-/]+"

    for i, edit in enumerate((other_digits, other_class)):
        with pytest.raises(ExportError, match="unsupported tokenizer component: pre_tokenizer Sequence"):
            load_tokenizer(variant(deepseek_dir, tmp_path / str(i), edit))
    assert json.loads((deepseek_dir / "tokenizer.json").read_text())["pre_tokenizer"] == deepseek.pre_tokenizer()


def test_deepseek_pre_tokens_are_hf_splits(lib):
    """pre_deepseek.c's pieces themselves (colibri_ds_next through ctypes) against HF's pre-tokenizers: the
    same Sequence of Splits and Digits (before ByteLevel), on the texts above - boundaries that no merge of
    a vocabulary crosses included"""
    import ctypes

    from tokenizers import Regex, pre_tokenizers

    from colibri.codegen.tokenizer.pack import category_ranges

    hf = pre_tokenizers.Sequence([*(pre_tokenizers.Split(Regex(p), "isolated") for p in deepseek.PATTERNS),
                                  pre_tokenizers.Digits(individual_digits=True)])

    def table(ranges):
        return (ctypes.c_uint32 * (2 * len(ranges)))(*(x for r in ranges for x in r)), len(ranges)

    (letters, nl), (digits, nn) = table(deepseek.LETTER_RANGES), table(category_ranges("N"))
    it = ctypes.create_string_buffer(1024)  # colibri_ds_iter: well under 1 KiB
    start, end = ctypes.c_size_t(), ctypes.c_size_t()
    bad = []
    texts = strings() + DEEPSEEK_TEXTS + deepseek_strings(400, seed=8)
    for text in texts:
        data = text.encode()
        lib.colibri_ds_begin(it, data, ctypes.c_size_t(len(data)), letters, nl, digits, nn)
        pieces = []
        while lib.colibri_ds_next(it, ctypes.byref(start), ctypes.byref(end)):
            pieces.append(data[start.value:end.value].decode())
        want = [p for p, _ in hf.pre_tokenize_str(text)]
        if pieces != want:
            bad.append((text, want[:8], pieces[:8]))
    assert not bad, f"{len(bad)} of {len(texts)} differ, first: {bad[:3]}"


@needs_models
@pytest.mark.parametrize("cc,runner", [("aarch64-linux-gnu-gcc", "qemu-aarch64"),
                                       ("arm-linux-gnueabihf-gcc", "qemu-arm"),  # 32-bit: rpi-armv7
                                       ("riscv64-linux-gnu-gcc", "qemu-riscv64")])
def test_cross_targets_same_ids(tmp_path, qwen2_nfc, deepseek_dir, cc, runner):
    """NFC and DeepSeek's pre-tokenizer cross-built (runtime_c/test/tok_driver.c) under qemu-user: HF's ids"""
    import shutil

    if not (shutil.which(cc) and shutil.which(runner)):
        pytest.skip(f"{cc} or {runner} not installed")
    exe = _driver(cc, tmp_path / "cross", "-O2", "-static")
    for name, d, texts in (("nfc", qwen2_nfc, nfc_strings()), ("deepseek", deepseek_dir, DEEPSEEK_TEXTS
                                                                + deepseek_strings())):
        texts = [s for s in texts if "\0" not in s]
        sec, txt = tmp_path / f"{name}.bin", tmp_path / f"{name}.txt"
        sec.write_bytes(pack(load_tokenizer(d)))
        txt.write_bytes(b"\0".join(s.encode() for s in texts))
        out = subprocess.run([runner, str(exe), "encode", str(sec), str(txt)], capture_output=True, text=True,
                             check=True, timeout=600).stdout
        hf = _hf(d)
        want = [",".join(map(str, hf.encode(s, add_special_tokens=False).ids)) for s in texts]
        assert out.split("\n")[:-1] == want, name
