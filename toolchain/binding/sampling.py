"""The sampler (runtime_c/include/colibri_sample.h, the C implementation through ctypes) and the streaming
UTF-8 assembler of the binding (the same rules as colibri_utf8, in Python).

Text streaming takes a token's bytes from a *piece decoder*: a callable id -> (bytes, kind), kind
TEXT (0: the token's own bytes, complete or part of a character) or BYTE (1: a byte-fallback token
<0xXX>, its one byte). The tokenizer's decode-one-id gives it; until then a caller passes its own.
"""

from __future__ import annotations

import codecs
import ctypes
from collections.abc import Callable, Sequence

import numpy as np

TEXT, BYTE = 0, 1
PieceDecoder = Callable[[int], tuple[bytes, int]]
REPEAT_WINDOW = 64  # recent ids the repetition penalty looks at (prompt included), as llama.cpp's default


class SampleParams(ctypes.Structure):
    _fields_ = [
        ("temperature", ctypes.c_float),
        ("top_k", ctypes.c_uint32),
        ("top_p", ctypes.c_float),
        ("min_p", ctypes.c_float),
        ("repeat_penalty", ctypes.c_float),
        ("seed", ctypes.c_uint64),
        ("stop_ids", ctypes.POINTER(ctypes.c_int32)),
        ("n_stop", ctypes.c_size_t),
    ]


class _SamplerState(ctypes.Structure):
    _fields_ = [("params", SampleParams), ("state", ctypes.c_uint64)]


def declare(lib: ctypes.CDLL) -> bool:
    """Declares the colibri_sample_* entry points; False when the library has none (an older build)."""
    if not hasattr(lib, "colibri_sample_next"):
        return False
    p, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.colibri_sample_init.argtypes = [ctypes.POINTER(_SamplerState), ctypes.POINTER(SampleParams)]
    lib.colibri_sample_next.argtypes = [ctypes.POINTER(_SamplerState), ctypes.POINTER(ctypes.c_float), sz,
                                        ctypes.POINTER(ctypes.c_int32), sz, p, sz, ctypes.POINTER(ctypes.c_int32)]
    lib.colibri_sample_penalize.argtypes = [ctypes.POINTER(ctypes.c_float), sz, ctypes.POINTER(ctypes.c_int32), sz,
                                            ctypes.c_float, ctypes.POINTER(ctypes.c_float)]
    lib.colibri_sample_rand.argtypes = [ctypes.POINTER(_SamplerState)]
    lib.colibri_sample_rand.restype = ctypes.c_uint64
    for fn in ("colibri_sample_init", "colibri_sample_next", "colibri_sample_penalize"):
        getattr(lib, fn).restype = ctypes.c_int
    return True


class SampleError(ValueError):
    """A sampling parameter or input the C sampler refused."""

    def __init__(self, status: int, what: str):
        super().__init__(f"{what} (status {status})")
        self.status = status


class Sampler:
    """One colibri_sampler: its PRNG advances with every draw at temperature > 0."""

    def __init__(self, lib: ctypes.CDLL, vocab: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0, repeat_penalty: float = 1.0, seed: int = 0, stop: Sequence[int] | None = None):
        if not declare(lib):
            raise SampleError(18, "this runtime library has no sampler (colibri_sample_next)")
        if not 0 <= top_k < 1 << 32 or not 0 <= seed < 1 << 64:
            raise SampleError(18, f"top_k {top_k} or seed {seed} out of range")
        self._lib, self.vocab = lib, vocab
        self._stop = np.ascontiguousarray(list(stop or []), dtype=np.int32)
        params = SampleParams(temperature, top_k, top_p, min_p, repeat_penalty, seed,
                              self._stop.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), self._stop.size)
        self._s = _SamplerState()
        st = lib.colibri_sample_init(ctypes.byref(self._s), ctypes.byref(params))
        if st:
            raise SampleError(st, f"bad sampling parameters: temperature={temperature} top_k={top_k} top_p={top_p} "
                                  f"min_p={min_p} repeat_penalty={repeat_penalty}")
        self._scratch = np.zeros(2 * vocab, dtype=np.float32)
        self.stop = frozenset(int(t) for t in self._stop)

    def next(self, logits: np.ndarray, recent: Sequence[int] = ()) -> int:
        lg = np.ascontiguousarray(logits, dtype=np.float32)
        rc = np.ascontiguousarray(recent, dtype=np.int32)
        out = ctypes.c_int32()
        st = self._lib.colibri_sample_next(
            ctypes.byref(self._s), lg.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), lg.size,
            rc.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), rc.size, self._scratch.ctypes.data,
            self._scratch.nbytes, ctypes.byref(out))
        if st:
            raise SampleError(st, "colibri_sample_next refused its input (NaN/+inf logits, all -inf, or a recent id "
                                  "outside the vocabulary)")
        return out.value

    def penalize(self, logits: np.ndarray, recent: Sequence[int], penalty: float) -> np.ndarray:
        """Step 1 alone (colibri_sample_penalize): the logits penalised for the ids in recent."""
        lg = np.ascontiguousarray(logits, dtype=np.float32)
        rc = np.ascontiguousarray(recent, dtype=np.int32)
        out = np.empty_like(lg)
        fp = ctypes.POINTER(ctypes.c_float)
        st = self._lib.colibri_sample_penalize(lg.ctypes.data_as(fp), lg.size,
                                               rc.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), rc.size,
                                               penalty, out.ctypes.data_as(fp))
        if st:
            raise SampleError(st, "colibri_sample_penalize refused its input")
        return out

    def rand(self) -> int:
        return int(self._lib.colibri_sample_rand(ctypes.byref(self._s)))


class Utf8Stream:
    """Bytes in, whole characters out; invalid bytes become U+FFFD as HF tokenizers' decoders make them
    (colibri_sample.h: TEXT bytes as String::from_utf8_lossy, runs of BYTE bytes as ByteFallback:
    the whole run as is when it is well-formed, else one U+FFFD per byte). No length limit on a run."""

    def __init__(self) -> None:
        self._lossy = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._run = bytearray()

    def _close_run(self) -> str:
        run, self._run = bytes(self._run), bytearray()
        try:
            return run.decode("utf-8")
        except UnicodeDecodeError:
            return "\ufffd" * len(run)

    def feed(self, data: bytes, kind: int = TEXT) -> str:
        if kind == BYTE:
            out = self._lossy.decode(b"", final=True)  # a text piece's incomplete tail: one U+FFFD
            self._lossy.reset()
            self._run += data
            return out
        return (self._close_run() if self._run else "") + self._lossy.decode(data)

    def flush(self) -> str:
        out = self._lossy.decode(b"", final=True) + (self._close_run() if self._run else "")
        self._lossy.reset()
        return out
