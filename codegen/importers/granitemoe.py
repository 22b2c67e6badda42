"""HuggingFace Granite-MoE (GraniteMoeForCausalLM, GraniteMoeSharedForCausalLM): config keys -> ModelSpec,
fused on-disk tensors -> canonical names.

As transformers 5's modeling_granitemoe(_shared).py defines the family:
- experts stored fused: `block_sparse_moe.input_linear.weight` (experts, 2·intermediate_size, hidden),
  gate rows first then up (`chunk(2)`), and `block_sparse_moe.output_linear.weight` (experts, hidden,
  intermediate_size); the router is `block_sparse_moe.router.layer.weight`.
- routing: top-k of the router logits, then softmax over the chosen: the same weights as a softmax over
  all experts renormalised over the top k (norm_topk_prob true).
- Shared: an ungated `shared_mlp` (input_linear = gate‖up of shared_intermediate_size, output_linear)
  added to the routed experts' sum; shared_intermediate_size 0 means none.
- the four multipliers are linear in one weight each and are folded into it at import, so the blob and
  the runtime need nothing new (an older runtime runs these blobs): `attention_multiplier` replaces
  1/sqrt(head_dim) (q_proj scaled by attention_multiplier·sqrt(head_dim)); `residual_multiplier` scales
  what attention and the MoE block add to the residual (o_proj, every expert's and the shared MLP's
  down projection); `embedding_multiplier` scales the embedding rows, `logits_scaling` divides the logits
  (the final norm's weight scaled by 1 / (embedding_multiplier · logits_scaling) when the embedding is
  the tied lm_head, by 1 / logits_scaling otherwise).
- `attention_bias` true refused (biases on o_proj too).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..rope import rope_fields
from ..spec import ModelSpec, canonical_shape
from . import _hf
from ._registry import Importer, View, register

ARCHITECTURES = ("GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM")
MODEL_TYPES = ("granitemoe", "granitemoeshared")
# transformers 5.x GraniteMoeConfig / GraniteMoeSharedConfig: no attribute_map
ALIASES: dict[str, tuple[str, ...]] = {}
MULTIPLIERS = ("embedding_multiplier", "logits_scaling", "residual_multiplier", "attention_multiplier")
NAMES = _hf.Names(router="block_sparse_moe.router.layer")


def multipliers(cfg: _hf._Config) -> dict[str, float]:
    return {k: cfg.positive_float(k, cfg.get(k, 1.0, required=False)) for k in MULTIPLIERS}


def parse_config(data: Mapping[str, Any], path: Path) -> ModelSpec:
    cfg = _hf.make_config(data, path, ALIASES)
    _hf.reject_keys(cfg)
    _hf.reject_attention_bias(cfg)
    multipliers(cfg)
    f = _hf.common_fields(cfg, sliding_key=None, experts_key="num_local_experts")
    rope = rope_fields(cfg)
    f["rope_theta"] = rope.pop("rope_theta")
    shared = cfg.get("shared_intermediate_size", 0, required=False)
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise cfg.fail("shared_intermediate_size", f"must be a non-negative integer, got {shared!r}")
    archs = data.get("architectures") or []
    if shared and not (data.get("model_type") == MODEL_TYPES[1] or (archs and archs[0] == ARCHITECTURES[1])):
        shared = 0  # GraniteMoeConfig has no shared MLP, whatever the key says
    return ModelSpec(arch="granitemoe", **f, ffn=cfg.positive_int("intermediate_size"), norm_topk_prob=True,
                     shared_ffn=shared, **rope)


def source_name(canonical: str) -> str:
    if not canonical.startswith("layers."):
        return NAMES.source_name(canonical)
    _, layer, rest = canonical.split(".", 2)
    p = f"model.layers.{layer}."
    parts = rest.split(".")
    if parts[:2] == ["moe", "experts"]:
        return p + ("block_sparse_moe.output_linear.weight" if parts[3] == "down"
                    else "block_sparse_moe.input_linear.weight")
    if parts[:2] == ["moe", "shared"]:
        return p + ("shared_mlp.output_linear.weight" if parts[2] == "down" else "shared_mlp.input_linear.weight")
    return NAMES.source_name(canonical)


def tensor_map(spec: ModelSpec) -> dict[str, str]:
    return {name: source_name(name) for name in NAMES.tensor_map(spec)}


def view(spec: ModelSpec, config: Mapping[str, Any], canonical: str) -> View:
    m = multipliers(_hf.make_config(config, Path("config.json"), ALIASES))
    shape = canonical_shape(spec, canonical)
    src, rest = source_name(canonical), canonical.split(".", 2)[-1]
    scale = 1.0
    if canonical == "embed":
        scale = m["embedding_multiplier"]
    elif canonical == "final_norm":
        scale = 1.0 / (m["logits_scaling"] * (m["embedding_multiplier"] if spec.tied else 1.0))
    elif rest == "attn.q":
        scale = m["attention_multiplier"] * math.sqrt(spec.head_dim)
    elif rest == "attn.o" or rest.endswith(".down"):
        scale = m["residual_multiplier"]
    parts = rest.split(".")
    if parts[:2] == ["moe", "experts"]:
        e, proj, f = int(parts[2]), parts[3], spec.ffn
        if proj == "down":
            return View(src, (spec.n_experts, spec.hidden, f), (e,), scale)
        rows = slice(0, f) if proj == "gate" else slice(f, 2 * f)
        return View(src, (spec.n_experts, 2 * f, spec.hidden), (e, rows), scale)
    if parts[:2] == ["moe", "shared"] and parts[2] != "down":
        f = spec.shared_ffn
        return View(src, (2 * f, spec.hidden), (slice(0, f) if parts[2] == "gate" else slice(f, 2 * f),), scale)
    return View(src, shape, (), scale)


is_ignored = NAMES.is_ignored
IMPORTER = register(Importer("granitemoe", ARCHITECTURES, MODEL_TYPES, parse_config, tensor_map, is_ignored,
                             source_name, view))
