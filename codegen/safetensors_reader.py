"""A strict reader of one .safetensors file: header validated up front, tensors read lazily as float32.

Format: 8-byte little-endian header length N, N bytes of JSON, then the data section.
Each header entry gives dtype, shape and data_offsets [begin, end) relative to the data section.
We parse this ourselves because numpy has no bfloat16, and so that every defect of a
file becomes an ExportError naming it (and the tensor) instead of a crash deep in a library.
"""

from __future__ import annotations

import json
import math
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ExportError
from .safeio import check_depth, open_regular

# Byte size of every dtype the safetensors format defines; only some of them can be converted.
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
FLOAT_DTYPES = ("F32", "F16", "BF16")
MAX_HEADER_BYTES = 100_000_000  # the safetensors library refuses larger headers too

_NUMPY_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class SafetensorsFile:
    """The validated header of one safetensors file; `read` loads one tensor at a time."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._parse()

    def _fail(self, message: str, tensor: str | None = None) -> ExportError:
        return ExportError(self.path, message, tensor)

    def _read_header(self) -> tuple[bytes, int]:
        fd = open_regular(self.path, "safetensors file")  # a FIFO, device or directory: one line, no hang
        try:
            with os.fdopen(fd, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                prefix = f.read(8)
                if len(prefix) < 8:
                    raise self._fail(f"not a safetensors file: {size} bytes, too short for the 8-byte header length")
                n = int.from_bytes(prefix, "little")
                # Most other files give an absurd length; a real header cut short gives a sane one
                # and still starts with the '{' of its JSON.
                if n > MAX_HEADER_BYTES:
                    raise self._fail(f"not a safetensors file: header length {n} exceeds the "
                                     f"{MAX_HEADER_BYTES}-byte limit of the format")
                raw = f.read(n)
                if n > size - 8:
                    what = "truncated" if raw[:1] == b"{" else "not a safetensors file or truncated"
                    raise self._fail(f"{what}: header length {n} exceeds the {size - 8} bytes after "
                                     f"the length field")
        except OSError as e:
            raise self._fail(f"cannot read: {e.strerror or e}") from None
        if len(raw) != n:
            raise self._fail(f"truncated header: expected {n} bytes, read {len(raw)}")
        return raw, size - 8 - n

    def _parse(self) -> None:
        raw, data_len = self._read_header()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self._fail(f"not a safetensors file: header is not UTF-8 ({e.reason} at byte {e.start})") from None
        check_depth(text, self.path, "not a safetensors file: header")
        try:
            header = json.loads(text, object_pairs_hook=_reject_duplicates)
        except RecursionError:
            raise self._fail("not a safetensors file: header JSON nested too deeply") from None
        except ValueError as e:
            raise self._fail(f"not a safetensors file: invalid header JSON: {e}") from None
        if not isinstance(header, dict):
            raise self._fail("not a safetensors file: header is not a JSON object")
        meta = header.pop("__metadata__", {})
        if not isinstance(meta, dict):
            raise self._fail("header __metadata__ is not a JSON object")
        self.metadata = meta
        data_start = 8 + len(raw)
        spans: list[tuple[int, int, str]] = []
        for name, entry in header.items():
            info, begin, end = self._entry(name, entry, data_len, data_start)
            self.tensors[name] = info
            if end > begin:
                spans.append((begin, end, name))
        spans.sort()
        for (_, prev_end, prev), (begin, _, name) in zip(spans, spans[1:], strict=False):
            if begin < prev_end:
                raise self._fail(f"data offsets overlap those of tensor {prev}", name)

    def _entry(self, name: str, entry: Any, data_len: int, data_start: int) -> tuple[TensorInfo, int, int]:
        if not isinstance(entry, dict):
            raise self._fail("malformed header entry (not a JSON object)", name)
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str):
            raise self._fail(f"malformed header entry: dtype {dtype!r}", name)
        if dtype not in DTYPE_SIZES:
            raise self._fail(f"unknown dtype {dtype}", name)
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise self._fail(f"malformed header entry: shape {shape!r}", name)
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise self._fail(f"malformed header entry: data_offsets {offsets!r}", name)
        begin, end = offsets
        if end > data_len:
            raise self._fail(f"truncated: data_offsets [{begin}, {end}] run past the end of the data section "
                             f"({data_len} bytes)", name)
        expected = DTYPE_SIZES[dtype] * math.prod(shape)
        if expected >= 1 << 64:
            raise self._fail(f"shape {shape} of {dtype} is {expected} bytes, more than a 64-bit size can hold", name)
        if end - begin != expected:
            raise self._fail(f"byte length {end - begin} does not match dtype {dtype} x shape {shape} "
                             f"= {expected} bytes", name)
        return TensorInfo(name, dtype, tuple(shape), data_start + begin, end - begin), begin, end

    def read_u8(self, name: str) -> np.ndarray:
        """A U8 tensor (MXFP4 blocks and scales) as a new uint8 array."""
        info = self.tensors[name]
        if info.dtype != "U8":
            raise self._fail(f"dtype {info.dtype}, not U8", name)
        return self._read_into(name, np.empty(info.shape, dtype=np.uint8))

    def read(self, name: str, mapped: bool = False) -> np.ndarray:
        """The tensor as a new, writable float32 array (F32, F16 and BF16 only). With `mapped` an F32
        tensor is the file's pages themselves (a private mapping, copied only where written to), which
        holds a file descriptor while the array lives: for arrays used and dropped one at a time."""
        info = self.tensors[name]
        if info.dtype not in _NUMPY_DTYPES:
            raise self._fail(f"unsupported dtype {info.dtype} (accepted: {', '.join(FLOAT_DTYPES)})", name)
        if info.dtype == "F32":
            if mapped:
                return self._mapped(name).astype(np.float32, copy=False)
            return self._read_into(name, np.empty(info.shape, dtype="<f4")).astype(np.float32, copy=False)
        raw = self._mapped(name)  # widened into a new array below: the mapping goes with `raw`
        if info.dtype == "BF16":  # the bf16 bits are the high half of the f32's
            out = np.empty(info.shape, dtype=np.uint32)
            np.left_shift(raw.astype(np.uint16, copy=False), 16, out=out, dtype=np.uint32)
            return out.view(np.float32)
        return raw.astype(np.float32)

    def _mapped(self, name: str) -> np.ndarray:
        """The tensor's bytes as a private (copy-on-write) mapping of the file: a writable array whose
        writes never reach the file, without a copy of the pages it is only read from. Read into a new
        array instead when the data is not aligned to its dtype (or empty)."""
        info = self.tensors[name]
        dtype = _NUMPY_DTYPES[info.dtype]
        if info.nbytes == 0 or info.start % dtype.itemsize:
            return self._read_into(name, np.empty(info.shape, dtype=dtype))
        fd = open_regular(self.path, "safetensors file")
        try:
            size = os.fstat(fd).st_size
            if info.start + info.nbytes > size:
                raise self._fail(f"truncated: expected {info.nbytes} bytes of data, the file ends "
                                 f"{max(0, size - info.start)} bytes after its start", name)
            base = info.start - info.start % mmap.ALLOCATIONGRANULARITY
            buf = mmap.mmap(fd, info.start + info.nbytes - base, access=mmap.ACCESS_COPY, offset=base)
        except OSError as e:
            raise self._fail(f"cannot read: {e.strerror or e}", name) from None
        finally:
            os.close(fd)
        return np.frombuffer(buf, dtype=dtype, count=info.nbytes // dtype.itemsize,
                             offset=info.start - base).reshape(info.shape)

    def _read_into(self, name: str, out: np.ndarray) -> np.ndarray:
        """Fill `out` (a new array of the tensor's byte size) with the tensor's bytes as stored."""
        info = self.tensors[name]
        buf = memoryview(out.reshape(-1)).cast("B")
        fd = open_regular(self.path, "safetensors file")
        try:
            with os.fdopen(fd, "rb", buffering=0) as f:
                f.seek(info.start)
                got = 0
                while got < info.nbytes:
                    n = f.readinto(buf[got:])
                    if not n:
                        break
                    got += n
        except OSError as e:
            raise self._fail(f"cannot read: {e.strerror or e}", name) from None
        if got != info.nbytes:
            raise self._fail(f"truncated: expected {info.nbytes} bytes of data, read {got}", name)
        return out
