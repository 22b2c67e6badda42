"""The matrix of small synthetic checkpoints x export options whose model.bin hashes
tests/fixtures/export_hashes.json records (tests/fixtures/make_export_hashes.py writes it, test_export_hashes.py
re-exports and compares): every quantization, both layouts, group sizes, float activations, --attn-quant,
bf16/f16/f32 sources, every family of `colibri synth --arch`, the pool, and tensors large enough for
quantize's row-chunked path (LEAN_MIN_WEIGHTS)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

BASE = dict(layers=2, hidden=64, ffn=64, heads=4, kv_heads=2, experts=4, top_k=2, vocab=256, seed=5, dtype="f32")

# checkpoint name -> synth keyword arguments
CKPTS: dict[str, dict[str, Any]] = {
    "mixtral_f32": {**BASE, "heavy_tail": True},
    "mixtral_bf16": {**BASE, "dtype": "bf16", "seed": 6, "hidden": 48, "ffn": 80},
    "mixtral_f16": {**BASE, "dtype": "f16", "seed": 7, "outlier_channels": 3},
    # an embedding of 65536 x 64 = 4.19 M weights: quantize's row-chunked (lean) path
    "lean": {**BASE, "layers": 1, "experts": 2, "top_k": 1, "vocab": 65536, "seed": 8, "heavy_tail": True},
    **{f"arch_{a}": {**BASE, "arch": a, "seed": 9 + i}
       for i, a in enumerate(("qwen2_moe", "qwen3_moe", "olmoe", "deepseek", "llama", "mistral", "qwen2",
                              "qwen3", "granitemoe", "gpt-oss", "deepseek-v2", "deepseek-v3"))},
}

QUANTS = ("f32", "f16", "int8", "int8c", "int4", "int4c")

# (case name, checkpoint, ExportOptions keyword arguments)
CASES: list[tuple[str, str, dict[str, Any]]] = [
    *[(f"mixtral_f32-{q}", "mixtral_f32", {"quant": q}) for q in QUANTS],
    *[(f"mixtral_f32-{q}-rows", "mixtral_f32", {"quant": q, "layout": "rows"}) for q in ("int8", "int8c")],
    *[(f"mixtral_f32-{q}-g32", "mixtral_f32", {"quant": q, "group_size": 32}) for q in ("int8", "int8c")],
    ("mixtral_f32-int8c-g48", "mixtral_f32", {"quant": "int8c", "group_size": 48}),
    ("mixtral_f32-int8c-floatact", "mixtral_f32", {"quant": "int8c", "int8_activations": False}),
    ("mixtral_f32-int8c-frac02", "mixtral_f32", {"quant": "int8c", "outlier_frac": 0.02}),
    ("mixtral_f32-int4c-attn-int8c", "mixtral_f32", {"quant": "int4c", "attn_quant": "int8c"}),
    ("mixtral_f32-int8-attn-f16", "mixtral_f32", {"quant": "int8", "attn_quant": "f16"}),
    *[(f"mixtral_bf16-{q}", "mixtral_bf16", {"quant": q}) for q in QUANTS],
    *[(f"mixtral_f16-{q}", "mixtral_f16", {"quant": q}) for q in ("f16", "int8c", "int4c")],
    ("lean-int8c", "lean", {"quant": "int8c"}),
    ("lean-int8c-g32-pool", "lean", {"quant": "int8c", "group_size": 32, "workers": 2}),
    ("lean-int4c", "lean", {"quant": "int4c"}),
    *[(f"{c}-int8c", c, {"quant": "int8c"}) for c in CKPTS if c.startswith("arch_")],
    *[(f"{c}-int4c", c, {"quant": "int4c"}) for c in ("arch_qwen2_moe", "arch_deepseek-v3", "arch_gpt-oss")],
]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def export_case(ckpt: Path, out: Path, opts: dict[str, Any]) -> tuple[str, dict]:
    """(sha256 of model.bin, the manifest) of one export, without the logit probe; one worker unless told."""
    from colibri.codegen.export import ExportOptions, export

    res = export(ckpt, out, ExportOptions(**{"predict": False, "workers": 1, **opts}))
    return sha256(out / "model.bin"), res.manifest


def tensor_errors(manifest: dict) -> dict[str, dict[str, float]]:
    """Per tensor, its rel_error and the comparison flavour's (rel_error_<other>)."""
    return {r["name"]: {k: v for k, v in r.items() if k.startswith("rel_error")} for r in manifest["tensors"]}
