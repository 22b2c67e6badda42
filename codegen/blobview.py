"""Dequantized weights read back from a written model.bin: the float32 matrices the C kernels compute with.

The exporter's error probe reads the approximate weights from here, one tensor at a time, instead of
keeping a dequantized copy of the model in memory.
"""

from __future__ import annotations

import numpy as np

from . import format as fmt
from .layout import is_q8, padded_rows, unpack_int4, untile, untile_scales
from .spec import ModelSpec, canonical_shape

_NP_DTYPES = {"f32": np.dtype("<f4"), "f16": np.dtype("<f2"), "int8": np.dtype("i1"), "int8c": np.dtype("i1"),
             "int4": np.dtype("u1"), "int4c": np.dtype("u1"), "int16": np.dtype("<i2")}
_SCALE_DTYPES = {fmt.SCALE_DTYPES["f32"]: np.dtype("<f4"), fmt.SCALE_DTYPES["f16"]: np.dtype("<f2")}


class BlobWeights:
    """`get(name)` decodes one tensor of a blob (bytes, or an mmap of model.bin) as a new float32 array,
    in its canonical shape; `names` are the tensors in table order (the order they were written)."""

    def __init__(self, buf: bytes | memoryview, names: list[str], spec: ModelSpec) -> None:
        self.buf = buf
        self.spec = spec
        self.entries = {name: fmt.entry(buf, i) for i, name in enumerate(names)}
        h = fmt.read_header(buf)
        self.q8_blob = h["version_minor"] >= fmt.MINOR_INT8_ACTS and h["xq_offset"] != 0  # int4 implies it
        self.tiled = self.q8_blob and h["layout"] == fmt.LAYOUTS["tiled16"]

    def q8(self, name: str) -> bool:
        """Whether the runtime multiplies this matrix with int8 activations (FORMAT.md "Integer matmuls")."""
        e = self.entries.get(name)
        return e is not None and self.q8_blob and is_q8(fmt.DTYPE_NAMES[e["dtype"]], e["cols"], e["group_size"])

    def q16(self, name: str) -> bool:
        """Whether the runtime multiplies this matrix with 14-bit activations (FORMAT.md "int16")."""
        e = self.entries.get(name)
        return e is not None and fmt.DTYPE_NAMES.get(e["dtype"]) == "int16"

    def corrections(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The int8c corrections as (flat index, f32 value), or None."""
        e = self.entries.get(name)
        if e is None or not e["n_outliers"]:
            return None
        return self._outliers(e)

    def _outliers(self, e: dict) -> tuple[np.ndarray, np.ndarray]:
        n = e["n_outliers"]
        gaps = np.frombuffer(self.buf, "<u2", n, e["oidx_off"]).astype(np.int64)
        return np.cumsum(gaps), np.frombuffer(self.buf, "<f2", n, e["oval_off"]).astype(np.float32)

    def get(self, name: str) -> np.ndarray | None:
        if name not in self.entries:
            return None
        e = self.entries[name]
        rows, cols, stride, group = e["rows"], e["cols"], e["row_stride"], e["group_size"]
        dtype = fmt.DTYPE_NAMES[e["dtype"]]
        int4 = dtype in fmt.INT4_DTYPES
        esize = 1 if int4 else fmt.ELEM_BYTES[dtype]
        tiled = self.tiled and not int4 and is_q8(dtype, cols, group)
        stored = padded_rows(rows) if tiled else rows
        data = np.frombuffer(self.buf, _NP_DTYPES[dtype], stored * stride // esize, e["data_off"])
        if int4:
            data = unpack_int4(data.reshape(rows, stride), rows, cols)
        else:
            data = untile(data, rows, cols) if tiled else data.reshape(rows, stride // esize)[:, :cols]
        if dtype in ("f32", "f16"):
            w = data.astype(np.float32)
        else:
            n_groups = -(-cols // group)
            scales = np.frombuffer(self.buf, _SCALE_DTYPES[e["scale_dtype"]], stored * n_groups, e["scale_off"])
            scales = untile_scales(scales, rows, n_groups) if tiled else scales.reshape(rows, n_groups)
            s = np.repeat(scales.astype(np.float32), group, axis=1)[:, :cols]
            w = s * data.astype(np.float32)
            if e["n_outliers"]:
                idx, vals = self._outliers(e)
                w.reshape(-1)[idx] += vals  # filler entries add 0.0 and never repeat an index
        shape = (rows, cols) if name == "rope_freq" else canonical_shape(self.spec, name)
        return w.reshape(shape)
