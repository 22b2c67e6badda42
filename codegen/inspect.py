"""`colibri inspect CKPT_OR_BLOB`: what a checkpoint or a model.bin holds, without running it.

For a checkpoint directory: family, dims, features, parameter counts (total, and active per token: all
but the experts a token is not routed to) and per-expert sizes in the source dtype. For a blob: the same
from its header, plus format version, quantization of its tensors, per-expert bytes and CRC status.
"""

from __future__ import annotations

import math
import os
import zlib
from collections import Counter, defaultdict
from pathlib import Path

from . import format as fmt
from .errors import ExportError
from .plan import mla_cache_bytes
from .safeio import open_regular
from .spec import ModelSpec

_EXPERT_KINDS = {fmt.KIND[k].code for k in ("W_GATE", "W_DOWN", "W_UP")}
_SOURCE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


def _features(spec: ModelSpec) -> list[str]:
    out = []
    if spec.qkv_bias:
        out.append("q/k/v biases")
    if spec.qk_norm != "none":
        out.append(f"q/k RMSNorm ({'per head' if spec.qk_norm == 'head' else 'whole projection'})")
    if spec.mla:
        q = f"q_lora_rank {spec.q_lora_rank}" if spec.q_lora_rank else "no q_lora"
        out.append(f"MLA kv_lora_rank {spec.kv_lora_rank}, {q}, qk_nope {spec.qk_nope_head_dim}, rope "
                   f"{spec.head_dim}, v {spec.v_head_dim}")
        latent, plain = mla_cache_bytes(spec, spec.max_position)
        out.append(f"KV cache at max_seq {spec.max_position}: latent {latent} bytes, plain K+V {plain} bytes "
                   f"({plain / latent:.1f}x)")
    if spec.router_scoring == "sigmoid":
        out.append("sigmoid router, expert bias for choosing")
    if spec.group_score != "none":
        out.append(f"group-limited top-k: {spec.topk_group} of {spec.n_group} groups by {spec.group_score}")
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
    f = fmt.FLAG
    flags = h["flags"] & ~(f["TOKENIZER"] | f["PARAMS"] | fmt.KV_FLAGS)  # the model's features only
    return ModelSpec(
        arch="mixtral" if not flags & ~f["TIED"] else "qwen2_moe" if flags & f["QKV_BIAS"]
        else "qwen3_moe" if flags & f["QK_NORM_HEAD"] else "olmoe" if flags & f["QK_NORM_FULL"] else "deepseek",
        vocab=h["vocab"], hidden=h["hidden"], n_layers=h["n_layers"], n_heads=h["n_heads"],
        n_kv_heads=h["n_kv_heads"], head_dim=h["head_dim"], ffn=h["ffn"], n_experts=h["n_experts"], top_k=h["top_k"],
        rms_eps=h["rms_eps"] or 1e-6, rope_theta=h["rope_theta"] or 1e4, tied=bool(flags & f["TIED"]),
        max_position=h["max_seq"], qkv_bias=bool(flags & f["QKV_BIAS"]),
        qk_norm="head" if flags & f["QK_NORM_HEAD"] else "full" if flags & f["QK_NORM_FULL"] else "none",
        norm_topk_prob=not flags & f["TOPK_NO_NORM"],
        routed_scale=h["routed_scale"] if flags & f["ROUTED_SCALE"] else 1.0, shared_ffn=h["shared_ffn"],
        shared_gate=bool(flags & f["SHARED_GATE"]), dense_ffn=h["dense_ffn"],
        dense_layers=tuple(fmt.dense_layers_of(h)),
    )


def _count_problem(h: dict, blob_len: int) -> str | None:
    """Why the header's dims cannot be this blob's (checked with arithmetic only, as the C validator does,
    before anything is built per layer or expert); None when they can."""
    n_dense = sum(1 for layer in fmt.dense_layers_of(h) if layer < h["n_layers"]) \
        if h["flags"] & fmt.FLAG["DENSE_LAYERS"] else 0
    implied = fmt.n_tensors(h["flags"], h["n_layers"], h["n_experts"], n_dense)
    if implied != h["n_tensors"]:
        return f"the dims imply {implied} tensors, the header says {h['n_tensors']}"
    if fmt.HEADER_BYTES + fmt.ENTRY_BYTES * implied > blob_len:
        return "tensor table beyond the blob"
    return None


def _read_blob(path: Path) -> bytes:
    """The blob's bytes (a regular file only: safeio refuses FIFOs, devices, directories)."""
    fd = open_regular(path, "blob")
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(os.fstat(fd).st_size)  # not more: the file may grow meanwhile
    except OSError as e:
        raise ExportError(path, f"cannot read the blob: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _params(raw: bytes, e: dict, h: dict) -> dict:
    """The parameters section as {"records": [[name, index, value], ...]} or {"problem": why}."""
    data = raw[e["data_off"]:e["data_off"] + e["rows"]]
    if len(data) != e["rows"]:
        return {"problem": "parameters section beyond the blob"}
    try:
        recs = fmt.read_params(data, h["n_layers"], h["flags"])
    except ValueError as err:
        return {"problem": str(err)}
    return {"records": [[p.name, i, v] for p, i, v in recs]}


def _params_lines(params: dict) -> list[str]:
    if "problem" in params:
        return [f"  parameters section: problem: {params['problem']}"]
    by_key: dict[str, list[tuple[int, float | int]]] = defaultdict(list)
    for name, index, value in params["records"]:
        by_key[name].append((index, value))
    lines = [f"  parameters section: {len(params['records'])} records"]
    for name, vals in by_key.items():
        if fmt.PARAM[name].per_layer:
            lines.append(f"    {name}: " + ", ".join(f"layer {i} {v:g}" for i, v in vals))
        else:
            lines.append(f"    {name}: {vals[0][1]:g}")
    return lines


def inspect_blob(path: Path) -> dict:
    raw = _read_blob(path)
    if len(raw) < fmt.HEADER_BYTES or fmt.read_header(raw)["magic"] != fmt.MAGIC:
        raise ExportError(path, "not a colibri blob (bad magic)")
    h = fmt.read_header(raw)
    for name, bound in fmt.SIZE_BOUNDS:
        if h[name] > bound:
            raise ExportError(path, f"header field {name} is {h[name]}, above the format's limit of {bound}")
    crc = zlib.crc32(raw[fmt.CRC_FROM:]) if len(raw) == h["blob_bytes"] else None
    layout = fmt.LAYOUT_NAMES.get(h["layout"], f"unknown ({h['layout']})")
    out: dict = {"kind": "blob", "path": str(path), "format_version": f"{h['version_major']}.{h['version_minor']}",
                 "blob_bytes": len(raw), "arena_bytes": h["arena_bytes"], "max_seq": h["max_seq"],
                 "layout": layout, "integer_matmuls": bool(h["xq_offset"]),
                 "crc32": f"{h['crc32']:08x}",
                 "crc_ok": crc == h["crc32"],
                 "crc_status": "ok" if crc == h["crc32"] else
                 ("length mismatch" if crc is None else f"MISMATCH (computed {crc:08x})")}
    problem = _count_problem(h, len(raw))
    try:
        if problem is not None:
            raise ValueError(problem)
        spec = _spec_from_header(h)
        out.update(_spec_summary(spec))
        out["family"] = out["family"] + " (guessed from the flags)" if spec.arch != "mixtral" else "mixtral-like"
    except ValueError as e:
        out["header_problem"] = str(e)
    quant, per_expert, weights_bytes = Counter(), defaultdict(int), 0
    n = h["n_tensors"]
    if fmt.HEADER_BYTES + fmt.ENTRY_BYTES * n > len(raw):
        out["table_problem"] = "tensor table beyond the blob"
        return out
    entries = [fmt.entry(raw, i) for i in range(n)]
    ends = sorted({e["data_off"] for e in entries})
    ends.append(len(raw))
    for e in entries:
        data_off = e["data_off"]
        if e["kind"] == fmt.KIND["TOKENIZER"].code:  # the tokenizer section: bytes, not weights
            out["tokenizer_bytes"] = e["rows"]
            continue
        if e["kind"] == fmt.KIND["PARAMS"].code:  # the parameters section: values, not weights
            out["params"] = _params(raw, e, h)
            continue
        nxt = next((x for x in ends if x > data_off), len(raw))
        nbytes = nxt - data_off
        weights_bytes += nbytes
        quant[fmt.DTYPE_NAMES.get(e["dtype"], f"?{e['dtype']}")] += e["rows"] * e["cols"]
        if e["kind"] in _EXPERT_KINDS:
            per_expert[(e["layer"], e["expert"])] += nbytes
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
    if p.exists():  # a FIFO or a device gets safeio's one line, not a hang
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
    if "params" in info:
        lines += _params_lines(info["params"])
    if "tokenizer_bytes" in info:
        lines.append(f"  tokenizer section: {info['tokenizer_bytes']:,} bytes")
    if "expert_bytes" in info:
        eb = info["expert_bytes"]
        lines.append(f"  expert bytes in the blob: {eb['count']} experts, {eb['min']:,}..{eb['max']:,} each "
                     f"(mean {eb['mean']:,}), {eb['total']:,} total")
    for key in ("header_problem", "table_problem"):
        if key in info:
            lines.append(f"  problem: {info[key]}")
    return "\n".join(lines)
