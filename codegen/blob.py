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

from .layout import INT4_DTYPES, LAYOUTS, int4_row_bytes, is_q8, pack_int4, tile, tile_scales
from .plan import ArenaPlan, align_up
from .quantize import QuantTensor, encode_outliers
from .spec import ModelSpec

MAGIC = 0x52424C43
VERSION_MAJOR = 1
VERSION_MINOR = 1  # written only when a 1.1 feature is used; a blob without one stays 1.0, byte for byte
VERSION_MINOR_Q8 = 2  # integer matmuls (an xq buffer, maybe tiled weights): always written as 1.2
VERSION_MINOR_INT4 = 3  # int4/int4c tensors (dtypes 5, 6): written as 1.3
HEADER_FIXED = 256
ENTRY_BYTES = 64
ALIGN = 64
ROW_ALIGN = 16
LAYOUT_ROWMAJOR16 = LAYOUTS["rows"]
FLAG_TIED = 1
# 1.1 feature flags (FORMAT.md "Feature flags")
FLAG_QKV_BIAS = 1 << 1
FLAG_QK_NORM_HEAD = 1 << 2
FLAG_QK_NORM_FULL = 1 << 3
FLAG_TOPK_NO_NORM = 1 << 4
FLAG_SHARED_EXPERT = 1 << 5
FLAG_SHARED_GATE = 1 << 6
FLAG_DENSE_LAYERS = 1 << 7
FLAG_ROUTED_SCALE = 1 << 8
DENSE_BITMAP_BYTES = 32

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
    "attn.q_bias": 15,
    "attn.k_bias": 16,
    "attn.v_bias": 17,
    "attn.q_norm": 18,
    "attn.k_norm": 19,
    "moe.shared_gate": 20,
    "shared.gate": 21,
    "shared.down": 22,
    "shared.up": 23,
    "mlp.gate": 24,
    "mlp.down": 25,
    "mlp.up": 26,
}
DTYPES = {"f32": 1, "f16": 2, "int8": 3, "int8c": 4, "int4": 5, "int4c": 6}
ELEM_BYTES = {"f32": 4, "f16": 2, "int8": 1, "int8c": 1}  # int4: two a byte (layout.pack_int4)
SCALE_DTYPES = {np.dtype(np.float32): 1, np.dtype(np.float16): 2}

_HEADER = struct.Struct("<IHHIIQII" + "I" * 11 + "ff" + "IQ" + "Q" * 11)
_HEADER_11 = struct.Struct("<QQIIfI32sQ")  # at offset 184: buffer_offset[11..12], shared_ffn, dense_ffn,
_HEADER_11_OFFSET = 184                     # routed_scale, prefill block, dense-layer bitmap, 1.2: xq offset
TABLE_ENTRY = struct.Struct("<HHHBBIIIIII" + "QQQQ")


def kind_of(name: str) -> tuple[int, int, int]:
    """(kind, layer, expert) of a canonical tensor name."""
    parts = name.split(".")
    if parts[0] != "layers":
        return KINDS[name], 0, 0
    layer = int(parts[1])
    if parts[2:4] == ["moe", "experts"]:
        return KINDS[parts[5]], layer, int(parts[4])
    if parts[2:4] == ["moe", "shared"]:
        return KINDS["shared." + parts[4]], layer, 0
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


def feature_flags(spec: ModelSpec) -> int:
    """Header flags of a spec: bit 0 tied, the rest the 1.1 features (0 beyond bit 0 for Mixtral)."""
    return ((FLAG_TIED if spec.tied else 0)
            | (FLAG_QKV_BIAS if spec.qkv_bias else 0)
            | (FLAG_QK_NORM_HEAD if spec.qk_norm == "head" else 0)
            | (FLAG_QK_NORM_FULL if spec.qk_norm == "full" else 0)
            | (0 if spec.norm_topk_prob else FLAG_TOPK_NO_NORM)
            | (FLAG_SHARED_EXPERT if spec.shared_ffn else 0)
            | (FLAG_SHARED_GATE if spec.shared_gate else 0)
            | (FLAG_DENSE_LAYERS if spec.dense_layers else 0)
            | (FLAG_ROUTED_SCALE if spec.routed_scale != 1.0 else 0))


def format_version(spec: ModelSpec, plan: ArenaPlan, int4: bool = False) -> str:
    return f"{VERSION_MAJOR}.{format_minor(spec, plan, int4)}"


def dense_bitmap(spec: ModelSpec) -> bytes:
    bits = bytearray(DENSE_BITMAP_BYTES)
    for layer in spec.dense_layers:
        bits[layer // 8] |= 1 << (layer % 8)
    return bytes(bits)


def header_bytes(n_tensors: int) -> int:
    return align_up(HEADER_FIXED + ENTRY_BYTES * n_tensors, ALIGN)


def format_minor(spec: ModelSpec, plan: ArenaPlan, int4: bool = False) -> int:
    if int4:
        return VERSION_MINOR_INT4
    if plan.buffers[-1].name == "xq":
        return VERSION_MINOR_Q8
    return VERSION_MINOR if feature_flags(spec) & ~FLAG_TIED else 0


class BlobWriter:
    def __init__(self, f: BinaryIO, n_tensors: int, layout: str = "rows"):
        self.f = f
        self.layout = layout  # how q8 matrices are stored (codegen/layout.py); the rest is row-major
        self.n_tensors = n_tensors
        self.header_bytes = header_bytes(n_tensors)
        self.pos = self.header_bytes
        self.entries: list[bytes] = []
        self.records: list[TensorRecord] = []
        self.int4 = False  # an int4/int4c tensor was written: format 1.3
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
        data = qt.data.reshape(qt.rows, qt.cols)
        scales = qt.scales
        int4 = qt.dtype in INT4_DTYPES
        self.int4 |= int4
        esize = 1 if int4 else ELEM_BYTES[qt.dtype]
        stride = int4_row_bytes(qt.cols) if int4 else align_up(qt.cols * esize, ROW_ALIGN)
        tiled = not int4 and self.layout == "tiled16" and is_q8(qt.dtype, qt.cols, qt.group_size)
        if int4:
            data = pack_int4(data)
        elif tiled:
            data, scales = tile(data), tile_scales(scales)
        elif stride != qt.cols * esize:
            padded = np.zeros((qt.rows, stride // esize), dtype=data.dtype)
            padded[:, : qt.cols] = data
            data = padded
        data_off = self._put(data.astype(data.dtype.newbyteorder("<"), copy=False))
        scale_off = oidx_off = oval_off = n_out = 0
        scale_code = 0
        if scales is not None:
            scale_code = SCALE_DTYPES[scales.dtype]
            scale_off = self._put(scales.astype(scales.dtype.newbyteorder("<")))
        if qt.n_outliers:
            gaps, vals = encode_outliers(qt.oidx, qt.oval)
            n_out = gaps.size
            oidx_off = self._put(gaps)
            oval_off = self._put(vals)
        self.entries.append(
            TABLE_ENTRY.pack(
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
        flags = feature_flags(spec)
        minor = format_minor(spec, plan, self.int4)
        xq = plan.buffers[-1].offset if plan.buffers[-1].name == "xq" else 0
        if self.int4 and not xq:
            raise AssertionError("int4 tensors need the integer-matmul plan (an xq buffer)")
        table = [b for b in plan.buffers if b.name != "xq"]
        header = _HEADER.pack(
            MAGIC, VERSION_MAJOR, minor, 0, self.header_bytes, blob_bytes, self.n_tensors,
            flags, LAYOUTS[self.layout] if xq else LAYOUT_ROWMAJOR16,
            spec.vocab, spec.hidden, spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.head_dim,
            spec.ffn, spec.n_experts, spec.top_k, max_seq,
            spec.rms_eps, spec.rope_theta, len(table), plan.arena_bytes,
            *(b.offset for b in table[:11]),
        )
        # the prefill block (at 212) is written whenever it is not 1; 0 there means 1 (all older blobs)
        block = plan.prefill_block if plan.prefill_block > 1 else 0
        if minor or block:
            extra = [b.offset for b in table[11:]]
            extra += [0] * (2 - len(extra))
            header += _HEADER_11.pack(*extra, spec.shared_ffn, spec.dense_ffn,
                                      spec.routed_scale if flags & FLAG_ROUTED_SCALE else 0.0, block,
                                      dense_bitmap(spec), xq)
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
    raw = Path(path).read_bytes()[:HEADER_FIXED]
    b11, b12, shared_ffn, dense_ffn, scale, block, bitmap, xq = _HEADER_11.unpack_from(raw, _HEADER_11_OFFSET)
    out["buffer_offsets"] += [b11, b12][: max(0, out["n_buffers"] - 11)]
    out.update(shared_ffn=shared_ffn, dense_ffn=dense_ffn, prefill_block=max(block, 1), xq_offset=xq,
               routed_scale=scale if out["flags"] & FLAG_ROUTED_SCALE else 1.0,
               dense_layers=[i for i in range(8 * DENSE_BITMAP_BYTES) if bitmap[i // 8] >> (i % 8) & 1])
    return out
