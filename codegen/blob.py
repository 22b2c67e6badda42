"""Writer for model.bin, the one blob format (runtime_c/FORMAT.md).

Tensors are written as they come, so an export holds one tensor in memory at a
time; the header and table go in last and the CRC-32 is taken over the file.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .plan import ArenaPlan, align_up
from .quantize import QuantTensor, encode_outliers
from .spec import ModelSpec

MAGIC = 0x52424C43
VERSION_MAJOR = 1
VERSION_MINOR = 0
HEADER_FIXED = 256
ENTRY_BYTES = 64
ALIGN = 64
ROW_ALIGN = 16
LAYOUT_ROWMAJOR16 = 1
FLAG_TIED = 1

KINDS = {
    "embed": 1,
    "rope_freq": 2,
    "attn_norm": 3,
    "attn.q": 4,
    "attn.k": 5,
    "attn.v": 6,
    "attn.o": 7,
    "ffn_norm": 8,
    "moe.router": 9,
    "gate": 10,
    "down": 11,
    "up": 12,
    "final_norm": 13,
    "lm_head": 14,
}
DTYPES = {"f32": 1, "f16": 2, "int8": 3, "int8c": 4}
ELEM_BYTES = {"f32": 4, "f16": 2, "int8": 1, "int8c": 1}
SCALE_DTYPES = {np.dtype(np.float32): 1, np.dtype(np.float16): 2}

_HEADER = struct.Struct("<IHHIIQII" + "I" * 11 + "ff" + "IQ" + "Q" * 11)
_ENTRY = struct.Struct("<HHHBBIIIIII" + "QQQQ")


def kind_of(name: str) -> tuple[int, int, int]:
    """(kind, layer, expert) of a canonical tensor name."""
    parts = name.split(".")
    if parts[0] != "layers":
        return KINDS[name], 0, 0
    layer = int(parts[1])
    if parts[2:4] == ["moe", "experts"]:
        return KINDS[parts[5]], layer, int(parts[4])
    return KINDS[".".join(parts[2:])], layer, 0


@dataclass(frozen=True)
class TensorRecord:
    name: str
    dtype: str
    rows: int
    cols: int
    offset: int  # first byte of the tensor's weights in the blob
    nbytes: int  # bytes from offset to the end of its last part (with inner padding)
    n_outliers: int


def header_bytes(n_tensors: int) -> int:
    return align_up(HEADER_FIXED + ENTRY_BYTES * n_tensors, ALIGN)


class BlobWriter:
    def __init__(self, f: BinaryIO, n_tensors: int):
        self.f = f
        self.n_tensors = n_tensors
        self.header_bytes = header_bytes(n_tensors)
        self.pos = self.header_bytes
        self.entries: list[bytes] = []
        self.records: list[TensorRecord] = []
        f.seek(self.pos)

    def _put(self, arr: np.ndarray) -> int:
        self.pos = align_up(self.pos, ALIGN)
        self.f.seek(self.pos)
        start = self.pos
        self.f.write(np.ascontiguousarray(arr).tobytes())
        self.pos += arr.nbytes
        return start

    def add(self, name: str, qt: QuantTensor) -> None:
        kind, layer, expert = kind_of(name)
        esize = ELEM_BYTES[qt.dtype]
        stride = align_up(qt.cols * esize, ROW_ALIGN)
        data = qt.data.reshape(qt.rows, qt.cols)
        if stride != qt.cols * esize:
            padded = np.zeros((qt.rows, stride // esize), dtype=data.dtype)
            padded[:, : qt.cols] = data
            data = padded
        data_off = self._put(data.astype(data.dtype.newbyteorder("<"), copy=False))
        scale_off = oidx_off = oval_off = n_out = 0
        scale_code = 0
        if qt.scales is not None:
            scale_code = SCALE_DTYPES[qt.scales.dtype]
            scale_off = self._put(qt.scales.astype(qt.scales.dtype.newbyteorder("<")))
        if qt.n_outliers:
            gaps, vals = encode_outliers(qt.oidx, qt.oval)
            n_out = gaps.size
            oidx_off = self._put(gaps)
            oval_off = self._put(vals)
        self.entries.append(
            _ENTRY.pack(
                kind, layer, expert, DTYPES[qt.dtype], scale_code, qt.rows, qt.cols, stride,
                qt.group_size or qt.cols, n_out, 0, data_off, scale_off, oidx_off, oval_off,
            )
        )
        self.records.append(
            TensorRecord(name, qt.dtype, qt.rows, qt.cols, data_off, self.pos - data_off, n_out)
        )

    def finish(self, spec: ModelSpec, max_seq: int, plan: ArenaPlan) -> tuple[int, int]:
        """Write header and table, pad to 64 bytes, stamp the CRC. Returns (blob_bytes, crc32)."""
        if len(self.entries) != self.n_tensors:
            raise AssertionError(f"blob has {len(self.entries)} tensors, expected {self.n_tensors}")
        blob_bytes = align_up(self.pos, ALIGN)
        self.f.truncate(blob_bytes)  # zero-extends up to the 64-byte boundary
        header = _HEADER.pack(
            MAGIC, VERSION_MAJOR, VERSION_MINOR, 0, self.header_bytes, blob_bytes, self.n_tensors,
            FLAG_TIED if spec.tied else 0, LAYOUT_ROWMAJOR16,
            spec.vocab, spec.hidden, spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.head_dim,
            spec.ffn, spec.n_experts, spec.top_k, max_seq,
            spec.rms_eps, spec.rope_theta, len(plan.buffers), plan.arena_bytes,
            *(b.offset for b in plan.buffers),
        )
        head = header.ljust(HEADER_FIXED, b"\0") + b"".join(self.entries)
        head = head.ljust(self.header_bytes, b"\0")
        self.f.seek(0)
        self.f.write(head)
        self.f.flush()
        crc = zlib.crc32(head[12:])
        self.f.seek(self.header_bytes)
        while chunk := self.f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
        self.f.seek(8)
        self.f.write(struct.pack("<I", crc))
        return blob_bytes, crc


def read_header(path: Path) -> dict:
    """The fixed header of a blob as a dict (for tests and `colibri inspect`)."""
    raw = Path(path).read_bytes()[: _HEADER.size]
    v = _HEADER.unpack(raw)
    keys = (
        "magic version_major version_minor crc32 header_bytes blob_bytes n_tensors flags layout "
        "vocab hidden n_layers n_heads n_kv_heads head_dim ffn n_experts top_k max_seq "
        "rms_eps rope_theta n_buffers arena_bytes"
    ).split()
    out = dict(zip(keys, v[: len(keys)], strict=True))
    out["buffer_offsets"] = list(v[len(keys) :])
    return out
