"""colibri.runtime: ctypes binding over a built model library or a model.bin.

    from colibri.runtime import load
    m = load("build/host/<model>/libcolibri_<model>.so")   # weights linked in
    m = load("build/host/<model>/model.bin")                # generic libcolibri.so beside it
    logits = m.forward([3, 17, 42]); m.generate([3, 17, 42], 16); m.reset()
    m.generate([3, 17, 42], 16, temperature=0.8, top_k=40, seed=7)          # the C sampler (colibri_sample.h)
    m.generate_text([3, 17, 42], 16, on_text=print, pieces=my_piece_decoder) # streamed, never a split character
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from pathlib import Path

import numpy as np

from .sampling import REPEAT_WINDOW, PieceDecoder, SampleError, Sampler, Utf8Stream

ALIGN = 64


class ColibriError(RuntimeError):
    """A colibri_* call returned an error status."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{message} (status {status})")
        self.status = status


class TokenError(ColibriError, ValueError):
    """The runtime refused a token id outside [0, vocab): a ValueError naming the element, with the
    runtime's status."""

    def __init__(self, status: int, message: str, index: int):
        super().__init__(status, message)
        self.index = index


INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def token_ids(tokens: Iterable[int]) -> np.ndarray:
    """tokens as an int32 array, never a cast: each must be a Python int or a numpy integer (not a
    bool), in a flat sequence or a 1-D integer array, and fit in int32 (whether it is below the
    vocabulary size is the runtime's to judge). Otherwise a TypeError or ValueError naming the bad
    element and its index."""
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1:
            raise TypeError(f"tokens: a {tokens.ndim}-D array, not a 1-D sequence of token ids")
        if tokens.dtype == np.bool_ or not np.issubdtype(tokens.dtype, np.integer):
            raise TypeError(f"tokens: an array of {tokens.dtype}, not of integer token ids")
        bad = np.flatnonzero((tokens < INT32_MIN) | (tokens > INT32_MAX))
        if bad.size:
            raise ValueError(f"tokens[{bad[0]}] = {tokens[bad[0]]}: not a token id (outside int32)")
        return np.ascontiguousarray(tokens, dtype=np.int32)  # every value fits: exact
    if isinstance(tokens, (str, bytes, bytearray, memoryview, Mapping, Set)) or not isinstance(tokens, Iterable):
        raise TypeError(f"tokens: {type(tokens).__name__}, not a sequence of token ids")
    items = list(tokens)
    for i, t in enumerate(items):
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"tokens[{i}] = {t!r}: a {type(t).__name__}, not an integer token id")
        if not INT32_MIN <= t <= INT32_MAX:
            raise ValueError(f"tokens[{i}] = {t}: not a token id (outside int32)")
    return np.array(items, dtype=np.int32).reshape(len(items))


class _ModelInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("abi_version", ctypes.c_uint32),
        ("vocab", ctypes.c_uint32),
        ("hidden", ctypes.c_uint32),
        ("n_layers", ctypes.c_uint32),
        ("n_experts", ctypes.c_uint32),
        ("top_k", ctypes.c_uint32),
        ("max_seq", ctypes.c_uint32),
        ("n_past", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("arena_bytes", ctypes.c_uint64),
        ("blob_bytes", ctypes.c_uint64),
    ]


def _declare(lib: ctypes.CDLL) -> None:
    p, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.colibri_arena_bytes.argtypes = [p, sz, ctypes.POINTER(sz)]
    lib.colibri_init.argtypes = [ctypes.POINTER(p), p, sz, p, sz]
    lib.colibri_forward.argtypes = [p, ctypes.POINTER(ctypes.c_int32), sz, ctypes.POINTER(ctypes.c_float), sz]
    lib.colibri_reset.argtypes = [p]
    lib.colibri_info.argtypes = [p, ctypes.POINTER(_ModelInfo)]
    lib.colibri_strerror.argtypes = [ctypes.c_int]
    lib.colibri_strerror.restype = ctypes.c_char_p
    for fn in ("colibri_arena_bytes", "colibri_init", "colibri_forward", "colibri_reset", "colibri_info"):
        getattr(lib, fn).restype = ctypes.c_int


def _aligned_zeros(nbytes: int) -> tuple[np.ndarray, int]:
    buf = np.zeros(nbytes + ALIGN, dtype=np.uint8)
    start = (-buf.ctypes.data) % ALIGN
    return buf, buf.ctypes.data + start


class Model:
    """One context over one blob; the arena is owned by this object."""

    def __init__(self, lib: ctypes.CDLL, blob_ptr: int, blob_len: int, keepalive: tuple = ()):
        self._lib = lib
        self._keep = keepalive
        self._blob = (blob_ptr, blob_len)
        need = ctypes.c_size_t()
        self._check(lib.colibri_arena_bytes(blob_ptr, blob_len, ctypes.byref(need)))
        self._arena, arena_ptr = _aligned_zeros(need.value)
        ctx = ctypes.c_void_p()
        self._check(lib.colibri_init(ctypes.byref(ctx), arena_ptr, need.value, blob_ptr, blob_len))
        self._ctx = ctx
        info = self.info()
        self.vocab = info.vocab
        self.max_seq = info.max_seq
        self.arena_bytes = info.arena_bytes
        self._logits = np.zeros(self.vocab, dtype=np.float32)

    def _check(self, status: int) -> None:
        if status != 0:
            raise ColibriError(status, self._lib.colibri_strerror(status).decode())

    def info(self) -> _ModelInfo:
        info = _ModelInfo(struct_size=ctypes.sizeof(_ModelInfo))
        self._check(self._lib.colibri_info(self._ctx, ctypes.byref(info)))
        return info

    @property
    def n_past(self) -> int:
        return int(self.info().n_past)

    def forward(self, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
        """Append tokens to the sequence; return the last position's logits (a copy).

        Tokens are Python ints or numpy integers in [0, vocab), in a flat sequence or a 1-D integer
        array; anything else is a TypeError or ValueError (TokenError) naming the element."""
        toks = token_ids(tokens)
        status = self._lib.colibri_forward(
            self._ctx, toks.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), toks.size,
            self._logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), self.vocab,
        )
        if status != 0:
            bad = np.flatnonzero((toks < 0) | (toks >= self.vocab))
            if bad.size:
                i = int(bad[0])
                raise TokenError(status, f"tokens[{i}] = {toks[i]}: outside [0, vocab {self.vocab}); "
                                 f"{self._lib.colibri_strerror(status).decode()}", i)
        self._check(status)
        return self._logits.copy()

    def _text(self):
        if getattr(self, "_tokenizer", None) is None:
            from .text import Tokenizer

            if not hasattr(self._lib, "colibri_tok_from_blob"):
                raise ValueError("this runtime library was built without the text runtime (no colibri_tok_from_blob)")
            self._tokenizer = Tokenizer(self._lib, *self._blob, self, in_blob=True)  # the section in the blob
        return self._tokenizer

    def tokenize(self, text: str, special: bool = False, parse_special: bool = True) -> list[int]:
        """UTF-8 text -> ids by the C tokenizer exported with the model; more than max_seq ids is an error."""
        return self._text().encode(text, special=special, parse_special=parse_special, max_ids=self.max_seq)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._text().decode(ids)

    def token_piece(self, id: int) -> tuple[bytes, int]:
        """The piece decoder of generate_text: one id's bytes and kind, by the blob's tokenizer."""
        return self._text().piece(id)

    def reset(self) -> None:
        self._check(self._lib.colibri_reset(self._ctx))

    def generate(self, tokens: Sequence[int], n: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0, repeat_penalty: float = 1.0, seed: int = 0, stop: Sequence[int] | None = None,
                 on_token: Callable[[int], None] | None = None, repeat_window: int = REPEAT_WINDOW) -> list[int]:
        """Prefill tokens, then up to n new ids (returned without the prompt) drawn by the C sampler
        (colibri_sample.h; the defaults are greedy: argmax, the first of equal maxima). The repetition
        penalty looks at the last `repeat_window` ids, prompt included. A stop id ends the generation
        and is the last id returned. on_token gets each id as it is drawn."""
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"n: a {type(n).__name__}, not a count of tokens")
        if n < 0:
            raise ValueError(f"n = {n}: a count of tokens is >= 0")
        sampler = Sampler(self._lib, self.vocab, temperature, top_k, top_p, min_p, repeat_penalty, seed, stop)
        history = [int(t) for t in token_ids(tokens)]
        out: list[int] = []
        logits = self.forward(tokens)
        for i in range(n):
            recent = history[-repeat_window:] if repeat_penalty != 1.0 and repeat_window > 0 else []
            nxt = sampler.next(logits, recent)
            out.append(nxt)
            history.append(nxt)
            if on_token is not None:
                on_token(nxt)
            if nxt in sampler.stop or i + 1 == n:
                break
            logits = self.forward([nxt])
        return out

    def _pieces(self, pieces: PieceDecoder | None) -> PieceDecoder:
        """The piece decoder: the given one, else the model's tokenizer's (token_piece)."""
        found = pieces or getattr(self, "token_piece", None)
        if found is None:
            raise ValueError("this model has no tokenizer: pass pieces= (a callable id -> (bytes, kind))")
        return found

    def _prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            tokenize = getattr(self, "tokenize", None)
            if tokenize is None:
                raise ValueError("this model has no tokenizer: give the prompt as token ids")
            return list(tokenize(prompt))
        return [int(t) for t in prompt]

    def generate_text(self, prompt: str | Sequence[int], max_tokens: int, temperature: float = 0.0, top_k: int = 0,
                      top_p: float = 1.0, min_p: float = 0.0, repeat_penalty: float = 1.0, seed: int = 0,
                      stop: Sequence[int] | None = None, on_text: Callable[[str], None] | None = None,
                      pieces: PieceDecoder | None = None) -> str:
        """generate(), decoded: the text of the new ids (a stop id's own text left out), streamed to on_text
        in whole characters as it is produced (sampling.Utf8Stream). prompt: text (needs the model's
        tokenizer) or token ids."""
        decode, stream, parts = self._pieces(pieces), Utf8Stream(), []
        stop_ids = frozenset(int(t) for t in stop or [])

        def emit(text: str) -> None:
            if text:
                parts.append(text)
                if on_text is not None:
                    on_text(text)

        def on_token(tok: int) -> None:
            if tok not in stop_ids:
                data, kind = decode(tok)
                emit(stream.feed(data, kind))

        self.generate(self._prompt_ids(prompt), max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, seed,
                      stop, on_token)
        emit(stream.flush())
        return "".join(parts)

    def chat(self, text: str, max_tokens: int = 128, **kw) -> str:
        """One user turn through the chat template's prefix and suffix (stored at export from
        tokenizer_config.json's chat_template, codegen/chat.py): generate_text over the ids of prefix,
        text and suffix. The template's own special tokens are parsed; the user's text never is (a
        "<|im_end|>" typed by the user stays text). Needs the tokenizer (`tokenize`) and the blob's chat
        strings (`chat_template_parts`: a (prefix, suffix) pair or a callable returning one)."""
        parts = getattr(self, "chat_template_parts", None)
        tokenize = getattr(self, "tokenize", None)
        if parts is None or tokenize is None:
            raise ValueError("this model has no chat template or no tokenizer (export found no chat_template)")
        prefix, suffix = parts() if callable(parts) else parts
        ids = [*tokenize(prefix), *tokenize(text, parse_special=False), *tokenize(suffix)]
        return self.generate_text(ids, max_tokens, **kw)


def _open_lib(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path.absolute()), mode=ctypes.RTLD_LOCAL)
    _declare(lib)
    return lib


def load(path: str | os.PathLike, runtime: str | os.PathLike | None = None) -> Model:
    """Load a model library (`libcolibri_<model>.so`, weights linked in) or a
    `model.bin` blob run by the generic `libcolibri.so` (found beside the blob,
    or given as `runtime`, or in $COLIBRI_RUNTIME)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if path.suffix == ".so" or ".so." in path.name:
        lib = _open_lib(path)
        if not hasattr(lib, "colibri_model_blob"):
            raise ValueError(f"{path}: not a colibri model library (no colibri_model_blob); "
                             "for the generic libcolibri.so pass the model.bin instead")
        lib.colibri_model_blob.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
        lib.colibri_model_blob.restype = ctypes.c_void_p
        n = ctypes.c_size_t()
        ptr = lib.colibri_model_blob(ctypes.byref(n))
        m = Model(lib, ptr, n.value, keepalive=(lib,))
        m._path = path
        return m
    candidates = [runtime, path.parent / "libcolibri.so", os.environ.get("COLIBRI_RUNTIME")]
    rt = next((Path(c) for c in candidates if c and Path(c).is_file()), None)
    if rt is None:
        raise FileNotFoundError(f"{path}: no generic runtime libcolibri.so beside it; pass runtime= "
                                "or set COLIBRI_RUNTIME")
    lib = _open_lib(rt)
    with open(path, "rb") as f:  # mapped read-only: the runtime never writes the blob
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(mm, dtype=np.uint8)
    m = Model(lib, view.ctypes.data, view.size, keepalive=(lib, mm, view))
    m._path = path
    return m


__all__ = ["ColibriError", "Model", "SampleError", "Sampler", "TokenError", "Utf8Stream", "load", "token_ids"]
