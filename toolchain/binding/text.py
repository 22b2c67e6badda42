"""ctypes over the C tokenizer (colibri_text.h): encode and decode run in C, not in Python."""

from __future__ import annotations

import ctypes
import mmap
import os
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path

import numpy as np

SCRATCH_BYTES = 1 << 20  # the binding's scratch: one pre-token of up to ~116k bytes
PARSE_SPECIAL, SPECIAL, FIRST = 2, 1, 1
_WORDS = 32  # sizeof(colibri_tok) is well under 32 * 8 bytes
KIND_SPM, F_BYTE_FALLBACK = 1, 2  # FORMAT.md "Tokenizer": word 2's kind and flags


class _TokView(ctypes.Structure):
    """colibri_tok's fields (colibri_text.h), to read which ids are byte-fallback tokens."""

    _fields_ = [(n, ctypes.c_void_p) for n in ("base", "hdr", "offs", "sorted", "merges", "added", "byte_tok",
                                                "lranges", "nranges", "pieces")] + \
               [(n, ctypes.c_uint32) for n in ("n_vocab", "n_merges", "n_added", "n_l", "n_n", "kind", "pretok",
                                                "flags")]


class TokenizerError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"{message} (status {status})")
        self.status = status


def declare(lib: ctypes.CDLL) -> None:
    p, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.colibri_tok_init.argtypes = [p, p, sz]
    lib.colibri_tok_from_blob.argtypes = [p, p, sz]
    lib.colibri_tok_encode.argtypes = [p, ctypes.c_char_p, sz, ctypes.c_uint, ctypes.POINTER(ctypes.c_int32), sz,
                                       ctypes.POINTER(sz), p, sz]
    lib.colibri_tok_decode.argtypes = [p, ctypes.c_int32, ctypes.c_uint, ctypes.c_char_p, sz, ctypes.POINTER(sz)]
    lib.colibri_tok_vocab.argtypes = [p]
    lib.colibri_tok_vocab.restype = ctypes.c_uint32
    lib.colibri_tok_strerror.argtypes = [ctypes.c_int]
    lib.colibri_tok_strerror.restype = ctypes.c_char_p
    for fn in ("colibri_tok_init", "colibri_tok_from_blob", "colibri_tok_encode", "colibri_tok_decode"):
        getattr(lib, fn).restype = ctypes.c_int


NO_TOKENIZER = -108  # COLIBRI_TOK_E_NONE: the blob has no tokenizer section


class NoTokenizerError(TokenizerError, ValueError):
    """The model was exported without a tokenizer (--no-tokenizer, or no tokenizer.json)."""


class Tokenizer:
    """A validated tokenizer section (`section_ptr` must stay alive: pass its owner in keepalive);
    `in_blob`: the pointer is a whole model blob whose TOKENIZER entry holds the section."""

    def __init__(self, lib: ctypes.CDLL, section_ptr: int, section_len: int, keepalive: object = None,
                 in_blob: bool = False):
        declare(lib)
        self._lib, self._keep = lib, keepalive
        self._tok = (ctypes.c_uint64 * _WORDS)()
        init = lib.colibri_tok_from_blob if in_blob else lib.colibri_tok_init
        status = init(self._tok, section_ptr, section_len)
        if status == NO_TOKENIZER:
            raise NoTokenizerError(status, "the model has no tokenizer (exported with --no-tokenizer or from a "
                                           "checkpoint without tokenizer.json)")
        self._check(status)
        self._scratch = np.zeros(SCRATCH_BYTES // 4, dtype=np.uint32)
        self.vocab = lib.colibri_tok_vocab(self._tok)
        view = _TokView.from_buffer(self._tok)
        byte_fallback = view.kind == KIND_SPM and view.flags & F_BYTE_FALLBACK
        self.byte_ids = frozenset((ctypes.c_uint32 * 256).from_address(view.byte_tok)) if byte_fallback else frozenset()

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
        # at most one id per byte of the text as the tokenizer sees it: NFC makes at most 3 bytes of 1, a
        # SentencePiece space becomes the 3-byte U+2581 (one more in front), and BOS/EOS
        cap = max_ids if max_ids is not None else 3 * len(data) + 5
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

    def piece(self, id: int) -> tuple[bytes, int]:
        """One generated id's bytes and kind for streaming (sampling.Utf8Stream): BYTE for a byte-fallback
        token, else TEXT. An id of the model's vocabulary the tokenizer lacks has no bytes (HF decode skips
        it, as colibri_demo does)."""
        from .sampling import BYTE, TEXT

        if not 0 <= int(id) < self.vocab:
            return b"", TEXT
        buf = ctypes.create_string_buffer(1 << 16)
        n = ctypes.c_size_t()
        self._check(self._lib.colibri_tok_decode(self._tok, int(id), 0, buf, len(buf), ctypes.byref(n)))
        return buf.raw[: n.value], BYTE if int(id) in self.byte_ids else TEXT

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", "replace")


def library_for(model: Path, runtime: str | os.PathLike | None = None) -> ctypes.CDLL:
    """The C library that runs a model's tokenizer: the model .so itself, or the generic libcolibri.so
    that runs a model.bin (beside it, `runtime`, or $COLIBRI_RUNTIME)."""
    if model.suffix == ".so" or ".so." in model.name:
        lib_path = model
    else:
        candidates = [runtime, model.parent / "libcolibri.so", os.environ.get("COLIBRI_RUNTIME")]
        found = next((Path(c) for c in candidates if c and Path(c).is_file()), None)
        if found is None:
            raise FileNotFoundError(f"{model}: no generic runtime libcolibri.so beside it; set COLIBRI_RUNTIME")
        lib_path = found
    lib = ctypes.CDLL(str(lib_path.absolute()), mode=ctypes.RTLD_LOCAL)
    if not hasattr(lib, "colibri_tok_init"):
        raise ValueError(f"{lib_path}: built without the text runtime (no colibri_tok_init)")
    return lib


def for_model(model: str | os.PathLike, lib: ctypes.CDLL | None = None) -> Tokenizer:
    """The tokenizer inside a model's blob: a model.bin (run by the generic libcolibri.so) or a model
    library (its linked-in blob, colibri_model_blob)."""
    model = Path(model)
    if not model.is_file():
        raise FileNotFoundError(f"{model}: no such file")
    lib = lib or library_for(model)
    if model.suffix == ".so" or ".so." in model.name:
        if not hasattr(lib, "colibri_model_blob"):
            raise ValueError(f"{model}: not a colibri model library (no colibri_model_blob)")
        lib.colibri_model_blob.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
        lib.colibri_model_blob.restype = ctypes.c_void_p
        n = ctypes.c_size_t()
        ptr = lib.colibri_model_blob(ctypes.byref(n))
        return Tokenizer(lib, ptr, n.value, lib, in_blob=True)
    with open(model, "rb") as f:  # mapped read-only: the tokenizer never writes the blob
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(mm, dtype=np.uint8)
    return Tokenizer(lib, view.ctypes.data, view.size, (mm, view), in_blob=True)


TEXT_LIBRARY = "libcolibri_text.so"


def compile_library(dest: Path, *cflags: str) -> Path:
    """The text runtime alone (csources.TEXT_SRC), compiled for this machine by $CC (default cc) into
    dest/libcolibri_text.so: the C tokenizer without a model, for Tokenizer.from_bytes on a tokenizer section
    the exporter packs. Raises OSError when there is no compiler, CalledProcessError when it fails."""
    from colibri.toolchain.csources import RUNTIME_DIR, TEXT_SRC, runtime_sources

    so = Path(dest) / TEXT_LIBRARY
    cc = shlex.split(os.environ.get("CC") or "cc")
    subprocess.run([*cc, "-std=c11", "-O2", "-fPIC", "-shared", f"-I{RUNTIME_DIR / 'include'}", *cflags,
                    *map(str, runtime_sources(TEXT_SRC)), "-o", str(so)],
                   check=True, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return so
