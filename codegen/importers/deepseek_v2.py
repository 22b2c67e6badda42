"""HuggingFace DeepSeek-V2 and DeepSeek-V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM): config keys ->
ModelSpec, tensor names -> canonical names.

As transformers 5's modeling_deepseek_v2.py / modeling_deepseek_v3.py define the families:
- Multi-head latent attention (MLA): queries from `q_proj` (q_lora_rank null) or `q_a_proj`,
  `q_a_layernorm`, `q_b_proj`; per head qk_nope_head_dim + qk_rope_head_dim. `kv_a_proj_with_mqa` gives the
  latent (kv_lora_rank, then `kv_a_layernorm`) and one rope key shared by every head; `kv_b_proj` gives each
  head's qk_nope_head_dim key rows then v_head_dim value rows from the latent. Softmax scale
  1/sqrt(qk_nope_head_dim + qk_rope_head_dim). The configs overwrite `head_dim` with qk_rope_head_dim (the
  rotary dimension): so does the ModelSpec (head_dim is the rope part).
- Rope: V2 rotates interleaved pairs (x0, x1), (x2, x3), ... (complex multiplication); V3 too when
  `rope_interleave` is true (its default), else rotate_half. The importer permutes the rope rows of the
  query projection and of kv_a_proj_with_mqa into rotate_half order (evens, then odds): q·k is the same sum,
  so the reference and the runtime rotate as for every other family. `rope_type` default or yarn (with
  `mscale`, `mscale_all_dim`: codegen/rope.py's frequencies, and its factors folded into the query and kv_a
  rows by the views, rope.mla_row_scales); the rest refused naming the key; `partial_rotary_factor` other
  than 1 refused.
- Routing. V2: softmax scores; `topk_method` greedy (top-k) or group_limited_greedy (the top-k within the
  `topk_group` best of `n_group` groups, a group scored by its best expert); weights the chosen scores, never
  renormalised (transformers' V2 router does not read `norm_topk_prob`: true is refused), times
  `routed_scaling_factor`. V3: sigmoid scores; experts chosen by score + `e_score_correction_bias`, within
  the `topk_group` best groups scored by the sum of their best two; weights the unbiased scores, divided by
  their sum (+1e-20) when `norm_topk_prob`, times `routed_scaling_factor`. `scoring_func` / `topk_method`
  keys of the original configs, which transformers' V3 does not read, must say what it does (sigmoid,
  noaux_tc) or are refused.
- Layers below `first_k_dense_replace` are a dense MLP of intermediate_size; the others MoE with
  `n_shared_experts` ungated shared experts (one MLP of n_shared_experts·moe_intermediate_size).
  `moe_layer_freq` (original configs; transformers does not read it) other than 1 is refused.
- Experts on disk one tensor each (`mlp.experts.E.gate_proj.weight`: what save_pretrained of transformers
  5.24 writes). V3's multi-token-prediction layers (`model.layers.N...` from num_hidden_layers on) are
  ignored, as transformers ignores them.
- num_key_value_heads other than num_attention_heads refused (MLA keys and values are per head already).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..rope import mla_row_scales
from ..spec import ModelSpec, canonical_names, canonical_shape
from . import _hf
from ._registry import Importer, View, register
from .dense import rope_fields

# transformers 5.24's DeepseekV2Config / DeepseekV3Config attribute_map
ALIASES_V2: dict[str, tuple[str, ...]] = {"n_routed_experts": ("num_experts",)}
ALIASES_V3: dict[str, tuple[str, ...]] = {"n_routed_experts": ("num_local_experts",),
                                          "num_nextn_predict_layers": ("num_mtp_layers",)}
# the config classes' defaults of the keys a config.json may leave out
DEFAULTS_V2: dict[str, Any] = dict(
    first_k_dense_replace=0, kv_lora_rank=512, q_lora_rank=1536, n_group=None, n_routed_experts=64,
    n_shared_experts=2, qk_nope_head_dim=128, qk_rope_head_dim=64, routed_scaling_factor=1.0, topk_group=None,
    topk_method="greedy", norm_topk_prob=False, v_head_dim=128, moe_intermediate_size=1407,
    max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=10000.0)
DEFAULTS_V3: dict[str, Any] = dict(
    first_k_dense_replace=3, kv_lora_rank=512, q_lora_rank=1536, n_group=8, n_routed_experts=256,
    n_shared_experts=1, qk_nope_head_dim=128, qk_rope_head_dim=64, routed_scaling_factor=2.5, topk_group=4,
    norm_topk_prob=True, v_head_dim=128, moe_intermediate_size=2048, num_experts_per_tok=8,
    max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=10000.0,
    rope_interleave=True)
V2_TOPK_METHODS = ("greedy", "group_limited_greedy")
_ATTN = {"q": "q_proj", "q_a": "q_a_proj", "q_a_norm": "q_a_layernorm", "q_b": "q_b_proj",
         "kv_a": "kv_a_proj_with_mqa", "kv_a_norm": "kv_a_layernorm", "kv_b": "kv_b_proj", "o": "o_proj"}
NAMES = _hf.Names(shared="mlp.shared_experts")
_IGNORED = re.compile(r"model\.layers\.(\d+)\..*")


def _nonneg_int(cfg: _hf._Config, key: str) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise cfg.fail(key, f"must be a non-negative integer, got {v!r}")
    return v


def _with_defaults(data: Mapping[str, Any], defaults: Mapping[str, Any],
                   aliases: Mapping[str, tuple[str, ...]]) -> dict[str, Any]:
    """config.json with the config class's default for each key it lacks in every spelling."""
    out = dict(data)
    for k, v in defaults.items():
        if k not in out and not any(a in out for a in aliases.get(k, ())):
            out[k] = v
    return out


def _mla_fields(cfg: _hf._Config) -> dict[str, Any]:
    """The attention fields of both families (MLA dims, rope)."""
    _hf.reject_attention_bias(cfg, "biases on the attention projections are not supported")
    act = cfg.get("hidden_act", "silu", required=False)
    if act != "silu":
        raise cfg.fail("hidden_act", f"activation {act!r} is not supported (only 'silu')")
    hidden = cfg.positive_int("hidden_size")
    n_heads = cfg.positive_int("num_attention_heads")
    n_kv = cfg.data.get("num_key_value_heads")
    if n_kv is not None and n_kv != n_heads:
        raise cfg.fail("num_key_value_heads", f"MLA with {n_kv!r} key/value heads for {n_heads} query heads is "
                                              "not supported (only equal)")
    rope_dim = cfg.positive_int("qk_rope_head_dim")
    if rope_dim % 2:
        raise cfg.fail("qk_rope_head_dim", f"rope dimension {rope_dim} is odd; rotary embedding needs pairs")
    q_lora = cfg.data.get("q_lora_rank")
    if q_lora is not None:
        q_lora = cfg.positive_int("q_lora_rank")
    rope = rope_fields(cfg)
    if rope.get("rope_type", "default") not in ("default", "yarn"):
        key = "rope_parameters" if cfg.data.get("rope_parameters") is not None else "rope_scaling"
        raise cfg.fail(key, f"rope_type {rope['rope_type']!r} is not supported for DeepSeek (only 'default', "
                            "'yarn')")
    return dict(**{k: v for k, v in rope.items() if k != "rope_theta"},
        vocab=cfg.positive_int("vocab_size"), hidden=hidden, n_layers=cfg.positive_int("num_hidden_layers"),
        n_heads=n_heads, n_kv_heads=n_heads, head_dim=rope_dim,
        rms_eps=cfg.positive_float("rms_norm_eps", cfg.get("rms_norm_eps")),
        rope_theta=rope["rope_theta"], tied=_hf.bool_key(cfg, "tie_word_embeddings", False),
        max_position=cfg.positive_int("max_position_embeddings"),
        kv_lora_rank=cfg.positive_int("kv_lora_rank"), q_lora_rank=q_lora or 0,
        qk_nope_head_dim=cfg.positive_int("qk_nope_head_dim"), v_head_dim=cfg.positive_int("v_head_dim"))


def _moe_fields(cfg: _hf._Config, n_layers: int) -> dict[str, Any]:
    n_experts = cfg.positive_int("n_routed_experts")
    top_k = cfg.positive_int("num_experts_per_tok")
    if top_k > n_experts:
        raise cfg.fail("num_experts_per_tok", f"{top_k} exceeds n_routed_experts {n_experts}")
    moe_ffn = cfg.positive_int("moe_intermediate_size")
    n_shared = _nonneg_int(cfg, "n_shared_experts")
    first_dense = _nonneg_int(cfg, "first_k_dense_replace")
    if cfg.get("moe_layer_freq", 1, required=False) != 1:
        raise cfg.fail("moe_layer_freq", f"only 1 is supported (transformers makes every layer from "
                                         f"first_k_dense_replace on MoE), got {cfg.data['moe_layer_freq']!r}")
    dense = tuple(range(min(first_dense, n_layers)))
    return dict(n_experts=n_experts, top_k=top_k, ffn=moe_ffn, shared_ffn=n_shared * moe_ffn,
                dense_ffn=cfg.positive_int("intermediate_size") if dense else 0, dense_layers=dense,
                routed_scale=cfg.positive_float("routed_scaling_factor", cfg.get("routed_scaling_factor")))


def _groups(cfg: _hf._Config, n_experts: int, top_k: int) -> tuple[int, int]:
    n_group, topk_group = cfg.positive_int("n_group"), cfg.positive_int("topk_group")
    if n_experts % n_group:
        raise cfg.fail("n_group", f"{n_group} groups do not divide n_routed_experts {n_experts}")
    if topk_group > n_group:
        raise cfg.fail("topk_group", f"{topk_group} exceeds n_group {n_group}")
    if top_k > topk_group * (n_experts // n_group):
        raise cfg.fail("topk_group", f"{topk_group} groups of {n_experts // n_group} experts hold fewer than "
                                     f"num_experts_per_tok {top_k}")
    return n_group, topk_group


def parse_v2(data: Mapping[str, Any], path: Path) -> ModelSpec:
    cfg = _hf.make_config(_with_defaults(data, DEFAULTS_V2, ALIASES_V2), path, ALIASES_V2)
    f = _mla_fields(cfg)
    f.update(_moe_fields(cfg, f["n_layers"]))
    if cfg.get("scoring_func", "softmax", required=False) != "softmax":
        raise cfg.fail("scoring_func", f"DeepSeek-V2 scores with softmax, got {cfg.data['scoring_func']!r}")
    if _hf.bool_key(cfg, "norm_topk_prob", False):
        raise cfg.fail("norm_topk_prob", "transformers' DeepSeek-V2 router never renormalises the top-k weights: "
                                         "true is not supported")
    method = cfg.get("topk_method")
    if method not in V2_TOPK_METHODS:
        raise cfg.fail("topk_method", f"{method!r} is not supported (only {', '.join(map(repr, V2_TOPK_METHODS))})")
    group = {}
    if method == "group_limited_greedy":
        n_group, topk_group = _groups(cfg, f["n_experts"], f["top_k"])
        group = dict(group_score="max", n_group=n_group, topk_group=topk_group)
    return ModelSpec(arch="deepseek-v2", norm_topk_prob=False, **f, **group)


def parse_v3(data: Mapping[str, Any], path: Path) -> ModelSpec:
    cfg = _hf.make_config(_with_defaults(data, DEFAULTS_V3, ALIASES_V3), path, ALIASES_V3)
    f = _mla_fields(cfg)
    f.update(_moe_fields(cfg, f["n_layers"]))
    for key, want in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
        if cfg.get(key, want, required=False) != want:
            raise cfg.fail(key, f"DeepSeek-V3 routes with {want!r} (transformers reads no other), "
                                f"got {cfg.data[key]!r}")
    if cfg.data.get("rope_interleave") is not None:
        _hf.bool_key(cfg, "rope_interleave", True)
    n_group, topk_group = _groups(cfg, f["n_experts"], f["top_k"])
    if n_group > 1 and f["n_experts"] // n_group < 2:
        raise cfg.fail("n_group", f"{n_group} groups of one expert: DeepSeek-V3 scores a group by its best two")
    group = dict(group_score="top2_sum", n_group=n_group, topk_group=topk_group) if n_group > 1 else {}
    return ModelSpec(arch="deepseek-v3", norm_topk_prob=_hf.bool_key(cfg, "norm_topk_prob", True),
                     router_scoring="sigmoid", **f, **group)


def source_name(canonical: str) -> str:
    if canonical.startswith("layers."):
        _, layer, rest = canonical.split(".", 2)
        p = f"model.layers.{layer}."
        parts = rest.split(".")
        if parts[0] == "attn":
            return f"{p}self_attn.{_ATTN[parts[1]]}.weight"
        if rest == "moe.choice_bias":
            return f"{p}mlp.gate.e_score_correction_bias"
    return NAMES.source_name(canonical)


def tensor_map(spec: ModelSpec) -> dict[str, str]:
    return {name: source_name(name) for name in canonical_names(spec)}


def is_ignored(spec: ModelSpec, name: str) -> bool:
    if NAMES.is_ignored(spec, name):
        return True
    m = _IGNORED.fullmatch(name)  # V3's multi-token-prediction layers follow the model's own
    return spec.arch == "deepseek-v3" and m is not None and int(m.group(1)) >= spec.n_layers


def rope_permutation(n: int) -> np.ndarray:
    """Interleaved pairs (0, 1), (2, 3), ... -> rotate_half order: the evens, then the odds."""
    return np.concatenate([np.arange(0, n, 2), np.arange(1, n, 2)])


def _interleaved(spec: ModelSpec, config: Mapping[str, Any]) -> bool:
    if spec.arch == "deepseek-v2":
        return True
    return bool(config.get("rope_interleave", DEFAULTS_V3["rope_interleave"]))  # (null: rotate_half, as in HF)


def view(spec: ModelSpec, config: Mapping[str, Any], canonical: str) -> View:
    """Every tensor as it is on disk; the rope rows of the query projection and of kv_a permuted when the
    family rotates interleaved pairs; YaRN's factors folded into their rows (rope.mla_row_scales)."""
    shape = canonical_shape(spec, canonical)
    src, rest = source_name(canonical), canonical.split(".", 2)[-1]
    scale = mla_row_scales(spec, rest) if canonical.startswith("layers.") else None
    scale = 1.0 if scale is None else scale
    if not _interleaved(spec, config) or rest not in ("attn.q", "attn.q_b", "attn.kv_a"):
        return View(src, shape, scale=scale)
    perm = rope_permutation(spec.head_dim)
    if rest == "attn.kv_a":
        rows = np.concatenate([np.arange(spec.kv_lora_rank), spec.kv_lora_rank + perm])
    else:
        qk, nope = spec.qk_head_dim, spec.qk_nope_head_dim
        rows = np.concatenate([h * qk + np.concatenate([np.arange(nope), nope + perm]) for h in range(spec.n_heads)])
    return View(src, shape, (rows,), scale=scale)


IMPORTERS = (
    register(Importer("deepseek-v2", ("DeepseekV2ForCausalLM",), ("deepseek_v2",), parse_v2, tensor_map,
                      is_ignored, source_name, view)),
    register(Importer("deepseek-v3", ("DeepseekV3ForCausalLM",), ("deepseek_v3",), parse_v3, tensor_map,
                      is_ignored, source_name, view)),
)
