"""ModelSpec: the dimensions and constants of one model, and its canonical tensor names and shapes.

Everything after import works on canonical names (`layers.3.moe.experts.5.down`, `embed`, ...);
importers map each family's own names onto these.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ARCHES = ("mixtral",)

_INT_FIELDS = ("vocab", "hidden", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn", "n_experts", "top_k",
               "max_position")


@dataclass(frozen=True)
class ModelSpec:
    arch: str
    vocab: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    n_experts: int
    top_k: int
    rms_eps: float
    rope_theta: float
    tied: bool
    max_position: int

    def __post_init__(self) -> None:
        problem = _first_problem(self)
        if problem is not None:
            raise ValueError(f"invalid ModelSpec: {problem}")

    @property
    def q_dim(self) -> int:
        """Width of the concatenated query heads (rows of attn.q, columns of attn.o)."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the concatenated key (or value) heads."""
        return self.n_kv_heads * self.head_dim

    def param_count(self) -> int:
        """Number of weights in the canonical tensors (lm_head counted only when untied)."""
        return sum(math.prod(canonical_shape(self, n)) for n in canonical_names(self))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelSpec:
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: data[n] for n in names})


def _first_problem(s: ModelSpec) -> str | None:
    if s.arch not in ARCHES:
        return f"arch {s.arch!r} is not one of {', '.join(ARCHES)}"
    for name in _INT_FIELDS:
        v = getattr(s, name)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            return f"{name} must be a positive integer, got {v!r}"
    if s.n_heads % s.n_kv_heads:
        return f"n_heads {s.n_heads} is not a multiple of n_kv_heads {s.n_kv_heads}"
    if s.head_dim % 2:
        return f"head_dim {s.head_dim} is odd (rotary embedding needs pairs)"
    if s.top_k > s.n_experts:
        return f"top_k {s.top_k} exceeds n_experts {s.n_experts}"
    for name in ("rms_eps", "rope_theta"):
        v = getattr(s, name)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            return f"{name} must be a positive finite number, got {v!r}"
    if not isinstance(s.tied, bool):
        return f"tied must be a bool, got {s.tied!r}"
    return None


def canonical_names(spec: ModelSpec) -> list[str]:
    """All canonical tensor names of a model, in canonical order."""
    names = ["embed"]
    for layer in range(spec.n_layers):
        p = f"layers.{layer}."
        names += [p + "attn_norm", p + "attn.q", p + "attn.k", p + "attn.v", p + "attn.o", p + "ffn_norm",
                  p + "moe.router"]
        for e in range(spec.n_experts):
            names += [f"{p}moe.experts.{e}.gate", f"{p}moe.experts.{e}.down", f"{p}moe.experts.{e}.up"]
    names.append("final_norm")
    if not spec.tied:
        names.append("lm_head")
    return names


def _layer_shape(spec: ModelSpec, rest: str) -> tuple[int, ...] | None:
    h = spec.hidden
    fixed = {
        "attn_norm": (h,),
        "ffn_norm": (h,),
        "attn.q": (spec.q_dim, h),
        "attn.k": (spec.kv_dim, h),
        "attn.v": (spec.kv_dim, h),
        "attn.o": (h, spec.q_dim),
        "moe.router": (spec.n_experts, h),
    }
    if rest in fixed:
        return fixed[rest]
    parts = rest.split(".")
    if len(parts) == 4 and parts[:2] == ["moe", "experts"] and _index(parts[2], spec.n_experts) is not None:
        return {"gate": (spec.ffn, h), "up": (spec.ffn, h), "down": (h, spec.ffn)}.get(parts[3])
    return None


def _index(text: str, bound: int) -> int | None:
    if not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        return None
    i = int(text)
    return i if i < bound else None


def canonical_shape(spec: ModelSpec, name: str) -> tuple[int, ...]:
    """Shape of a canonical tensor; linear weights are (out, in) as in HF. KeyError for unknown names."""
    if name in ("embed", "lm_head"):
        if name == "lm_head" and spec.tied:
            raise KeyError(f"{name}: the model has tied embeddings, there is no separate lm_head")
        return (spec.vocab, spec.hidden)
    if name == "final_norm":
        return (spec.hidden,)
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and _index(parts[1], spec.n_layers) is not None:
        shape = _layer_shape(spec, parts[2])
        if shape is not None:
            return shape
    raise KeyError(f"{name}: not a canonical tensor name of this model")
