"""Writer for model.bin, the one blob format (runtime_c/FORMAT.md).

Tensors are written as they come, so an export holds one tensor in memory at a
time; the header and table go in last and the CRC-32 is taken over the file.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from . import crc32
from . import format as fmt
from .format import ALIGN, ENTRY_BYTES, HEADER_BYTES, ROW_ALIGN, feature_flags
from .layout import is_q8, pack_int4, tile, tile_scales
from .plan import ArenaPlan, align_up
from .quantize import QuantTensor, encode_outliers
from .spec import ModelSpec

LAYOUT_ROWMAJOR16 = fmt.LAYOUTS["rows"]
SCALE_DTYPES = {np.dtype(np.float32): fmt.SCALE_DTYPES["f32"], np.dtype(np.float16): fmt.SCALE_DTYPES["f16"]}


def kind_of(name: str) -> tuple[int, int, int]:
    """(kind code, layer, expert) of a canonical tensor name."""
    kind, layer, expert = fmt.kind_of(name)
    return kind.code, layer, expert


@dataclass(frozen=True)
class TensorRecord:
    name: str
    dtype: str
    rows: int
    cols: int
    offset: int  # first byte of the tensor's weights in the blob
    nbytes: int  # bytes from offset to the end of its last part (with inner padding)
    n_outliers: int


def format_version(spec: ModelSpec, plan: ArenaPlan, int4: bool = False, tokenizer: bool = False) -> str:
    return f"{fmt.VERSION_MAJOR}.{format_minor(spec, plan, int4, tokenizer)}"


def dense_bitmap(spec: ModelSpec) -> bytes:
    bits = bytearray(fmt.H["dense_map"].count)
    for layer in spec.dense_layers:
        bits[layer // 8] |= 1 << (layer % 8)
    return bytes(bits)


def header_bytes(n_tensors: int) -> int:
    return align_up(HEADER_BYTES + ENTRY_BYTES * n_tensors, ALIGN)


def format_minor(spec: ModelSpec, plan: ArenaPlan, int4: bool = False, tokenizer: bool = False) -> int:
    return fmt.blob_minor(blob_flags(spec, plan, tokenizer), plan.buffers[-1].name == fmt.XQ_BUFFER.name, int4,
                          plan.prefill_block)


def blob_flags(spec: ModelSpec, plan: ArenaPlan, tokenizer: bool = False) -> int:
    """The header's flags: the model's features, the plan's KV cache precision, TOKENIZER with a section."""
    return feature_flags(spec) | fmt.KV_FLAG[plan.kv] | (fmt.FLAG["TOKENIZER"] if tokenizer else 0)


class BlobWriter:
    def __init__(self, f: BinaryIO, n_tensors: int, layout: str = "rows"):
        self.f = f
        self.layout = layout  # how q8 matrices are stored (codegen/layout.py); the rest is row-major
        self.n_tensors = n_tensors
        self.header_bytes = header_bytes(n_tensors)
        self.pos = self.header_bytes
        self.body_crc = 0  # zlib.crc32 of the blob from header_bytes to pos, summed as it is written
        self.entries: list[bytes] = []
        self.records: list[TensorRecord] = []
        self.int4 = False  # an int4/int4c tensor was written: format 1.3
        self.tokenizer = False  # the tokenizer section was written (the table's last entry)
        f.seek(self.pos)

    def _pad_to(self, pos: int) -> None:
        """Zeros up to pos (the file is zero-extended by the next write or finish's truncate)."""
        self.body_crc = zlib.crc32(bytes(pos - self.pos), self.body_crc)
        self.pos = pos

    def _put(self, arr: np.ndarray) -> int:
        self._pad_to(align_up(self.pos, ALIGN))
        self.f.seek(self.pos)
        start = self.pos
        data = memoryview(np.ascontiguousarray(arr)).cast("B")  # the array's own bytes, no copy
        self.f.write(data)
        self.body_crc = zlib.crc32(data, self.body_crc)
        self.pos += arr.nbytes
        return start

    def add(self, name: str, qt: QuantTensor) -> None:
        kind, layer, expert = kind_of(name)
        data = qt.data.reshape(qt.rows, qt.cols)
        scales = qt.scales
        int4 = qt.dtype in fmt.INT4_DTYPES
        self.int4 |= int4
        esize = 1 if int4 else fmt.ELEM_BYTES[qt.dtype]
        stride = fmt.int4_row_bytes(qt.cols) if int4 else align_up(qt.cols * esize, ROW_ALIGN)
        tiled = not int4 and self.layout == "tiled16" and is_q8(qt.dtype, qt.cols, qt.group_size)
        if int4:  # always row-major (FORMAT.md "int4")
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
        self.entries.append(fmt.pack_entry(
            kind=kind, layer=layer, expert=expert, dtype=fmt.DTYPES[qt.dtype], scale_dtype=scale_code,
            rows=qt.rows, cols=qt.cols, row_stride=stride, group_size=qt.group_size or qt.cols, n_outliers=n_out,
            data_off=data_off, scale_off=scale_off, oidx_off=oidx_off, oval_off=oval_off,
        ))
        self.records.append(
            TensorRecord(name, qt.dtype, qt.rows, qt.cols, data_off, self.pos - data_off, n_out)
        )

    def add_section(self, name: str, data: bytes) -> None:
        """A section of raw bytes after the weights (FORMAT.md "Parameters", "Tokenizer"): a U8 entry of
        len(data) rows."""
        kind, layer, expert = kind_of(name)
        if kind not in {fmt.KIND[k].code for k in fmt.SECTION_KINDS} or not data:
            raise AssertionError(f"{name}: not a non-empty section")
        data_off = self._put(np.frombuffer(data, dtype=np.uint8))
        self.tokenizer |= kind == fmt.KIND["TOKENIZER"].code
        self.entries.append(fmt.pack_entry(kind=kind, layer=layer, expert=expert, dtype=fmt.BYTES_DTYPE,
                                           rows=len(data), cols=1, row_stride=1, data_off=data_off))
        self.records.append(TensorRecord(name, "u8", len(data), 1, data_off, len(data), 0))

    def finish(self, spec: ModelSpec, max_seq: int, plan: ArenaPlan) -> tuple[int, int]:
        """Write header and table, pad to 64 bytes, stamp the CRC. Returns (blob_bytes, crc32)."""
        if len(self.entries) != self.n_tensors:
            raise AssertionError(f"blob has {len(self.entries)} tensors, expected {self.n_tensors}")
        blob_bytes = align_up(self.pos, ALIGN)
        self.f.truncate(blob_bytes)  # zero-extends up to the 64-byte boundary
        self._pad_to(blob_bytes)
        flags = blob_flags(spec, plan, self.tokenizer)
        minor = format_minor(spec, plan, self.int4, self.tokenizer)
        xq = plan.buffers[-1].offset if plan.buffers[-1].name == fmt.XQ_BUFFER.name else 0
        if self.int4 and not xq:
            raise AssertionError("int4 tensors need the integer-matmul plan (an xq buffer)")
        table = [b for b in plan.buffers if b.name != fmt.XQ_BUFFER.name]
        header = fmt.pack_header({
            "magic": fmt.MAGIC, "version_major": fmt.VERSION_MAJOR, "version_minor": minor,
            "header_bytes": self.header_bytes, "blob_bytes": blob_bytes, "n_tensors": self.n_tensors,
            "flags": flags, "layout": fmt.LAYOUTS[self.layout] if xq else LAYOUT_ROWMAJOR16,
            **{k: getattr(spec, k) for k in ("vocab", "hidden", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                                             "ffn", "n_experts", "top_k", "rms_eps", "rope_theta",
                                             "shared_ffn", "dense_ffn")},
            "max_seq": max_seq, "n_buffers": len(table), "arena_bytes": plan.arena_bytes,
            "buffer_offset": [b.offset for b in table],
            "routed_scale": spec.routed_scale if flags & fmt.FLAG["ROUTED_SCALE"] else 0.0,
            # 0 means 1 (every blob written before the field), so a block of 1 is written as 0
            "prefill_block": plan.prefill_block if plan.prefill_block > 1 else 0,
            "dense_map": dense_bitmap(spec), "xq_offset": xq,
        })
        head = header + b"".join(self.entries)
        head = head.ljust(self.header_bytes, b"\0")
        self.f.seek(0)
        self.f.write(head)
        crc = crc32.combine(zlib.crc32(head[fmt.CRC_FROM:]), self.body_crc, blob_bytes - self.header_bytes)
        crc_field = fmt.H["crc32"]
        self.f.seek(crc_field.offset)
        self.f.write(struct.pack(crc_field.fmt, crc))
        return blob_bytes, crc
