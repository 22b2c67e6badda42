"""HuggingFace Mixtral (MixtralForCausalLM): config.json keys -> ModelSpec, tensor names -> canonical names."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ExportError
from ..spec import ModelSpec, canonical_names
from ._registry import Importer, register

ARCHITECTURES = ("MixtralForCausalLM",)
MODEL_TYPES = ("mixtral",)

# HF names of the per-expert projections: w1 = gate, w2 = down, w3 = up.
_EXPERT_PROJ = {"gate": "w1", "down": "w2", "up": "w3"}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn.q": "self_attn.q_proj",
    "attn.k": "self_attn.k_proj",
    "attn.v": "self_attn.v_proj",
    "attn.o": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "moe.router": "block_sparse_moe.gate",
}
# Non-persistent rotary buffers some exporters wrote out; HF drops them on load, so do we.
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")

# What model.bin and the runtime can hold (runtime_c/FORMAT.md): dimensions are u32 fields, a
# tensor's layer and expert are u16, and the runtime routes a token to at most 16 experts. Checked
# on the config keys, so an absurd config fails with its key named before any work is sized by it.
_DIM_LIMIT = (2**32 - 1, "the largest dimension model.bin can hold")
_EXPERTS_LIMIT = (2**16 - 1, "the most experts model.bin can hold")
_INT_LIMITS = {
    "num_hidden_layers": (2**16 - 1, "the most layers model.bin can hold"),
    "num_local_experts": _EXPERTS_LIMIT,
    "num_experts": _EXPERTS_LIMIT,
    "n_routed_experts": _EXPERTS_LIMIT,
    "num_experts_per_tok": (16, "the most experts per token the runtime routes to"),
}
_UNLIMITED = ("max_position_embeddings", "sliding_window")  # only ever capped: any size will do
_FLOAT32_MAX = 3.4028234663852886e38


# Other spellings of a key that the family's transformers config class accepts (its `attribute_map`):
# canonical key -> aliases. transformers 5.x MixtralConfig: {"num_experts": "num_local_experts"}.
ALIASES: dict[str, tuple[str, ...]] = {"num_local_experts": ("num_experts",)}


class _Config:
    """Typed access to config.json keys; every failure names config.json and the key (as spelt there).

    `aliases` (canonical key -> other spellings, from the family's HF attribute_map) are folded into the
    canonical key; two spellings with different values are refused, naming both."""

    def __init__(self, data: Mapping[str, Any], path: Path,
                 aliases: Mapping[str, tuple[str, ...]] | None = None) -> None:
        self.path = path
        self.spelling: dict[str, str] = {}
        folded = dict(data)
        for key, others in (aliases or {}).items():
            given = [k for k in (key, *others) if folded.get(k) is not None]
            for k in given[1:]:
                if folded[k] != folded[given[0]] or type(folded[k]) is not type(folded[given[0]]):
                    raise ExportError(path, f"keys {given[0]!r} and {k!r} are spellings of one setting but "
                                            f"differ: {folded[given[0]]!r} vs {folded[k]!r}")
            if given:
                folded[key] = folded[given[0]]
                self.spelling[key] = given[0]
        self.data = folded

    def fail(self, key: str, message: str) -> ExportError:
        return ExportError(self.path, f"key {self.spelling.get(key, key)!r}: {message}")

    def get(self, key: str, default: Any = None, required: bool = True) -> Any:
        if key not in self.data or self.data[key] is None:
            if required:
                raise self.fail(key, "missing required key")
            return default
        return self.data[key]

    def positive_int(self, key: str, default: int | None = None) -> int:
        v = self.get(key, default, required=default is None)
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.fail(key, f"must be an integer, got {v!r}")
        if v <= 0:
            raise self.fail(key, f"must be positive, got {v}")
        limit, what = _INT_LIMITS.get(key, _DIM_LIMIT)
        if key not in _UNLIMITED and v > limit:
            raise self.fail(key, f"{v} exceeds {limit}, {what}")
        return v

    def positive_float(self, key: str, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise self.fail(key, f"must be a number, got {v!r}")
        if v <= 0:
            raise self.fail(key, f"must be positive, got {v}")
        if v > _FLOAT32_MAX:
            raise self.fail(key, f"{v!r} is beyond the float32 range model.bin stores it in")
        return float(v)


def _rope_theta(cfg: _Config) -> float:
    """rope_theta from `rope_parameters` (transformers >= 5) or the older top-level key."""
    params = cfg.data.get("rope_parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise cfg.fail("rope_parameters", f"must be a JSON object, got {params!r}")
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise cfg.fail("rope_parameters", f"rope_type {rope_type!r} is not supported (only 'default')")
        if params.get("rope_theta") is not None:
            return cfg.positive_float("rope_parameters.rope_theta", params["rope_theta"])
    scaling = cfg.data.get("rope_scaling")
    if scaling is not None:
        rope_type = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else scaling
        if rope_type != "default":
            raise cfg.fail("rope_scaling", f"rope scaling {rope_type!r} is not supported (only 'default')")
    return cfg.positive_float("rope_theta", cfg.get("rope_theta"))


def attention_dims(cfg: _Config) -> tuple[int, int, int, int]:
    """(hidden, n_heads, n_kv_heads, head_dim); head_dim from its key or hidden / heads, as HF does."""
    hidden = cfg.positive_int("hidden_size")
    n_heads = cfg.positive_int("num_attention_heads")
    n_kv = cfg.positive_int("num_key_value_heads", n_heads)
    if n_heads % n_kv:
        raise cfg.fail("num_key_value_heads", f"num_attention_heads {n_heads} is not a multiple of {n_kv}")
    if cfg.data.get("head_dim") is not None:
        head_dim = cfg.positive_int("head_dim")
    elif hidden % n_heads:
        raise cfg.fail("num_attention_heads", f"hidden_size {hidden} is not a multiple of {n_heads} "
                                              "and there is no head_dim")
    else:
        head_dim = hidden // n_heads
    if head_dim % 2:
        raise cfg.fail("head_dim", f"head dimension {head_dim} is odd; rotary embedding needs pairs")
    return hidden, n_heads, n_kv, head_dim


def parse_config(data: Mapping[str, Any], path: Path) -> ModelSpec:
    """Build the ModelSpec of a Mixtral config.json, rejecting what the reference cannot compute exactly."""
    cfg = _Config(data, path, ALIASES)
    hidden, n_heads, n_kv, head_dim = attention_dims(cfg)
    n_experts = cfg.positive_int("num_local_experts")
    top_k = cfg.positive_int("num_experts_per_tok")
    if top_k > n_experts:
        raise cfg.fail("num_experts_per_tok", f"{top_k} exceeds num_local_experts {n_experts}")
    act = cfg.get("hidden_act", "silu", required=False)
    if act != "silu":
        raise cfg.fail("hidden_act", f"activation {act!r} is not supported (only 'silu')")
    tied = cfg.get("tie_word_embeddings", False, required=False)
    if not isinstance(tied, bool):
        raise cfg.fail("tie_word_embeddings", f"must be true or false, got {tied!r}")
    max_position = cfg.positive_int("max_position_embeddings")
    window = cfg.data.get("sliding_window")
    if window is not None:
        # A sliding window of W changes nothing while the sequence fits in W tokens, so the
        # model is exact up to min(W, max_position) positions and we never go beyond that.
        max_position = min(max_position, cfg.positive_int("sliding_window"))
    return ModelSpec(
        arch="mixtral",
        vocab=cfg.positive_int("vocab_size"),
        hidden=hidden,
        n_layers=cfg.positive_int("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        ffn=cfg.positive_int("intermediate_size"),
        n_experts=n_experts,
        top_k=top_k,
        rms_eps=cfg.positive_float("rms_norm_eps", cfg.get("rms_norm_eps")),
        rope_theta=_rope_theta(cfg),
        tied=tied,
        max_position=max_position,
    )


# HF names of the tensors outside the layers, the same in every family
GLOBAL_TENSORS = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight",
                  "lm_head": "lm_head.weight"}


def source_name(canonical: str) -> str:
    """The HF tensor name of a canonical name."""
    if canonical in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[canonical]
    _, layer, rest = canonical.split(".", 2)
    if rest in _LAYER_TENSORS:
        return f"model.layers.{layer}.{_LAYER_TENSORS[rest]}.weight"
    _, _, expert, proj = rest.split(".")
    return f"model.layers.{layer}.block_sparse_moe.experts.{expert}.{_EXPERT_PROJ[proj]}.weight"


def tensor_map(spec: ModelSpec) -> dict[str, str]:
    """canonical name -> HF tensor name, for every tensor the model needs, in canonical order."""
    return {name: source_name(name) for name in canonical_names(spec)}


def is_ignored(spec: ModelSpec, name: str) -> bool:
    """Tensors a checkpoint may carry that the model does not use (a tied lm_head, rotary buffers)."""
    return (spec.tied and name == "lm_head.weight") or _IGNORED.fullmatch(name) is not None


IMPORTER = register(Importer("mixtral", ARCHITECTURES, MODEL_TYPES, parse_config, tensor_map, is_ignored, source_name))
