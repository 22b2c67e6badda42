"""An independent reader of model.bin, written from runtime_c/FORMAT.md alone.

Tests use it to get the exact weights the C runtime computes with, without
going through the exporter's own quantize/dequantize code.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

KIND_NAMES = {1: "embed", 2: "rope_freq", 3: "attn_norm", 4: "attn.q", 5: "attn.k", 6: "attn.v", 7: "attn.o",
              8: "ffn_norm", 9: "moe.router", 10: "gate", 11: "down", 12: "up", 13: "final_norm", 14: "lm_head",
              # DeepSeek-V2/V3: MLA attention, V3's router bias
              40: "attn.q_a", 41: "attn.q_a_norm", 42: "attn.q_b", 43: "attn.kv_a", 44: "attn.kv_a_norm",
              45: "attn.kv_b", 46: "moe.choice_bias",
              # format 1.1
              15: "attn.q_bias", 16: "attn.k_bias", 17: "attn.v_bias", 18: "attn.q_norm", 19: "attn.k_norm",
              20: "moe.shared_gate", 21: "moe.shared.gate", 22: "moe.shared.down", 23: "moe.shared.up",
              24: "mlp.gate", 25: "mlp.down", 26: "mlp.up",
              27: "tokenizer",  # the TOKENIZER flag: raw bytes (dtype 7, U8), the table's last entry
              28: "params",  # the PARAMS flag: raw bytes (U8) before the TOKENIZER entry
              # gpt-oss: ATTN_SINKS, O_BIAS, EXPERT_BIAS
              29: "attn.sinks", 30: "attn.o_bias", 31: "moe.router_bias", 32: "gate_bias", 33: "down_bias",
              34: "up_bias"}
EXPERT_KINDS = ("gate", "down", "up", "gate_bias", "down_bias", "up_bias")
TOKENIZER_FLAG, TOKENIZER_KIND, U8 = 1 << 9, 27, 7
PARAMS_FLAG, PARAMS_KIND = 1 << 10, 28
SECTION_KINDS = (TOKENIZER_KIND, PARAMS_KIND)
ELEM = {1: np.dtype("<f4"), 2: np.dtype("<f2"), 3: np.dtype("i1"), 4: np.dtype("i1"), 5: np.dtype("u1"),
        6: np.dtype("u1"), 8: np.dtype("<i2")}
INT4 = (5, 6)  # format 1.3: int4, int4c
INT16 = 8  # FORMAT.md "int16": row-major, one f32 scale a row, 14-bit activations
SCALE = {1: np.dtype("<f4"), 2: np.dtype("<f2")}
HEADER_FIELDS = [
    (0, "I", "magic"), (4, "H", "version_major"), (6, "H", "version_minor"), (8, "I", "crc32"),
    (12, "I", "header_bytes"), (16, "Q", "blob_bytes"), (24, "I", "n_tensors"), (28, "I", "flags"),
    (32, "I", "layout"), (36, "I", "vocab"), (40, "I", "hidden"), (44, "I", "n_layers"), (48, "I", "n_heads"),
    (52, "I", "n_kv_heads"), (56, "I", "head_dim"), (60, "I", "ffn"), (64, "I", "n_experts"),
    (68, "I", "top_k"), (72, "I", "max_seq"), (76, "f", "rms_eps"), (80, "f", "rope_theta"),
    (84, "I", "n_buffers"), (88, "Q", "arena_bytes"),
    # format 1.1
    (200, "I", "shared_ffn"), (204, "I", "dense_ffn"), (208, "f", "routed_scale"),
    # tokens of a prefill block (0: one)
    (212, "I", "prefill_block"),
    # format 1.2
    (248, "Q", "xq_offset"),
]


def header(raw: bytes) -> dict:
    return {name: struct.unpack_from("<" + fmt, raw, off)[0] for off, fmt, name in HEADER_FIELDS}


def entry_offset(i: int) -> int:
    return 256 + 64 * i


def entries(raw: bytes) -> list[dict]:
    h = header(raw)
    out = []
    for i in range(h["n_tensors"]):
        v = struct.unpack_from("<HHHBBIIIIIIQQQQ", raw, entry_offset(i))
        keys = ("kind", "layer", "expert", "dtype", "scale_dtype", "rows", "cols", "row_stride", "group_size",
                "n_outliers", "reserved", "data_off", "scale_off", "oidx_off", "oval_off")
        out.append(dict(zip(keys, v, strict=True)))
    return out


def canonical_name(e: dict) -> str:
    kind = KIND_NAMES[e["kind"]]
    if kind in EXPERT_KINDS:
        return f"layers.{e['layer']}.moe.experts.{e['expert']}.{kind}"
    if kind in ("embed", "rope_freq", "final_norm", "lm_head", "tokenizer", "params"):
        return kind
    return f"layers.{e['layer']}.{kind}"


def is_q8(raw: bytes, e: dict) -> bool:
    """FORMAT.md "Integer matmuls": a 1.2 blob with an xq buffer, an int8/int8c matrix, cols and group
    size multiples of 32."""
    h = header(raw)
    if e["dtype"] in INT4:  # format 1.3: int4 matrices have integer matmuls only
        return h["xq_offset"] != 0
    return (h["version_minor"] >= 2 and h["xq_offset"] != 0 and e["dtype"] in (3, 4)
            and e["cols"] % 32 == 0 and e["group_size"] % 32 == 0)


def is_tiled(raw: bytes, e: dict) -> bool:
    return e["dtype"] not in INT4 and is_q8(raw, e) and header(raw)["layout"] == 2


def unpack_int4(raw: bytes, e: dict) -> np.ndarray:
    """FORMAT.md "int4": per row and block of 32 columns, 16 bytes; byte i holds column i + 8 in its low
    nibble and column 16 + i + 8 in its high one (value = nibble - 8)."""
    rows, cols, stride = e["rows"], e["cols"], e["row_stride"]
    b = np.frombuffer(raw, dtype=np.uint8, count=rows * stride, offset=e["data_off"]).reshape(rows, stride)
    out = np.empty((rows, stride * 2), dtype=np.float32)
    for blk in range(stride // 16):
        part = b[:, 16 * blk: 16 * blk + 16].astype(np.int32)
        out[:, 32 * blk: 32 * blk + 16] = (part & 15) - 8
        out[:, 32 * blk + 16: 32 * blk + 32] = (part >> 4) - 8
    return out[:, :cols]


def dequantize(raw: bytes, e: dict) -> np.ndarray:
    dt = ELEM[e["dtype"]]
    rows, cols = e["rows"], e["cols"]
    tiled = is_tiled(raw, e)
    stored = -(-rows // 16) * 16 if tiled else rows
    stride_elems = e["row_stride"] // dt.itemsize
    data = np.frombuffer(raw, dtype=dt, count=stored * stride_elems, offset=e["data_off"])
    if tiled:  # tiles of 16 rows; per 4 columns, 4 bytes of each of the 16 rows
        data = data.reshape(stored // 16, cols // 4, 16, 4).transpose(0, 2, 1, 3).reshape(stored, cols)
    w = data.reshape(stored, stride_elems)[:rows, :cols].astype(np.float32)
    if e["dtype"] in INT4:
        w = unpack_int4(raw, e)
    if e["dtype"] in (3, 4, 5, 6, INT16):
        g = e["group_size"]
        n_groups = -(-cols // g)
        s = np.frombuffer(raw, dtype=SCALE[e["scale_dtype"]], count=stored * n_groups, offset=e["scale_off"])
        if tiled:  # per tile and group, the 16 rows' scales
            s = s.reshape(stored // 16, n_groups, 16).transpose(0, 2, 1)
        s = s.reshape(stored, n_groups)[:rows].astype(np.float32)
        w = w * s[:, np.arange(cols) // g]
    if e["n_outliers"]:
        n = e["n_outliers"]
        gaps = np.frombuffer(raw, dtype="<u2", count=n, offset=e["oidx_off"])
        idx = np.cumsum(gaps.astype(np.int64))
        val = np.frombuffer(raw, dtype="<f2", count=n, offset=e["oval_off"]).astype(np.float32)
        flat = w.reshape(-1)
        flat[idx] += val
    return w


class BlobWeights(dict):
    """Canonical name -> dequantized float32 weights, and what the reference needs to compute as the
    runtime does: which matrices take int8 activations (q8) and their int8c corrections."""

    def __init__(self, raw: bytes) -> None:
        super().__init__()
        self._q8: set[str] = set()
        self._q16: set[str] = set()
        self._corr: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for e in entries(raw):
            if e["kind"] in SECTION_KINDS:  # bytes, not weights
                continue
            name = canonical_name(e)
            w = dequantize(raw, e)
            self[name] = w[0] if e["rows"] == 1 and name.endswith(("norm", "rope_freq", "_bias", "sinks")) else w
            if is_q8(raw, e):
                self._q8.add(name)
            if e["dtype"] == INT16:
                self._q16.add(name)
            if e["n_outliers"]:
                n = e["n_outliers"]
                idx = np.cumsum(np.frombuffer(raw, dtype="<u2", count=n, offset=e["oidx_off"]).astype(np.int64))
                val = np.frombuffer(raw, dtype="<f2", count=n, offset=e["oval_off"]).astype(np.float32)
                self._corr[name] = (idx, val)

    def q8(self, name: str) -> bool:
        return name in self._q8

    def q16(self, name: str) -> bool:
        return name in self._q16

    def corrections(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        return self._corr.get(name)


def tokenizer_section(raw: bytes) -> bytes | None:
    """FORMAT.md "Tokenizer": with the TOKENIZER flag, the last table entry's rows bytes at data_off."""
    if not header(raw)["flags"] & TOKENIZER_FLAG:
        return None
    e = entries(raw)[-1]
    assert e["kind"] == TOKENIZER_KIND and e["dtype"] == U8 and e["cols"] == 1 and e["data_off"] % 64 == 0
    return raw[e["data_off"]:e["data_off"] + e["rows"]]


def params_records(raw: bytes) -> list[tuple[int, int, int]]:
    """FORMAT.md "Parameters": with the PARAMS flag, the PARAMS entry (the last but the TOKENIZER one)
    holds rows bytes at data_off: 8-byte records `u16 key, u16 index, u32 value`, little-endian, sorted by
    (key, index). Returns the (key, index, value bits) triples; [] without the flag."""
    h = header(raw)
    if not h["flags"] & PARAMS_FLAG:
        return []
    e = entries(raw)[-2 if h["flags"] & TOKENIZER_FLAG else -1]
    assert e["kind"] == PARAMS_KIND and e["dtype"] == U8 and e["cols"] == 1 and e["row_stride"] == 1
    assert e["rows"] > 0 and e["rows"] % 8 == 0 and e["data_off"] % 64 == 0
    data = raw[e["data_off"]:e["data_off"] + e["rows"]]
    recs = [struct.unpack_from("<HHI", data, i) for i in range(0, len(data), 8)]
    assert all((a[0], a[1]) < (b[0], b[1]) for a, b in zip(recs, recs[1:], strict=False)), "records sorted strictly"
    return recs


def param_f32(bits: int) -> float:
    """An f32 parameter's value from its record's u32 (its IEEE-754 bits)."""
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def weights(path: Path) -> BlobWeights:
    """Canonical name -> dequantized float32 weights (norms as vectors), with q8() and corrections()."""
    return BlobWeights(Path(path).read_bytes())
