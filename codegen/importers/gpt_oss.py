"""OpenAI gpt-oss (GptOssForCausalLM): config keys -> ModelSpec, stacked expert tensors -> canonical names.

As transformers 5's configuration_gpt_oss.py / modeling_gpt_oss.py define the family:
- config: GptOssConfig's keys and defaults (`num_experts` is its attribute_map spelling of
  `num_local_experts`; head_dim 64, sliding_window 128, rms_norm_eps 1e-5, num_experts_per_tok 4,
  swiglu_alpha 1.702, swiglu_limit 7.0, attention_bias true, `layer_types` alternating
  sliding_attention / full_attention from layer 0, rope_parameters YaRN factor 32 over 4096 positions,
  beta_fast 32, beta_slow 1, truncate false, rope_theta 150000 when absent).
- attention: q/k/v/o biases (QKV_BIAS, O_BIAS), a learned sink logit per head (`self_attn.sinks`,
  ATTN_SINKS), the sliding layers' window (SLIDING_WINDOW parameters, 0 on the full layers).
- experts stored stacked, as save_pretrained writes them: `mlp.experts.gate_up_proj` (experts, hidden,
  2·intermediate_size) with gate and up interleaved in the last axis (gate = [..., ::2], up = [..., 1::2]),
  x @ W; `gate_up_proj_bias` (experts, 2·intermediate_size) interleaved the same way; `down_proj`
  (experts, intermediate_size, hidden) and `down_proj_bias` (experts, hidden). Canonical weights are
  (out, in): the views transpose.
- router `mlp.router.weight` + `mlp.router.bias`: top-k of the logits, softmax over the chosen (the
  renormalised softmax, norm_topk_prob true); the experts' clamped SwiGLU (CLAMPED_SWIGLU).
- MXFP4 checkpoints (`*_blocks`, `*_scales`) are dequantized as transformers does (codegen/mxfp4.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..rope import rope_fields
from ..spec import ModelSpec, canonical_names, canonical_shape
from . import _hf
from ._registry import Importer, View, register
from .mixtral import GLOBAL_TENSORS

ARCHITECTURES = ("GptOssForCausalLM",)
MODEL_TYPES = ("gpt_oss",)
ALIASES: dict[str, tuple[str, ...]] = {"num_local_experts": ("num_experts",)}
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}
DEFAULT_THETA = 150000.0
LAYER_TYPES = ("sliding_attention", "full_attention")
EXPERTS = "mlp.experts."


def _windows(cfg: _hf._Config, n_layers: int) -> tuple[int, ...]:
    types = cfg.data.get("layer_types")
    if types is None:
        types = [LAYER_TYPES[i % 2] for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers or any(t not in LAYER_TYPES for t in types):
        raise cfg.fail("layer_types", f"must be {n_layers} of {', '.join(map(repr, LAYER_TYPES))}, got {types!r}")
    if LAYER_TYPES[0] not in types:
        return ()
    window = cfg.data.get("sliding_window", 128)
    window = cfg.positive_int("sliding_window", window)
    return tuple(window if t == LAYER_TYPES[0] else 0 for t in types)


def parse_config(data: Mapping[str, Any], path: Path) -> ModelSpec:
    data = dict(data)
    data.setdefault("head_dim", 64)
    if data.get("rope_parameters") is None and data.get("rope_scaling") is None:
        data["rope_parameters"] = {**DEFAULT_ROPE, "rope_theta": data.get("rope_theta", DEFAULT_THETA)}
    data.setdefault("rms_norm_eps", 1e-5)
    data.setdefault("num_experts_per_tok", 4)
    cfg = _hf.make_config(data, path, ALIASES)
    _hf.reject_keys(cfg)
    rope = rope_fields(cfg)  # codegen/rope.py (YaRN); the shared fields read the rest, rope_theta as "default"
    plain = _hf.make_config({**data, "rope_parameters": {"rope_type": "default", "rope_theta": rope["rope_theta"]}},
                            path, ALIASES)
    f = _hf.common_fields(plain, sliding_key=None, experts_key="num_local_experts")
    f["rope_theta"] = rope.pop("rope_theta")
    bias = _hf.bool_key(cfg, "attention_bias", True)
    swiglu = {k: cfg.positive_float(k, cfg.get(k, d, required=False))
              for k, d in (("swiglu_alpha", 1.702), ("swiglu_limit", 7.0))}
    return ModelSpec(arch="gpt-oss", **f, ffn=cfg.positive_int("intermediate_size"), norm_topk_prob=True,
                     qkv_bias=bias, o_bias=bias, attn_sinks=True, expert_bias=True,
                     swiglu_alpha=swiglu["swiglu_alpha"], swiglu_limit=swiglu["swiglu_limit"],
                     sliding_window=_windows(cfg, f["n_layers"]), **rope)


def source_name(canonical: str) -> str:
    if canonical in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[canonical]
    _, layer, rest = canonical.split(".", 2)
    p = f"model.layers.{layer}."
    fixed = {"attn_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight",
             "attn.sinks": "self_attn.sinks", "moe.router": "mlp.router.weight", "moe.router_bias": "mlp.router.bias"}
    if rest in fixed:
        return p + fixed[rest]
    parts = rest.split(".")
    if parts[0] == "attn":
        proj = parts[1]
        return f"{p}self_attn.{proj[0]}_proj.bias" if proj.endswith("_bias") else f"{p}self_attn.{proj}_proj.weight"
    what = parts[3]  # moe.experts.E.<gate|up|down>[_bias]
    stacked = "down_proj" if what.startswith("down") else "gate_up_proj"
    return p + EXPERTS + stacked + ("_bias" if what.endswith("_bias") else "")


def tensor_map(spec: ModelSpec) -> dict[str, str]:
    return {name: source_name(name) for name in canonical_names(spec)}


def view(spec: ModelSpec, config: Mapping[str, Any], canonical: str) -> View:
    src, f, h, n = source_name(canonical), spec.ffn, spec.hidden, spec.n_experts
    parts = canonical.split(".")  # layers.L.moe.experts.E.<what>
    if len(parts) != 6 or parts[2:4] != ["moe", "experts"]:
        return View(src, canonical_shape(spec, canonical))
    e, what = int(parts[4]), parts[5]
    interleave = slice(0, None, 2) if what.startswith("gate") else slice(1, None, 2)
    if what == "down":
        return View(src, (n, f, h), (e,), transpose=True)
    if what == "down_bias":
        return View(src, (n, h), (e,))
    if what.endswith("_bias"):
        return View(src, (n, 2 * f), (e, interleave))
    return View(src, (n, h, 2 * f), (e, slice(None), interleave), transpose=True)


def is_ignored(spec: ModelSpec, name: str) -> bool:
    return spec.tied and name == "lm_head.weight"


IMPORTER = register(Importer("gpt-oss", ARCHITECTURES, MODEL_TYPES, parse_config, tensor_map, is_ignored,
                             source_name, view))
