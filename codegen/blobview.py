"""Dequantized weights read back from a written model.bin: the float32 matrices the C kernels compute with.

The exporter's error probe reads the approximate weights from here, one tensor at a time, instead of
keeping a dequantized copy of the model in memory.
"""

from __future__ import annotations

import struct

import numpy as np

from .blob import DTYPES, ELEM_BYTES, HEADER_FIXED, TABLE_ENTRY
from .layout import INT4_DTYPES, LAYOUTS, is_q8, padded_rows, unpack_int4, untile, untile_scales
from .spec import ModelSpec, canonical_shape

_NP_DTYPES = {"f32": np.dtype("<f4"), "f16": np.dtype("<f2"), "int8": np.dtype("i1"), "int8c": np.dtype("i1"),
             "int4": np.dtype("u1"), "int4c": np.dtype("u1")}
_SCALE_DTYPES = {1: np.dtype("<f4"), 2: np.dtype("<f2")}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class BlobWeights:
    """`get(name)` decodes one tensor of a blob (bytes, or an mmap of model.bin) as a new float32 array,
    in its canonical shape; `names` are the tensors in table order (the order they were written)."""

    def __init__(self, buf: bytes | memoryview, names: list[str], spec: ModelSpec) -> None:
        self.buf = buf
        self.spec = spec
        self.entries = {name: TABLE_ENTRY.unpack_from(buf, HEADER_FIXED + i * TABLE_ENTRY.size)
                        for i, name in enumerate(names)}
        minor, layout = struct.unpack_from("<H", buf, 6)[0], struct.unpack_from("<I", buf, 32)[0]
        self.q8_blob = minor >= 2 and struct.unpack_from("<Q", buf, 248)[0] != 0
        self.tiled = self.q8_blob and layout == LAYOUTS["tiled16"]

    def q8(self, name: str) -> bool:
        """Whether the runtime multiplies this matrix with int8 activations (FORMAT.md "Integer matmuls")."""
        e = self.entries.get(name)
        return e is not None and self.q8_blob and is_q8(_DTYPE_NAMES[e[3]], e[6], e[8])

    def corrections(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The int8c corrections as (flat index, f32 value), or None."""
        e = self.entries.get(name)
        if e is None or not e[9]:
            return None
        gaps = np.frombuffer(self.buf, "<u2", e[9], e[13]).astype(np.int64)
        return np.cumsum(gaps), np.frombuffer(self.buf, "<f2", e[9], e[14]).astype(np.float32)

    def get(self, name: str) -> np.ndarray | None:
        if name not in self.entries:
            return None
        (_, _, _, dtype_code, scale_code, rows, cols, stride, group, n_out, _,
         data_off, scale_off, oidx_off, oval_off) = self.entries[name]
        dtype = _DTYPE_NAMES[dtype_code]
        int4 = dtype in INT4_DTYPES
        esize = 1 if int4 else ELEM_BYTES[dtype]
        tiled = self.tiled and not int4 and is_q8(dtype, cols, group)
        stored = padded_rows(rows) if tiled else rows
        data = np.frombuffer(self.buf, _NP_DTYPES[dtype], stored * stride // esize, data_off)
        if int4:
            data = unpack_int4(data, rows, cols)
        else:
            data = untile(data, rows, cols) if tiled else data.reshape(rows, stride // esize)[:, :cols]
        if dtype in ("f32", "f16"):
            w = data.astype(np.float32)
        else:
            n_groups = -(-cols // group)
            scales = np.frombuffer(self.buf, _SCALE_DTYPES[scale_code], stored * n_groups, scale_off)
            scales = untile_scales(scales, rows, n_groups) if tiled else scales.reshape(rows, n_groups)
            s = np.repeat(scales.astype(np.float32), group, axis=1)[:, :cols]
            w = s * data.astype(np.float32)
            if n_out:
                gaps = np.frombuffer(self.buf, "<u2", n_out, oidx_off).astype(np.int64)
                vals = np.frombuffer(self.buf, "<f2", n_out, oval_off).astype(np.float32)
                w.reshape(-1)[np.cumsum(gaps)] += vals  # filler entries add 0.0 and never repeat an index
        shape = (rows, cols) if name == "rope_freq" else canonical_shape(self.spec, name)
        return w.reshape(shape)
