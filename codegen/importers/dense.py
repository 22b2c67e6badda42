"""Dense HuggingFace decoders: Llama, Mistral, Qwen2, Qwen3 (LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM, Qwen3ForCausalLM): config keys -> ModelSpec, tensor names -> canonical names.

A dense model is every layer a dense MLP (ModelSpec.dense_layers = all layers, dense_ffn =
intermediate_size): the blob's DENSE_LAYERS flag with every dense_map bit set, so it has no router and
no experts and the runtime takes the dense path in every layer (n_experts = top_k = 1 are placeholders).

Family quirks, as transformers 5's modeling files define them:
- Llama: `attention_bias` (biases on q/k/v *and* o_proj) and `mlp_bias` refused; `head_dim` honoured.
- Mistral: `sliding_window` (default 4096 when the key is absent; null: full attention): every layer
  attends over the last W positions (the blob's SLIDING_WINDOW parameters); its KV cache is a ring.
- Qwen2: q/k/v biases always (o_proj none); `use_sliding_window` true refused.
- Qwen3: RMSNorm of each q and k head; `attention_bias` and `use_sliding_window` true refused.
- Rope (`rope_parameters`, or the older `rope_scaling` / `rope_theta`): codegen/rope.py (`default`,
  `llama3`, `yarn`; the frequencies are precomputed into the blob's rope_freq tensor, YaRN's attention
  factor folded into the q/k weights); `linear`, `dynamic`, `longrope` and any other type refused naming
  the key; `partial_rotary_factor` other than 1 refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..rope import rope_fields
from ..spec import ModelSpec
from . import _hf
from ._registry import Importer, register

NAMES = _hf.Names(dense="mlp")
# transformers 5.x LlamaConfig / MistralConfig / Qwen2Config / Qwen3Config have no attribute_map
ALIASES: dict[str, tuple[str, ...]] = {}
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
        features["sliding_window"] = (window,) * n_layers
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
