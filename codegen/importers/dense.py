"""Dense HuggingFace decoders: Llama, Mistral, Qwen2, Qwen3 (LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM, Qwen3ForCausalLM): config keys -> ModelSpec, tensor names -> canonical names.

A dense model is every layer a dense MLP (ModelSpec.dense_layers = all layers, dense_ffn =
intermediate_size): the blob's DENSE_LAYERS flag with every dense_map bit set, so it has no router and
no experts and the runtime takes the dense path in every layer (n_experts = top_k = 1 are placeholders).

Family quirks, as transformers 5's modeling files define them:
- Llama: `attention_bias` (biases on q/k/v *and* o_proj) and `mlp_bias` refused; `head_dim` honoured.
- Mistral: `sliding_window` (default 4096 when the key is absent): attention over the last W positions.
  The model is exact while the sequence fits in the window, so max_position is capped at W (see README).
- Qwen2: q/k/v biases always (o_proj none); `use_sliding_window` true refused.
- Qwen3: RMSNorm of each q and k head; `attention_bias` and `use_sliding_window` true refused.
- Rope (`rope_parameters`, or the older `rope_scaling` / `rope_theta`): `default` and `llama3` (the
  frequencies are precomputed into the blob's rope_freq tensor); `linear`, `dynamic`, `yarn`, `longrope`
  and any other type refused naming the key; `partial_rotary_factor` other than 1 refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..spec import ModelSpec
from . import _hf
from ._registry import Importer, register

NAMES = _hf.Names(dense="mlp")
# transformers 5.x LlamaConfig / MistralConfig / Qwen2Config / Qwen3Config have no attribute_map
ALIASES: dict[str, tuple[str, ...]] = {}
ROPE_TYPES = ("default", "llama3")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor")


def rope_fields(cfg: _hf._Config) -> dict[str, Any]:
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
    return fields


def _parse(cfg: _hf._Config, arch: str, **features: Any) -> ModelSpec:
    _hf.reject_keys(cfg)
    act = cfg.get("hidden_act", "silu", required=False)
    if act != "silu":
        raise cfg.fail("hidden_act", f"activation {act!r} is not supported (only 'silu')")
    if cfg.data.get("layer_types") is not None and any(t != "full_attention" for t in cfg.data["layer_types"]):
        raise cfg.fail("layer_types", "per-layer attention types other than 'full_attention' are not supported")
    hidden, n_heads, n_kv, head_dim = _hf.attention_dims(cfg)
    n_layers = cfg.positive_int("num_hidden_layers")
    if n_layers > 256:
        raise cfg.fail("num_hidden_layers", f"{n_layers} dense layers exceed the 256 the blob's dense_map marks")
    ffn = cfg.positive_int("intermediate_size")
    max_position = cfg.positive_int("max_position_embeddings")
    window = features.pop("window", None)
    if window is not None:
        max_position = min(max_position, window)
    return ModelSpec(
        arch=arch, vocab=cfg.positive_int("vocab_size"), hidden=hidden, n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=n_kv, head_dim=head_dim, ffn=ffn, n_experts=1, top_k=1,
        rms_eps=cfg.positive_float("rms_norm_eps", cfg.get("rms_norm_eps")),
        tied=_hf.bool_key(cfg, "tie_word_embeddings", False), max_position=max_position,
        dense_ffn=ffn, dense_layers=tuple(range(n_layers)), **rope_fields(cfg), **features)


def _no_sliding(cfg: _hf._Config) -> None:
    if _hf.bool_key(cfg, "use_sliding_window", False):
        raise cfg.fail("use_sliding_window", "sliding-window attention of Qwen2/Qwen3 layers is not supported")


def parse_llama(data: Mapping[str, Any], path: Path) -> ModelSpec:
    cfg = _hf.make_config(data, path, ALIASES)
    _hf.reject_attention_bias(cfg)
    if _hf.bool_key(cfg, "mlp_bias", False):
        raise cfg.fail("mlp_bias", "biases on the MLP projections are not supported")
    return _parse(cfg, "llama")


def parse_mistral(data: Mapping[str, Any], path: Path) -> ModelSpec:
    cfg = _hf.make_config(data, path, ALIASES)
    window = 4096 if "sliding_window" not in cfg.data else cfg.data["sliding_window"]
    if window is not None:
        window = cfg.positive_int("sliding_window", window)
    return _parse(cfg, "mistral", window=window)


def parse_qwen2(data: Mapping[str, Any], path: Path) -> ModelSpec:
    cfg = _hf.make_config(data, path, ALIASES)
    _no_sliding(cfg)
    return _parse(cfg, "qwen2", qkv_bias=True)


def parse_qwen3(data: Mapping[str, Any], path: Path) -> ModelSpec:
    cfg = _hf.make_config(data, path, ALIASES)
    _no_sliding(cfg)
    _hf.reject_attention_bias(cfg)
    if cfg.data.get("head_dim") is None:  # Qwen3Config's default, not hidden / heads
        cfg.data["head_dim"] = 128
    return _parse(cfg, "qwen3", qk_norm="head")


tensor_map = NAMES.tensor_map
is_ignored = NAMES.is_ignored
IMPORTERS = tuple(register(Importer(family, (cls,), (family,), parse, tensor_map, is_ignored, NAMES.source_name))
                  for family, cls, parse in (("llama", "LlamaForCausalLM", parse_llama),
                                             ("mistral", "MistralForCausalLM", parse_mistral),
                                             ("qwen2", "Qwen2ForCausalLM", parse_qwen2),
                                             ("qwen3", "Qwen3ForCausalLM", parse_qwen3)))
