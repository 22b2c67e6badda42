"""Shared pieces of the Llama-style HF MoE families (Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-MoE).

They name their tensors alike (`model.layers.L.self_attn.q_proj.weight`, `model.layers.L.mlp.gate.weight`,
`model.layers.L.mlp.experts.E.gate_proj.weight`, ...) and differ in a few keys of config.json; each family
module states its own keys and passes the differences in here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..spec import ModelSpec, canonical_names
from .mixtral import GLOBAL_TENSORS, _Config, _rope_theta, attention_dims

__all__ = ["Names", "_Config", "attention_dims", "common_fields", "reject_keys", "bool_key", "layer_list"]

_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")

# Config keys of attention variants the runtime does not implement, whatever the family says it is.
UNSUPPORTED_KEYS = {
    "kv_lora_rank": "multi-head latent attention (DeepSeek-V2/V3 MLA) is not supported",
    "q_lora_rank": "multi-head latent attention (DeepSeek-V2/V3 MLA) is not supported",
    "qk_rope_head_dim": "multi-head latent attention (DeepSeek-V2/V3 MLA) is not supported",
    "clip_qkv": "clamping q/k/v (clip_qkv) is not supported",
}


@dataclass(frozen=True)
class Names:
    """HF module paths (under model.layers.L.) of a family's MoE block."""

    router: str = "mlp.gate"
    experts: str = "mlp.experts"
    shared: str = "mlp.shared_expert"
    shared_gate: str = "mlp.shared_expert_gate"
    dense: str = "mlp"

    def source_name(self, canonical: str) -> str:
        if canonical in GLOBAL_TENSORS:
            return GLOBAL_TENSORS[canonical]
        _, layer, rest = canonical.split(".", 2)
        p = f"model.layers.{layer}."
        fixed = {
            "attn_norm": "input_layernorm.weight",
            "ffn_norm": "post_attention_layernorm.weight",
            "moe.router": f"{self.router}.weight",
            "moe.shared_gate": f"{self.shared_gate}.weight",
        }
        if rest in fixed:
            return p + fixed[rest]
        parts = rest.split(".")
        if parts[0] == "attn":
            proj = parts[1]
            if proj.endswith("_norm"):
                return f"{p}self_attn.{proj}.weight"
            if proj.endswith("_bias"):
                return f"{p}self_attn.{proj[0]}_proj.bias"
            return f"{p}self_attn.{proj}_proj.weight"
        if parts[0] == "mlp":
            return f"{p}{self.dense}.{parts[1]}_proj.weight"
        if parts[1] == "shared":
            return f"{p}{self.shared}.{parts[2]}_proj.weight"
        return f"{p}{self.experts}.{parts[2]}.{parts[3]}_proj.weight"

    def tensor_map(self, spec: ModelSpec) -> dict[str, str]:
        return {name: self.source_name(name) for name in canonical_names(spec)}

    @staticmethod
    def is_ignored(spec: ModelSpec, name: str) -> bool:
        return (spec.tied and name == "lm_head.weight") or _IGNORED.fullmatch(name) is not None


def reject_keys(cfg: _Config, extra: Mapping[str, str] | None = None) -> None:
    """Refuse a config that sets (non-null) a key whose feature we do not implement, naming the key."""
    for key, why in {**UNSUPPORTED_KEYS, **(extra or {})}.items():
        if cfg.data.get(key) is not None:
            raise cfg.fail(key, f"{why} (value {cfg.data[key]!r})")


def bool_key(cfg: _Config, key: str, default: bool) -> bool:
    v = cfg.get(key, default, required=False)
    if not isinstance(v, bool):
        raise cfg.fail(key, f"must be true or false, got {v!r}")
    return v


def reject_attention_bias(cfg: _Config,
                          why: str = "biases on the attention projections (incl. o_proj) are not supported") -> None:
    """`attention_bias` true biases every attention projection, o_proj included: no runtime path has that."""
    if bool_key(cfg, "attention_bias", False):
        raise cfg.fail("attention_bias", why)


def layer_list(cfg: _Config, key: str, n_layers: int) -> list[int]:
    v = cfg.get(key, [], required=False)
    if not isinstance(v, list) or any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n_layers
                                      for i in v):
        raise cfg.fail(key, f"must be a list of layer indices in [0, {n_layers}), got {v!r}")
    return v


def common_fields(cfg: _Config, *, sliding_key: str | None = "use_sliding_window",
                  experts_key: str = "num_experts") -> dict[str, Any]:
    """ModelSpec fields every Llama-style family reads the same way."""
    hidden, n_heads, n_kv, head_dim = attention_dims(cfg)
    act = cfg.get("hidden_act", "silu", required=False)
    if act != "silu":
        raise cfg.fail("hidden_act", f"activation {act!r} is not supported (only 'silu')")
    tied = bool_key(cfg, "tie_word_embeddings", False)
    max_position = cfg.positive_int("max_position_embeddings")
    if sliding_key is not None and bool_key(cfg, sliding_key, False) and cfg.data.get("sliding_window"):
        # exact while the sequence fits in the window, and we never go beyond it
        max_position = min(max_position, cfg.positive_int("sliding_window"))
    n_experts = cfg.positive_int(experts_key)
    top_k = cfg.positive_int("num_experts_per_tok")
    if top_k > n_experts:
        raise cfg.fail("num_experts_per_tok", f"{top_k} exceeds {cfg.spelling.get(experts_key, experts_key)} "
                                              f"{n_experts}")
    return dict(
        vocab=cfg.positive_int("vocab_size"), hidden=hidden, n_layers=cfg.positive_int("num_hidden_layers"),
        n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, n_experts=n_experts, top_k=top_k,
        rms_eps=cfg.positive_float("rms_norm_eps", cfg.get("rms_norm_eps")), rope_theta=_rope_theta(cfg),
        tied=tied, max_position=max_position,
    )


def make_config(data: Mapping[str, Any], path: Path, aliases: Mapping[str, tuple[str, ...]] | None = None) -> _Config:
    """The typed view of a family's config.json, its keys' other spellings (the family's ALIASES) folded in."""
    return _Config(data, path, aliases)
