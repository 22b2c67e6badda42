"""Rotary embeddings: the config's rope parameters -> ModelSpec fields, and the inverse frequencies and
attention factor transformers computes from them (modeling_rope_utils.py of transformers 5). Every
importer reads its rope keys through rope_fields(); the exporter's ROPE_FREQ tensor and the numpy
reference take rope_inv_freq().

Types: `default`; `llama3` (_compute_llama3_parameters); `yarn` (_compute_yarn_parameters: factor,
beta_fast, beta_slow, original_max_position_embeddings, mscale / mscale_all_dim or attention_factor,
truncate). YaRN's attention factor multiplies cos and sin in transformers, so both the rotated q and the
rotated k: it is folded exactly into the weights that produce them (weight_scale(): the q and k
projections and their biases, or with q/k norms the norm weights, which come after the biases), since
rotary is linear; the runtime needs nothing new. `linear`, `dynamic`, `longrope` and any other type are
refused naming the key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .importers.mixtral import _Config
    from .spec import ModelSpec

F32 = np.float32
ROPE_TYPES = ("default", "llama3", "yarn")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor")
_YARN_KEYS = ("factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
              "original_max_position_embeddings", "truncate", "rope_theta", "rope_type", "type",
              "partial_rotary_factor")


def _orig_max(cfg: _Config, key: str, params: Mapping[str, Any]) -> int:
    orig = params.get("original_max_position_embeddings", cfg.data.get("original_max_position_embeddings",
                                                                       cfg.data.get("max_position_embeddings")))
    if isinstance(orig, bool) or not isinstance(orig, int) or orig <= 0:
        raise cfg.fail(f"{key}.original_max_position_embeddings", f"must be a positive integer, got {orig!r}")
    return orig


def _number(cfg: _Config, where: str, v: object, positive: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or (positive and v <= 0):
        raise cfg.fail(where, f"must be a {'positive ' if positive else ''}finite number, got {v!r}")
    return float(v)


def get_mscale(scale: float, m: float = 1.0) -> float:
    """transformers' get_mscale / yarn_get_mscale: 0.1·m·ln(scale) + 1, 1 for a scale up to 1."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def yarn_attention_factor(factor: float, mscale: float | None, mscale_all_dim: float | None) -> float:
    """transformers' default YaRN attention factor (0.1·m·ln(factor) + 1, the paper's), as a ratio of the
    two when mscale and mscale_all_dim are both set (DeepSeek)."""
    if mscale and mscale_all_dim:
        return float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
    return get_mscale(factor)


def _yarn_fields(cfg: _Config, key: str, params: Mapping[str, Any]) -> dict[str, Any]:
    for k in params:
        if k not in _YARN_KEYS:
            raise cfg.fail(f"{key}.{k}", "is not a key of rope_type 'yarn'")
    orig = _orig_max(cfg, key, params)
    factor = params.get("factor")
    if factor is None:  # transformers: the ratio of the context lengths (DeepSeek-V3's spelling)
        factor = cfg.positive_int("max_position_embeddings") / orig
    factor = _number(cfg, f"{key}.factor", factor)
    if factor < 1.0:
        raise cfg.fail(f"{key}.factor", f"must be at least 1, got {factor!r}")
    ms = {k: None if params.get(k) is None else _number(cfg, f"{key}.{k}", params[k], positive=False)
          for k in ("mscale", "mscale_all_dim")}
    att = params.get("attention_factor")
    att = (yarn_attention_factor(factor, ms["mscale"], ms["mscale_all_dim"]) if att is None
           else _number(cfg, f"{key}.attention_factor", att))
    fast = _number(cfg, f"{key}.beta_fast", params.get("beta_fast") or 32)
    slow = _number(cfg, f"{key}.beta_slow", params.get("beta_slow") or 1)
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        raise cfg.fail(f"{key}.truncate", f"must be true or false, got {truncate!r}")
    return dict(rope_type="yarn", rope_factor=factor, rope_original_max=orig, rope_beta_fast=fast,
                rope_beta_slow=slow, rope_truncate=truncate, rope_attention_factor=att,
                rope_mscale_all_dim=ms["mscale_all_dim"] or 0.0)


def rope_fields(cfg: _Config) -> dict[str, Any]:
    """rope_theta and the rope scaling of `rope_parameters` (transformers >= 5) or `rope_scaling` (older)."""
    fields: dict[str, Any] = {}
    key = "rope_parameters" if cfg.data.get("rope_parameters") is not None else "rope_scaling"
    params = cfg.data.get(key)
    if params is not None and not isinstance(params, dict):
        raise cfg.fail(key, f"must be a JSON object, got {params!r}")
    params = params or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise cfg.fail(key, f"rope_type {rope_type!r} is not supported (only {', '.join(map(repr, ROPE_TYPES))})")
    theta = params.get("rope_theta", cfg.data.get("rope_theta"))
    where = f"{key}.rope_theta" if params.get("rope_theta") is not None else "rope_theta"
    fields["rope_theta"] = cfg.positive_float(where, theta if theta is not None else cfg.get("rope_theta"))
    prf = params.get("partial_rotary_factor", cfg.data.get("partial_rotary_factor"))
    if prf is not None and prf != 1.0:
        raise cfg.fail("partial_rotary_factor", f"a partial rotary embedding ({prf!r}) is not supported")
    if rope_type == "llama3":
        vals = {}
        for k in _LLAMA3_KEYS:
            if params.get(k) is None:
                raise cfg.fail(f"{key}.{k}", "missing required key of rope_type 'llama3'")
            vals[k] = cfg.positive_float(f"{key}.{k}", params[k])
        if vals["high_freq_factor"] <= vals["low_freq_factor"]:
            raise cfg.fail(f"{key}.high_freq_factor", "must exceed low_freq_factor")
        orig = params.get("original_max_position_embeddings", cfg.data.get("max_position_embeddings"))
        if isinstance(orig, bool) or not isinstance(orig, int) or orig <= 0:
            raise cfg.fail(f"{key}.original_max_position_embeddings", f"must be a positive integer, got {orig!r}")
        fields.update(rope_type="llama3", rope_factor=vals["factor"], rope_low_freq=vals["low_freq_factor"],
                      rope_high_freq=vals["high_freq_factor"], rope_original_max=orig)
    elif rope_type == "yarn":
        fields.update(_yarn_fields(cfg, key, params))
    return fields


def base_power(theta: float, d: int) -> np.ndarray:
    """theta ** (arange(0, d, 2) / d) in float32 as HF computes it: the float32 exponent is exact as in HF;
    the power is rounded once from float64 (torch's own float32 pow may differ from it by an ulp), so the
    result does not depend on the libm at hand."""
    exponent = np.arange(0, d, 2, dtype=F32) / F32(d)
    return (np.float64(theta) ** exponent.astype(np.float64)).astype(F32)


def rope_inv_freq(spec: ModelSpec) -> np.ndarray:
    """The rotary inverse frequencies (head_dim / 2 float32) of the spec's rope type."""
    power = base_power(spec.rope_theta, spec.head_dim)
    if spec.rope_type == "yarn":
        return yarn_inv_freq(spec, power)
    inv_freq = F32(1.0) / power
    return llama3_scaling(spec, inv_freq) if spec.rope_type == "llama3" else inv_freq


def llama3_scaling(spec: ModelSpec, inv_freq: np.ndarray) -> np.ndarray:
    """transformers' _compute_llama3_parameters on float32 inverse frequencies, step by step in float32:
    long wavelengths divided by `factor`, short ones kept, the band between interpolated."""
    factor, low, high = F32(spec.rope_factor), F32(spec.rope_low_freq), F32(spec.rope_high_freq)
    old = F32(spec.rope_original_max)
    low_wavelen = spec.rope_original_max / spec.rope_low_freq
    high_wavelen = spec.rope_original_max / spec.rope_high_freq
    wavelen = F32(2 * np.pi) / inv_freq
    scaled = np.where(wavelen > F32(low_wavelen), inv_freq / factor, inv_freq).astype(F32)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (F32(1.0) - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < F32(high_wavelen)) & ~(wavelen > F32(low_wavelen))
    return np.where(medium, smoothed, scaled).astype(F32)


def yarn_inv_freq(spec: ModelSpec, pos_freqs: np.ndarray) -> np.ndarray:
    """transformers' _compute_yarn_parameters in float32: the interpolated (1 / (factor·base^(2i/d))) and
    extrapolated (1 / base^(2i/d)) frequencies blended by a linear ramp between the correction range's
    dims, found from beta_fast and beta_slow rotations over original_max_position_embeddings (floor / ceil
    with truncate)."""
    d, base, orig = spec.head_dim, spec.rope_theta, spec.rope_original_max

    def correction_dim(rotations: float) -> float:
        return (d * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(spec.rope_beta_fast), correction_dim(spec.rope_beta_slow)
    if spec.rope_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # transformers: prevent a singularity
    extrapolation = F32(1.0) / pos_freqs
    interpolation = F32(1.0) / (F32(spec.rope_factor) * pos_freqs)
    ramp = np.clip((np.arange(d // 2, dtype=F32) - F32(low)) / F32(high - low), 0, 1).astype(F32)
    extra = F32(1.0) - ramp
    return (interpolation * (F32(1.0) - extra) + extrapolation * extra).astype(F32)


def softmax_mscale(spec: ModelSpec) -> float:
    """DeepSeek-V2/V3's yarn_apply_mscale: their attention's softmax scale is multiplied by
    get_mscale(factor, mscale_all_dim)² when the rope type is not default and mscale_all_dim is set; 1 else."""
    if spec.rope_type == "default" or not spec.rope_mscale_all_dim:
        return 1.0
    return get_mscale(spec.rope_factor, spec.rope_mscale_all_dim) ** 2


def mla_row_scales(spec: ModelSpec, rest: str) -> np.ndarray | None:
    """DeepSeek's YaRN folded exactly into the MLA projections, per output row (a (rows, 1) column; None
    when nothing is folded). transformers multiplies cos and sin by the attention factor A (rope.py's
    yarn_attention_factor) for both q_pe and k_pe, and the scores by softmax_mscale() = S, so a score is
    S·scale·(q_nope·k_nope + A·q_pe·A·k_pe): every query row (attn.q, attn.q_b) takes S, its rope rows A·S
    too, and kv_a's rope rows (the shared k_pe, which no norm follows) A. Rotary is linear in its input."""
    att = spec.rope_attention_factor if spec.rope_type == "yarn" else 1.0
    s = softmax_mscale(spec)
    if att == 1.0 and s == 1.0:
        return None
    if rest == "attn.kv_a":
        col = np.concatenate([np.ones(spec.kv_lora_rank), np.full(spec.head_dim, att)])
    elif rest in ("attn.q", "attn.q_b"):
        head = np.concatenate([np.full(spec.qk_nope_head_dim, s), np.full(spec.head_dim, att * s)])
        col = np.tile(head, spec.n_heads)
    else:
        return None
    return col[:, None]


def weight_scale(spec: ModelSpec, canonical: str) -> float:
    """The factor folded into a canonical tensor at import for the rope type: YaRN's attention factor on
    what makes the rotated q and k (transformers multiplies cos and sin by it); 1 for everything else (MLA:
    only the rope rows of its projections, mla_row_scales(), which the DeepSeek importer's views fold)."""
    if spec.rope_type != "yarn" or spec.rope_attention_factor == 1.0 or not canonical.startswith("layers.") \
            or spec.mla:
        return 1.0
    rest = canonical.split(".", 2)[2]
    folded = ("attn.q_norm", "attn.k_norm") if spec.qk_norm != "none" else (
        "attn.q", "attn.k", "attn.q_bias", "attn.k_bias")
    return spec.rope_attention_factor if rest in folded else 1.0
