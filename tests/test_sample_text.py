"""Streaming text never splits a character and replaces invalid bytes exactly as HuggingFace tokenizers'
decoders do: the binding's Utf8Stream and the C colibri_utf8 (runtime_c/src/sample.c, through ctypes)
fed token by token against `tokenizers`' own decode of the whole sequence, for a SentencePiece-style
vocabulary with byte fallback (Replace + ByteFallback + Fuse) and a byte-level BPE one (ByteLevel).
Model.generate_text's streaming is tested on a model in test_sample_model.py."""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

from colibri.toolchain.binding.sampling import BYTE, TEXT, Utf8Stream

from cbuild import ROOT, compile_c

SRC = ROOT / "runtime_c" / "src"
PIECES = ["▁", "▁the", "a", "b", "é", "你好", "▁😀", "x\u0301", "\u200d"]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def _sentencepiece():
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import BPE

    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    for p in PIECES:
        vocab[p] = len(vocab)
    tok = Tokenizer(BPE(vocab, [], byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    inv = {i: t for t, i in vocab.items()}

    def piece(i: int) -> tuple[bytes, int]:
        m = re.fullmatch(r"<0x([0-9A-F]{2})>", inv[i])
        return (bytes([int(m.group(1), 16)]), BYTE) if m else (inv[i].replace("▁", " ").encode(), TEXT)

    return tok, piece, len(vocab)


def _bytelevel():
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import BPE

    b2u = _bytes_to_unicode()
    pieces = [bytes([b]) for b in range(256)]
    for text in ["你好", "😀", "é", " the", "\u200d"]:
        raw = text.encode()
        pieces += [raw, raw[:1], raw[:2], raw[1:], raw[-1:]]
    pieces = list(dict.fromkeys(pieces))
    vocab = {"".join(b2u[b] for b in p): i for i, p in enumerate(pieces)}
    tok = Tokenizer(BPE(vocab, []))
    tok.decoder = decoders.ByteLevel()
    return tok, (lambda i: (pieces[i], TEXT)), len(pieces)


TOKENIZERS = {"sentencepiece_byte_fallback": _sentencepiece, "byte_level": _bytelevel}


def _sequences(vocab: int, n: int = 400, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    hot = [b for b in range(0x80, 0x100)]  # continuation and lead bytes: where the invalid sequences come from
    out = []
    for _ in range(n):
        length = int(rng.integers(0, 13))
        out.append([int(rng.choice(hot)) if rng.random() < 0.5 else int(rng.integers(0, vocab)) for _ in range(length)])
    return out


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    so = compile_c(tmp_path_factory.mktemp("utf8") / "libutf8.so", [SRC / "sample.c", SRC / "cbmath.c"],
                   ["-shared", "-fPIC", f"-I{SRC}"])
    lib = ctypes.CDLL(str(so))
    sz = ctypes.c_size_t
    lib.colibri_utf8_feed.argtypes = [ctypes.c_void_p, ctypes.c_char_p, sz, ctypes.c_int, ctypes.c_void_p, sz,
                                      ctypes.POINTER(sz)]
    lib.colibri_utf8_flush.argtypes = [ctypes.c_void_p, ctypes.c_void_p, sz, ctypes.POINTER(sz)]
    return lib


class CStream:
    """colibri_utf8 through ctypes: every chunk it emits must be whole characters."""

    RUN_MAX = 64

    def __init__(self, lib):
        self.lib = lib
        self.state = ctypes.create_string_buffer(4 + 1 + self.RUN_MAX + 1 + 16)
        self.out = ctypes.create_string_buffer(3 * (4096 + self.RUN_MAX + 4))

    def _take(self, st: int, n: ctypes.c_size_t) -> str:
        assert st == 0
        return self.out.raw[:n.value].decode("utf-8")  # strict: a split character would raise

    def feed(self, data: bytes, kind: int) -> str:
        n = ctypes.c_size_t()
        return self._take(self.lib.colibri_utf8_feed(self.state, data, len(data), kind, self.out, len(self.out),
                                                     ctypes.byref(n)), n)

    def flush(self) -> str:
        n = ctypes.c_size_t()
        return self._take(self.lib.colibri_utf8_flush(self.state, self.out, len(self.out), ctypes.byref(n)), n)


def _stream(stream, piece, ids) -> str:
    return "".join(stream.feed(*piece(i)) for i in ids) + stream.flush()


@pytest.mark.parametrize("name", TOKENIZERS)
def test_python_stream_is_hf_decode(name):
    tok, piece, vocab = TOKENIZERS[name]()
    for ids in _sequences(vocab):
        assert _stream(Utf8Stream(), piece, ids) == tok.decode(ids, skip_special_tokens=False), ids


@pytest.mark.parametrize("name", TOKENIZERS)
def test_c_stream_is_hf_decode(lib, name):
    tok, piece, vocab = TOKENIZERS[name]()
    invalid = 0
    for ids in _sequences(vocab):
        ref = tok.decode(ids, skip_special_tokens=False)
        invalid += "\ufffd" in ref
        assert _stream(CStream(lib), piece, ids) == ref, ids
    assert invalid > 50  # the sequences do exercise the replacement rules


def test_a_character_is_held_back_until_complete(lib):
    euro = "€".encode()
    for stream in (Utf8Stream(), CStream(lib)):
        assert stream.feed(euro[:1], TEXT) == "" and stream.feed(euro[1:2], TEXT) == ""
        assert stream.feed(euro[2:], TEXT) == "€"
        assert stream.feed(euro[:2], TEXT) == "" and stream.flush() == "\ufffd"


def test_byte_fallback_run_is_all_or_nothing(lib):
    for stream in (Utf8Stream(), CStream(lib)):
        # "é" then a stray continuation byte in one run: HF gives one U+FFFD per byte of the run
        out = "".join(stream.feed(bytes([b]), BYTE) for b in "é".encode() + b"\x80") + stream.feed(b"a", TEXT)
        assert out == "\ufffd\ufffd\ufffda"
