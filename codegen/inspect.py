"""`colibri inspect CKPT_OR_BLOB`: what a checkpoint or a model.bin holds, without running it.

For a checkpoint directory: family, dims, features, parameter counts (total, and active per token: all
but the experts a token is not routed to) and per-expert sizes in the source dtype. For a blob: the same
from its header, plus format version, quantization of its tensors, per-expert bytes and CRC status.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections import Counter, defaultdict
from pathlib import Path

from .blob import ENTRY_BYTES, HEADER_FIXED, KINDS, MAGIC, TABLE_ENTRY, read_header
from .errors import ExportError
from .layout import LAYOUTS
from .spec import ModelSpec

_DTYPE_NAMES = {1: "f32", 2: "f16", 3: "int8", 4: "int8c", 5: "int4", 6: "int4c"}
_KIND_NAMES = {v: k for k, v in KINDS.items()}
_SOURCE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


def _features(spec: ModelSpec) -> list[str]:
    out = []
    if spec.qkv_bias:
        out.append("q/k/v biases")
    if spec.qk_norm != "none":
        out.append(f"q/k RMSNorm ({'per head' if spec.qk_norm == 'head' else 'whole projection'})")
    out.append(f"norm_topk_prob {'true' if spec.norm_topk_prob else 'false'}")
    if spec.routed_scale != 1.0:
        out.append(f"routed scale {spec.routed_scale:g}")
    if spec.shared_ffn:
        out.append(f"shared expert ffn {spec.shared_ffn}{' (sigmoid gate)' if spec.shared_gate else ''}")
    if spec.dense_layers:
        out.append(f"dense MLP ffn {spec.dense_ffn} in layers {list(spec.dense_layers)}")
    if spec.tied:
        out.append("tied lm_head")
    return out


def _spec_summary(spec: ModelSpec) -> dict:
    expert = 3 * spec.hidden * spec.ffn
    return {
        "family": spec.arch,
        "dims": {k: getattr(spec, k) for k in ("vocab", "hidden", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                                               "ffn", "n_experts", "top_k", "max_position")},
        "features": _features(spec),
        "params_total": spec.param_count(),
        "params_active_per_token": spec.active_param_count(),
        "moe_layers": len(spec.moe_layers),
        "params_per_expert": expert,
    }


def inspect_checkpoint(path: Path) -> dict:
    from .checkpoint import open_checkpoint

    ckpt = open_checkpoint(path)
    out = {"kind": "checkpoint", "path": str(path), **_spec_summary(ckpt.spec)}
    dtypes = Counter(ckpt.source_dtypes.values())
    out["source_dtypes"] = dict(dtypes)
    first = next((n for n in ckpt.names() if ".experts." in n), None)
    if first is not None:
        item = _SOURCE_BYTES.get(ckpt.source_dtypes[first], 4)
        out["bytes_per_expert"] = out["params_per_expert"] * item
    return out


def _spec_from_header(h: dict) -> ModelSpec:
    flags = h["flags"]
    return ModelSpec(
        arch="mixtral" if not flags & ~1 else "qwen2_moe" if flags & 2 else "qwen3_moe" if flags & 4
        else "olmoe" if flags & 8 else "deepseek",
        vocab=h["vocab"], hidden=h["hidden"], n_layers=h["n_layers"], n_heads=h["n_heads"],
        n_kv_heads=h["n_kv_heads"], head_dim=h["head_dim"], ffn=h["ffn"], n_experts=h["n_experts"], top_k=h["top_k"],
        rms_eps=h["rms_eps"] or 1e-6, rope_theta=h["rope_theta"] or 1e4, tied=bool(flags & 1),
        max_position=h["max_seq"], qkv_bias=bool(flags & 2),
        qk_norm="head" if flags & 4 else "full" if flags & 8 else "none", norm_topk_prob=not flags & 16,
        routed_scale=h["routed_scale"], shared_ffn=h["shared_ffn"], shared_gate=bool(flags & 64),
        dense_ffn=h["dense_ffn"], dense_layers=tuple(h["dense_layers"]),
    )


_LAYOUT_NAMES = {v: k for k, v in LAYOUTS.items()}


def inspect_blob(path: Path) -> dict:
    raw = Path(path).read_bytes()
    if len(raw) < HEADER_FIXED or struct.unpack_from("<I", raw)[0] != MAGIC:
        raise ExportError(path, "not a colibri blob (bad magic)")
    h = read_header(path)
    crc = zlib.crc32(raw[12:]) if len(raw) == h["blob_bytes"] else None
    out: dict = {"kind": "blob", "path": str(path), "format_version": f"{h['version_major']}.{h['version_minor']}",
                 "blob_bytes": len(raw), "arena_bytes": h["arena_bytes"], "max_seq": h["max_seq"],
                 "layout": _LAYOUT_NAMES.get(h["layout"], f"unknown ({h['layout']})"),
                 "integer_matmuls": bool(h["xq_offset"]),
                 "crc32": f"{h['crc32']:08x}",
                 "crc_ok": crc == h["crc32"],
                 "crc_status": "ok" if crc == h["crc32"] else
                 ("length mismatch" if crc is None else f"MISMATCH (computed {crc:08x})")}
    try:
        spec = _spec_from_header(h)
        out.update(_spec_summary(spec))
        out["family"] = out["family"] + " (guessed from the flags)" if spec.arch != "mixtral" else "mixtral-like"
    except ValueError as e:
        out["header_problem"] = str(e)
    quant, per_expert, weights_bytes = Counter(), defaultdict(int), 0
    n = h["n_tensors"]
    if HEADER_FIXED + ENTRY_BYTES * n > len(raw):
        out["table_problem"] = "tensor table beyond the blob"
        return out
    ends = sorted({struct.unpack_from("<Q", raw, HEADER_FIXED + ENTRY_BYTES * i + 32)[0] for i in range(n)})
    ends.append(len(raw))
    for i in range(n):
        e = TABLE_ENTRY.unpack_from(raw, HEADER_FIXED + ENTRY_BYTES * i)
        kind, layer, expert, dtype, rows, cols, data_off = e[0], e[1], e[2], e[3], e[5], e[6], e[11]
        nxt = next((x for x in ends if x > data_off), len(raw))
        nbytes = nxt - data_off
        weights_bytes += nbytes
        quant[_DTYPE_NAMES.get(dtype, f"?{dtype}")] += rows * cols
        if _KIND_NAMES.get(kind) in ("gate", "down", "up"):
            per_expert[(layer, expert)] += nbytes
    out["quantization"] = {k: v for k, v in quant.items()}
    out["payload_bytes"] = weights_bytes
    if per_expert:
        sizes = list(per_expert.values())
        out["expert_bytes"] = {"count": len(sizes), "min": min(sizes), "max": max(sizes),
                               "mean": math.floor(sum(sizes) / len(sizes)), "total": sum(sizes)}
    return out


def inspect(path: str | Path) -> dict:
    p = Path(path)
    if p.is_dir() or p.name == "config.json":
        return inspect_checkpoint(p)
    if p.is_file():
        return inspect_blob(p)
    raise ExportError(p, "does not exist")


def format_report(info: dict) -> str:
    lines = [f"{info['path']}: {info['kind']}"]
    if info["kind"] == "blob":
        lines.append(f"  format {info['format_version']}, {info['blob_bytes']:,} bytes, crc32 {info['crc32']} "
                     f"{info['crc_status']}, arena {info['arena_bytes']:,} bytes for max_seq {info['max_seq']}")
        how = "int8 activations, integer dot products" if info["integer_matmuls"] else "float activations"
        lines.append(f"  int8 matrices: {info['layout']} layout, {how}")
    if "family" in info:
        d = info["dims"]
        lines.append(f"  family {info['family']}")
        lines.append("  dims " + ", ".join(f"{k} {v}" for k, v in d.items()))
        lines.append("  features: " + ", ".join(info["features"]))
        lines.append(f"  parameters {info['params_total']:,} total, {info['params_active_per_token']:,} active per "
                     f"token ({info['moe_layers']} MoE layers x top-{d['top_k']} of {d['n_experts']} experts)")
        lines.append(f"  per expert {info['params_per_expert']:,} parameters"
                     + (f", {info['bytes_per_expert']:,} bytes in the source" if "bytes_per_expert" in info else ""))
    if "source_dtypes" in info:
        lines.append("  source dtypes " + ", ".join(f"{k}: {v} tensors" for k, v in info["source_dtypes"].items()))
    if "quantization" in info:
        lines.append("  quantization " + ", ".join(f"{k}: {v:,} weights" for k, v in info["quantization"].items()))
    if "expert_bytes" in info:
        eb = info["expert_bytes"]
        lines.append(f"  expert bytes in the blob: {eb['count']} experts, {eb['min']:,}..{eb['max']:,} each "
                     f"(mean {eb['mean']:,}), {eb['total']:,} total")
    for key in ("header_problem", "table_problem"):
        if key in info:
            lines.append(f"  problem: {info[key]}")
    return "\n".join(lines)
