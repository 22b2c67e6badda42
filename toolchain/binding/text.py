"""ctypes over the C tokenizer (colibri_text.h): encode and decode run in C, not in Python."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

SCRATCH_BYTES = 1 << 20  # the binding's scratch: one pre-token of up to ~116k bytes
PARSE_SPECIAL, SPECIAL, FIRST = 2, 1, 1
_WORDS = 32  # sizeof(colibri_tok) is well under 32 * 8 bytes


class TokenizerError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"{message} (status {status})")
        self.status = status


def declare(lib: ctypes.CDLL) -> None:
    p, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.colibri_tok_init.argtypes = [p, p, sz]
    lib.colibri_tok_encode.argtypes = [p, ctypes.c_char_p, sz, ctypes.c_uint, ctypes.POINTER(ctypes.c_int32), sz,
                                       ctypes.POINTER(sz), p, sz]
    lib.colibri_tok_decode.argtypes = [p, ctypes.c_int32, ctypes.c_uint, ctypes.c_char_p, sz, ctypes.POINTER(sz)]
    lib.colibri_tok_vocab.argtypes = [p]
    lib.colibri_tok_vocab.restype = ctypes.c_uint32
    lib.colibri_tok_strerror.argtypes = [ctypes.c_int]
    lib.colibri_tok_strerror.restype = ctypes.c_char_p
    for fn in ("colibri_tok_init", "colibri_tok_encode", "colibri_tok_decode"):
        getattr(lib, fn).restype = ctypes.c_int


class Tokenizer:
    """A validated tokenizer section (`section_ptr` must stay alive: pass its owner in keepalive)."""

    def __init__(self, lib: ctypes.CDLL, section_ptr: int, section_len: int, keepalive: object = None):
        declare(lib)
        self._lib, self._keep = lib, keepalive
        self._tok = (ctypes.c_uint64 * _WORDS)()
        self._check(lib.colibri_tok_init(self._tok, section_ptr, section_len))
        self._scratch = np.zeros(SCRATCH_BYTES // 4, dtype=np.uint32)
        self.vocab = lib.colibri_tok_vocab(self._tok)

    @classmethod
    def from_bytes(cls, lib: ctypes.CDLL, section: bytes) -> Tokenizer:
        buf = np.frombuffer(section + b"\0" * (-len(section) % 4), dtype=np.uint32).copy()
        return cls(lib, buf.ctypes.data, len(section), buf)

    def _check(self, status: int) -> None:
        if status != 0:
            raise TokenizerError(status, self._lib.colibri_tok_strerror(status).decode())

    def encode(self, text: str | bytes, special: bool = False, parse_special: bool = True,
               max_ids: int | None = None) -> list[int]:
        data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
        cap = max_ids if max_ids is not None else len(data) + 2
        ids = (ctypes.c_int32 * max(cap, 1))()
        n = ctypes.c_size_t()
        flags = (SPECIAL if special else 0) | (PARSE_SPECIAL if parse_special else 0)
        self._check(self._lib.colibri_tok_encode(self._tok, data, len(data), flags, ids, cap, ctypes.byref(n),
                                                 self._scratch.ctypes.data, self._scratch.nbytes))
        return list(ids[: n.value])

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        out = bytearray()
        buf = ctypes.create_string_buffer(1 << 16)
        n = ctypes.c_size_t()
        for k, i in enumerate(ids):
            self._check(self._lib.colibri_tok_decode(self._tok, int(i), FIRST if k == 0 else 0, buf, len(buf),
                                                     ctypes.byref(n)))
            out += buf.raw[: n.value]
        return bytes(out)

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", "replace")
