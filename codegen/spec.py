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

from .format import canonical_name, feature_flags, tensor_order

ROPE_TYPES = ("default", "llama3", "yarn")  # rope scaling the exporter's rope_freq implements (codegen/rope.py)
QK_NORMS = ("none", "head", "full")  # no q/k norm; RMSNorm per head (Qwen3); over all heads at once (OLMoE)
# How a router scores its experts: softmax of the logits (every family but DeepSeek-V3); sigmoid of the logits
# with a per-expert bias (moe.choice_bias, HF e_score_correction_bias) added for choosing only (DeepSeek-V3)
ROUTER_SCORINGS = ("softmax", "sigmoid")
# Group-limited top-k (DeepSeek n_group / topk_group): how a group of experts is scored: none (plain top-k),
# its best expert (DeepSeek-V2 group_limited_greedy), the sum of its best two (DeepSeek-V3)
GROUP_SCORES = ("none", "max", "top2_sum")

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
    # Family features (defaults: Mixtral). See README "Model families" for their HF origins.
    qkv_bias: bool = False  # q/k/v projections carry biases (attn.{q,k,v}_bias)
    qk_norm: str = "none"  # one of QK_NORMS (attn.q_norm / attn.k_norm)
    norm_topk_prob: bool = True  # renormalise the top-k routing weights to sum 1
    routed_scale: float = 1.0  # routing weights multiplied by this (DeepSeek routed_scaling_factor)
    shared_ffn: int = 0  # intermediate size of the always-on shared expert (0: none)
    shared_gate: bool = False  # shared expert output scaled by sigmoid(moe.shared_gate . x) (Qwen2-MoE)
    dense_ffn: int = 0  # intermediate size of the dense MLP of the layers in dense_layers
    dense_layers: tuple[int, ...] = ()  # layers with a dense MLP instead of the MoE block, increasing
    # Rope scaling (HF rope_parameters): "default", or "llama3" with its factor, low/high frequency factors and
    # original_max_position_embeddings. Only the rope_freq tensor the exporter derives depends on them.
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq: float = 1.0
    rope_high_freq: float = 4.0
    rope_original_max: int = 0
    # YaRN (rope_type "yarn", with rope_factor and rope_original_max): the correction range's rotations, its
    # floor/ceil, and the attention factor (folded into the q/k weights at import: codegen/rope.py)
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_truncate: bool = True
    rope_attention_factor: float = 1.0
    rope_mscale_all_dim: float = 0.0  # YaRN's mscale_all_dim (DeepSeek's softmax scale: rope.softmax_mscale)
    # Sliding-window attention (Mistral, gpt-oss's sliding layers): the window of each layer in positions,
    # 0 for full attention; () when no layer has one.
    sliding_window: tuple[int, ...] = ()
    # gpt-oss: attention sinks (attn.sinks, a logit per head), o_proj bias (attn.o_bias), router and expert
    # biases (moe.router_bias, experts.E.{gate,up,down}_bias), the experts' clamped SwiGLU (limit 0: SiLU)
    attn_sinks: bool = False
    o_bias: bool = False
    expert_bias: bool = False
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 0.0
    # Multi-head latent attention (DeepSeek-V2/V3 MLA) when kv_lora_rank > 0: keys and values come from one
    # latent of kv_lora_rank per position (attn.kv_a: latent ‖ the shared rope key of head_dim, attn.kv_a_norm,
    # attn.kv_b: per head qk_nope_head_dim key rows then v_head_dim value rows), queries of qk_nope_head_dim +
    # head_dim per head from attn.q or, when q_lora_rank > 0, attn.q_a, attn.q_a_norm and attn.q_b. head_dim
    # is the rope part (HF qk_rope_head_dim); its rows are stored in rotate_half order (the importer permutes
    # DeepSeek's interleaved pairs). n_kv_heads equals n_heads.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    router_scoring: str = "softmax"  # one of ROUTER_SCORINGS
    group_score: str = "none"  # one of GROUP_SCORES
    n_group: int = 1  # experts in n_group equal groups; the top-k is taken within the best topk_group of them
    topk_group: int = 1

    def __post_init__(self) -> None:
        for name in ("dense_layers", "sliding_window"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        problem = _first_problem(self)
        if problem is not None:
            raise ValueError(f"invalid ModelSpec: {problem}")

    def is_dense(self, layer: int) -> bool:
        return layer in self.dense_layers

    @property
    def all_dense(self) -> bool:
        """A dense model (Llama, Mistral, Qwen2, Qwen3): no router and no experts in any layer."""
        return len(self.dense_layers) == self.n_layers

    @property
    def moe_layers(self) -> list[int]:
        return [layer for layer in range(self.n_layers) if layer not in self.dense_layers]

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def qk_head_dim(self) -> int:
        """Width of one query (and key) head: the whole head_dim, or with MLA its nope part and rope part."""
        return self.qk_nope_head_dim + self.head_dim if self.mla else self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of the concatenated query heads (rows of attn.q / attn.q_b)."""
        return self.n_heads * self.qk_head_dim

    @property
    def o_dim(self) -> int:
        """Width of the concatenated attention output heads (columns of attn.o)."""
        return self.n_heads * (self.v_head_dim if self.mla else self.head_dim)

    def latent_kv_row(self) -> int:
        """f32 elements one position of one layer keeps in an MLA cache: the latent and the rope key."""
        return self.kv_lora_rank + self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the concatenated key (or value) heads."""
        return self.n_kv_heads * self.head_dim

    def param_count(self) -> int:
        """Number of weights in the canonical tensors (lm_head counted only when untied)."""
        return sum(math.prod(canonical_shape(self, n)) for n in canonical_names(self))

    def active_param_count(self) -> int:
        """Weights one token reads: everything but the experts it is not routed to."""
        expert = 3 * self.hidden * self.ffn
        return self.param_count() - len(self.moe_layers) * (self.n_experts - self.top_k) * expert

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["dense_layers"] = list(self.dense_layers)
        data["sliding_window"] = list(self.sliding_window)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelSpec:
        fields = dataclasses.fields(cls)
        return cls(**{f.name: data[f.name] for f in fields
                      if f.name in data or f.default is dataclasses.MISSING})


def _first_problem(s: ModelSpec) -> str | None:
    from .importers import FAMILIES  # the registry (importers import this module)

    if s.arch not in FAMILIES:
        return f"arch {s.arch!r} is not one of {', '.join(FAMILIES)}"
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
    for name in ("qkv_bias", "norm_topk_prob", "shared_gate", "attn_sinks", "o_bias", "expert_bias"):
        if not isinstance(getattr(s, name), bool):
            return f"{name} must be a bool, got {getattr(s, name)!r}"
    if s.qk_norm not in QK_NORMS:
        return f"qk_norm {s.qk_norm!r} is not one of {', '.join(QK_NORMS)}"
    v = s.routed_scale
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        return f"routed_scale must be a positive finite number, got {v!r}"
    for name in ("shared_ffn", "dense_ffn"):
        v = getattr(s, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            return f"{name} must be a non-negative integer, got {v!r}"
    if s.shared_gate and not s.shared_ffn:
        return "shared_gate without a shared expert (shared_ffn 0)"
    d = s.dense_layers
    if any(not isinstance(i, int) or isinstance(i, bool) for i in d) or list(d) != sorted(set(d)) \
            or (d and not 0 <= d[0] <= d[-1] < s.n_layers):
        return f"dense_layers must be increasing layer indices below {s.n_layers}, got {d!r}"
    if bool(d) != bool(s.dense_ffn):
        return "dense_layers and dense_ffn must be given together"
    if s.rope_type == "yarn":
        for name in ("rope_factor", "rope_beta_fast", "rope_beta_slow", "rope_attention_factor"):
            v = getattr(s, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                return f"{name} must be a positive finite number, got {v!r}"
        if not isinstance(s.rope_original_max, int) or isinstance(s.rope_original_max, bool) \
                or s.rope_original_max <= 0:
            return f"rope_original_max must be a positive integer, got {s.rope_original_max!r}"
    for name in ("swiglu_alpha", "swiglu_limit"):
        v = getattr(s, name)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            return f"{name} must be a non-negative finite number, got {v!r}"
    w = s.sliding_window
    if w and (len(w) != s.n_layers or any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < 1 << 32
                                          for i in w)):
        return f"sliding_window must be {s.n_layers} windows (u32, 0 for full attention), got {w!r}"
    if s.rope_type not in ROPE_TYPES:
        return f"rope_type {s.rope_type!r} is not one of {', '.join(ROPE_TYPES)}"
    if s.rope_type == "llama3":
        for name in ("rope_factor", "rope_low_freq", "rope_high_freq"):
            v = getattr(s, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                return f"{name} must be a positive finite number, got {v!r}"
        if s.rope_high_freq <= s.rope_low_freq:
            return "rope_high_freq must exceed rope_low_freq"
        if not isinstance(s.rope_original_max, int) or isinstance(s.rope_original_max, bool) \
                or s.rope_original_max <= 0:
            return f"rope_original_max must be a positive integer, got {s.rope_original_max!r}"
    problem = _mla_problem(s)
    if problem is not None:
        return problem
    if len(d) > 256 or (d and d[-1] >= 256):
        return "dense layers beyond layer 255 are not supported by the blob format"
    return None


def _mla_problem(s: ModelSpec) -> str | None:
    for name in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "v_head_dim", "n_group", "topk_group"):
        v = getattr(s, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < (1 if name in ("n_group", "topk_group") else 0):
            return f"{name} must be a {'positive' if name in ('n_group', 'topk_group') else 'non-negative'} " \
                   f"integer, got {v!r}"
    if s.mla and (not s.qk_nope_head_dim or not s.v_head_dim):
        return "MLA (kv_lora_rank > 0) needs qk_nope_head_dim and v_head_dim"
    if not s.mla and (s.q_lora_rank or s.qk_nope_head_dim or s.v_head_dim):
        return "q_lora_rank, qk_nope_head_dim and v_head_dim are MLA fields (kv_lora_rank 0)"
    if s.mla and s.n_kv_heads != s.n_heads:
        return f"MLA needs n_kv_heads equal to n_heads, got {s.n_kv_heads} and {s.n_heads}"
    if s.router_scoring not in ROUTER_SCORINGS:
        return f"router_scoring {s.router_scoring!r} is not one of {', '.join(ROUTER_SCORINGS)}"
    if s.group_score not in GROUP_SCORES:
        return f"group_score {s.group_score!r} is not one of {', '.join(GROUP_SCORES)}"
    if s.group_score == "none" and (s.n_group, s.topk_group) != (1, 1):
        return "n_group and topk_group other than 1 need a group_score"
    if (s.group_score, s.router_scoring) in (("max", "sigmoid"), ("top2_sum", "softmax")):
        return f"group_score {s.group_score} does not go with router_scoring {s.router_scoring}"
    if s.group_score != "none":
        if s.n_experts % s.n_group:
            return f"n_experts {s.n_experts} is not a multiple of n_group {s.n_group}"
        if s.topk_group > s.n_group:
            return f"topk_group {s.topk_group} exceeds n_group {s.n_group}"
        if s.top_k > s.topk_group * (s.n_experts // s.n_group):
            return f"top_k {s.top_k} exceeds the experts of topk_group {s.topk_group} groups"
        if s.group_score == "top2_sum" and s.n_experts // s.n_group < 2:
            return "group_score top2_sum needs at least 2 experts a group"
    return None


def canonical_names(spec: ModelSpec) -> list[str]:
    """All canonical tensor names of a model that come from the checkpoint, in the blob's table order
    (codegen/format.py; the blob adds the tensors the exporter derives, such as rope_freq)."""
    order = tensor_order(feature_flags(spec), spec.n_layers, spec.n_experts, spec.dense_layers)
    return [canonical_name(k, layer, e) for k, layer, e in order if not k.derived]


def _layer_shape(spec: ModelSpec, layer: int, rest: str) -> tuple[int, ...] | None:
    h = spec.hidden
    fixed = {
        "attn_norm": (h,),
        "ffn_norm": (h,),
        "attn.o": (h, spec.o_dim),
    }
    if spec.mla:
        r, nh = spec.kv_lora_rank, spec.n_heads
        fixed.update({"attn.kv_a": (r + spec.head_dim, h), "attn.kv_a_norm": (r,),
                      "attn.kv_b": (nh * (spec.qk_nope_head_dim + spec.v_head_dim), r)})
        if spec.q_lora_rank:
            fixed.update({"attn.q_a": (spec.q_lora_rank, h), "attn.q_a_norm": (spec.q_lora_rank,),
                          "attn.q_b": (spec.q_dim, spec.q_lora_rank)})
        else:
            fixed["attn.q"] = (spec.q_dim, h)
    else:
        fixed.update({"attn.q": (spec.q_dim, h), "attn.k": (spec.kv_dim, h), "attn.v": (spec.kv_dim, h)})
    if spec.qkv_bias:
        fixed.update({"attn.q_bias": (spec.q_dim,), "attn.k_bias": (spec.kv_dim,), "attn.v_bias": (spec.kv_dim,)})
    if spec.attn_sinks:
        fixed["attn.sinks"] = (spec.n_heads,)
    if spec.o_bias:
        fixed["attn.o_bias"] = (h,)
    if spec.qk_norm == "head":
        fixed.update({"attn.q_norm": (spec.head_dim,), "attn.k_norm": (spec.head_dim,)})
    elif spec.qk_norm == "full":
        fixed.update({"attn.q_norm": (spec.q_dim,), "attn.k_norm": (spec.kv_dim,)})
    if spec.is_dense(layer):
        f = spec.dense_ffn
        fixed.update({"mlp.gate": (f, h), "mlp.up": (f, h), "mlp.down": (h, f)})
    else:
        fixed["moe.router"] = (spec.n_experts, h)
        if spec.expert_bias:
            fixed["moe.router_bias"] = (spec.n_experts,)
        if spec.router_scoring == "sigmoid":
            fixed["moe.choice_bias"] = (spec.n_experts,)
        if spec.shared_gate:
            fixed["moe.shared_gate"] = (1, h)
        if spec.shared_ffn:
            f = spec.shared_ffn
            fixed.update({"moe.shared.gate": (f, h), "moe.shared.up": (f, h), "moe.shared.down": (h, f)})
    if rest in fixed:
        return fixed[rest]
    if spec.is_dense(layer):
        return None
    parts = rest.split(".")
    if len(parts) == 4 and parts[:2] == ["moe", "experts"] and _index(parts[2], spec.n_experts) is not None:
        shapes = {"gate": (spec.ffn, h), "up": (spec.ffn, h), "down": (h, spec.ffn)}
        if spec.expert_bias:
            shapes.update({"gate_bias": (spec.ffn,), "up_bias": (spec.ffn,), "down_bias": (h,)})
        return shapes.get(parts[3])
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
        shape = _layer_shape(spec, int(parts[1]), parts[2])
        if shape is not None:
            return shape
    raise KeyError(f"{name}: not a canonical tensor name of this model")
