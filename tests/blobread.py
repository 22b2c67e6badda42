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
              # format 1.1
              15: "attn.q_bias", 16: "attn.k_bias", 17: "attn.v_bias", 18: "attn.q_norm", 19: "attn.k_norm",
              20: "moe.shared_gate", 21: "moe.shared.gate", 22: "moe.shared.down", 23: "moe.shared.up",
              24: "mlp.gate", 25: "mlp.down", 26: "mlp.up"}
ELEM = {1: np.dtype("<f4"), 2: np.dtype("<f2"), 3: np.dtype("i1"), 4: np.dtype("i1")}
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
    if kind in ("gate", "down", "up"):
        return f"layers.{e['layer']}.moe.experts.{e['expert']}.{kind}"
    if kind in ("embed", "rope_freq", "final_norm", "lm_head"):
        return kind
    return f"layers.{e['layer']}.{kind}"


def dequantize(raw: bytes, e: dict) -> np.ndarray:
    dt = ELEM[e["dtype"]]
    rows, cols = e["rows"], e["cols"]
    stride_elems = e["row_stride"] // dt.itemsize
    data = np.frombuffer(raw, dtype=dt, count=rows * stride_elems, offset=e["data_off"])
    w = data.reshape(rows, stride_elems)[:, :cols].astype(np.float32)
    if e["dtype"] in (3, 4):
        g = e["group_size"]
        n_groups = -(-cols // g)
        s = np.frombuffer(raw, dtype=SCALE[e["scale_dtype"]], count=rows * n_groups, offset=e["scale_off"])
        s = s.reshape(rows, n_groups).astype(np.float32)
        w = w * s[:, np.arange(cols) // g]
    if e["n_outliers"]:
        n = e["n_outliers"]
        gaps = np.frombuffer(raw, dtype="<u2", count=n, offset=e["oidx_off"])
        idx = np.cumsum(gaps.astype(np.int64))
        val = np.frombuffer(raw, dtype="<f2", count=n, offset=e["oval_off"]).astype(np.float32)
        flat = w.reshape(-1)
        flat[idx] += val
    return w


def weights(path: Path) -> dict[str, np.ndarray]:
    """Canonical name -> dequantized float32 weights (norms as vectors)."""
    raw = Path(path).read_bytes()
    out = {}
    for e in entries(raw):
        name = canonical_name(e)
        w = dequantize(raw, e)
        out[name] = w[0] if e["rows"] == 1 and name.endswith(("norm", "rope_freq", "_bias")) else w
    return out
