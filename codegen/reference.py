"""The numpy float32 reference forward pass: HuggingFace semantics of every supported family (Mixtral,
Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-MoE; the ModelSpec's feature fields select the differences),
one token at a time, KV cache.

This is the oracle the C runtime is tested against, so it favours being obviously right over being fast.
Prefill is computed token by token, which makes a prefill of n tokens identical to n single steps.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from . import rope
from .format import INT16_MAX, KV_DTYPES
from .spec import ModelSpec, canonical_names

F32 = np.float32
rope_inv_freq = rope.rope_inv_freq  # the exporter's ROPE_FREQ tensor: codegen/rope.py


class WeightSource(Protocol):
    def get(self, name: str) -> Any: ...


def rope_cos_sin(inv_freq: np.ndarray, pos: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the float32 angle pos * inv_freq, each rounded once from float64."""
    angle = (F32(pos) * inv_freq).astype(np.float64)
    return np.cos(angle).astype(F32), np.sin(angle).astype(F32)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w, all in float32 (HF multiplies by rsqrt, then by the weight)."""
    ms = np.mean(x * x, dtype=F32)
    return (x * (F32(1.0) / np.sqrt(ms + F32(eps)))) * w


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x / (F32(1.0) + np.exp(-x))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True, dtype=F32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """HF rotate_half convention on (heads, head_dim): the first half pairs with the second half."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def route(logits: np.ndarray, top_k: int, normalize: bool = True,
          scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Softmax over all experts, the top_k largest (ties -> lower index), renormalised to sum 1
    when `normalize` (HF norm_topk_prob), then multiplied by `scale` unless it is 1.

    Returns (experts in increasing index order, their weights).
    """
    probs = softmax(logits)
    chosen = np.argsort(-probs, kind="stable")[:top_k]
    weights = probs[chosen] / np.sum(probs[chosen], dtype=F32) if normalize else probs[chosen]
    if scale != 1.0:
        weights = weights * F32(scale)
    order = np.argsort(chosen)
    return chosen[order], weights[order].astype(F32)


def group_scores(choice: np.ndarray, spec: ModelSpec) -> np.ndarray:
    """The score of each of n_group equal groups of experts: its best (V2) or the sum of its best two (V3)."""
    g = choice.reshape(spec.n_group, -1)
    return g.max(axis=1) if spec.group_score == "max" else np.sort(g, axis=1)[:, -2:].sum(axis=1, dtype=F32)


def route_grouped(logits: np.ndarray, spec: ModelSpec,
                  bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek-V2/V3 routing as transformers computes it (DeepseekV2TopkRouter, DeepseekV3TopkRouter).

    Scores: softmax of the logits, or (router_scoring sigmoid) their sigmoid, to which `bias`
    (e_score_correction_bias) is added for choosing only. With a group_score the experts are n_group equal
    groups, each scored by its best choosing score (max) or the sum of its best two (top2_sum); the top_k are
    chosen within the topk_group best groups. Weights: the chosen experts' unbiased scores, divided by their
    sum + 1e-20 when sigmoid and norm_topk_prob (V2 never renormalises), times routed_scale.
    Ties go to the lower index. Returns (experts in increasing index order, their weights).
    """
    sigmoid = spec.router_scoring == "sigmoid"
    if sigmoid:
        with np.errstate(over="ignore"):
            scores = (F32(1.0) / (F32(1.0) + np.exp(-logits))).astype(F32)
        choice = scores + (bias if bias is not None else F32(0.0))
    else:
        scores = softmax(logits)
        choice = scores
    if spec.group_score != "none":
        best = np.argsort(-group_scores(choice, spec), kind="stable")[:spec.topk_group]
        keep = np.zeros(spec.n_group, dtype=bool)
        keep[best] = True
        choice = np.where(np.repeat(keep, spec.n_experts // spec.n_group), choice,
                          F32(-np.inf) if sigmoid else F32(0.0))
    chosen = np.argsort(-choice, kind="stable")[:spec.top_k]
    weights = scores[chosen]
    if sigmoid and spec.norm_topk_prob:
        weights = weights / (np.sum(weights, dtype=F32) + F32(1e-20))
    weights = (weights * F32(spec.routed_scale)).astype(F32)
    order = np.argsort(chosen)
    return chosen[order], weights[order]


MLA_NORM_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm: DeepseekV2/V3RMSNorm's default, not rms_norm_eps


def _as_f32(weights: Mapping[str, np.ndarray] | WeightSource, name: str) -> np.ndarray:
    t = weights.get(name)
    if t is None:
        raise KeyError(f"weights: missing tensor {name}")
    return np.ascontiguousarray(t, dtype=F32)


class LazyWeights:
    """Canonical name -> float32 array, fetched from a WeightSource when used. The most recently used
    arrays are kept while they fit in `cache_bytes`, so memory stays bounded whatever the model size."""

    def __init__(self, source: Mapping[str, np.ndarray] | WeightSource, cache_bytes: int) -> None:
        self.source = source
        self.cache_bytes = cache_bytes
        self.fetches = 0
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._held = 0

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._cache:
            self._cache.move_to_end(name)
            return self._cache[name]
        arr = _as_f32(self.source, name)
        self.fetches += 1
        self._cache[name] = arr
        self._held += arr.nbytes
        while self._held > self.cache_bytes and self._cache:
            self._held -= self._cache.popitem(last=False)[1].nbytes
        return arr


def _quantize_blocks(x: np.ndarray, block: int, qmax: int) -> np.ndarray:
    """Per block of `block` values, round-half-away(x * qmax / max|x|) * (max|x| / qmax), in the C code's
    float32 steps; a last partial block is quantized alone (zero-padded)."""
    x = np.asarray(x, dtype=F32).reshape(-1)
    n = x.size
    if n % block:  # a last partial block (int4 matrices of any width): its values alone, as the C code does
        x = np.concatenate([x, np.zeros(block - n % block, dtype=F32)])
    b = x.reshape(-1, block)
    amax = np.max(np.abs(b), axis=1)
    amax = np.where(amax >= F32(2.0**-100), amax, F32(0.0)).astype(F32)  # a block this small is zero
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(amax > 0, F32(qmax) / amax, F32(0.0)).astype(F32)
    f = b * inv[:, None]
    f = f + np.where(f >= 0, F32(0.5), F32(-0.5))
    q = np.clip(np.trunc(np.nan_to_num(f, nan=0.0)), -qmax, qmax).astype(F32)
    return (q * (amax / F32(qmax))[:, None]).reshape(-1)[:n]


def quantize_q8(x: np.ndarray, block: int = 32) -> np.ndarray:
    """x as the C runtime's integer matmuls see it (kernels.h cb_quantize_q8), dequantized: per block of
    `block` values, round-half-away(x * 127 / max|x|) * (max|x| / 127), in the C code's float32 steps."""
    return _quantize_blocks(x, block, 127)


def quantize_q16(x: np.ndarray, block: int = 32) -> np.ndarray:
    """x as an int16 matrix (quantize.quantize_int16, kernels.h "int16 matmuls") takes it, dequantized: the
    steps of quantize_q8 with INT16_MAX in place of 127."""
    return _quantize_blocks(x, block, INT16_MAX)


def kv_round(x: np.ndarray, kv: str) -> np.ndarray:
    """One position's keys or values (n_kv_heads, head_dim) as a `kv` cache holds them, back in float32:
    f16 rounded to nearest even; int8 per head as the runtime quantizes it (the steps of quantize_q8 with
    a block of head_dim: round-half-away(x * 127 / max|x|), scale max|x| / 127)."""
    if kv == "f16":
        return x.astype(np.float16).astype(F32)
    if kv == "int8":
        return quantize_q8(x, block=x.shape[-1]).reshape(x.shape)
    return x


def clamped_swiglu(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss's expert activation (transformers GptOssExperts._apply_gate): the gate clamped above at
    limit, up clamped to [-limit, limit], (up + 1) * gate * sigmoid(alpha * gate); NaNs stay NaN."""
    lim = F32(limit)
    g = np.where(gate > lim, lim, gate).astype(F32)
    u = np.where(up > lim, lim, np.where(up < -lim, -lim, up)).astype(F32)
    with np.errstate(over="ignore"):
        glu = g * (F32(1.0) / (F32(1.0) + np.exp(-(g * F32(alpha)))))
    return ((u + F32(1.0)) * glu).astype(F32)


def window_start(spec: ModelSpec, layer: int, pos: int) -> int:
    """The first position the query at pos attends to in a layer: 0, or with a sliding window W the
    positions > pos − W only (transformers' sliding_window_overlay: kv_idx > q_idx − W)."""
    w = spec.sliding_window[layer] if spec.sliding_window else 0
    return max(0, pos + 1 - w) if w else 0


class Reference:
    """Greedy-decodable Mixtral in numpy float32 with a KV cache of `max_seq` positions.

    `weights` is a mapping of canonical names to arrays, or anything with `get(name)` (a Checkpoint).
    By default all tensors are read once, as float32, at construction; with `cache_bytes` they are read
    when used and at most about that many bytes of them are kept (same numbers, bounded memory).
    """

    def __init__(self, spec: ModelSpec, weights: Mapping[str, np.ndarray] | WeightSource,
                 max_seq: int | None = None, cache_bytes: int | None = None, kv: str = "f32") -> None:
        if kv not in KV_DTYPES:
            raise ValueError(f"KV cache precision {kv!r} not one of {', '.join(KV_DTYPES)}")
        if spec.mla and kv != "f32":
            raise ValueError("an MLA model's latent cache is f32 only")
        self.spec = spec
        self.kv = kv
        self.max_seq = spec.max_position if max_seq is None else int(max_seq)
        if self.max_seq <= 0:
            raise ValueError(f"max_seq must be positive, got {self.max_seq}")
        self.w: Mapping[str, np.ndarray] | LazyWeights
        if cache_bytes is None:
            self.w = {name: _as_f32(weights, name) for name in canonical_names(spec)}
        else:
            self.w = LazyWeights(weights, cache_bytes)
        # a blob's weights say which matrices the runtime multiplies with int8 activations, and where the
        # int8c corrections are (those multiply the float activations): the reference then does the same
        self._q8 = getattr(weights, "q8", None)
        self._q16 = getattr(weights, "q16", None)  # int16 matrices: 14-bit activations (quantize_q16)
        self._corrections = getattr(weights, "corrections", None)
        self._quantize_activations = getattr(weights, "quantize_activations", quantize_q8)
        self._corr_cache: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray] | None] = {}
        self.inv_freq = rope_inv_freq(spec)
        self.routing: list[np.ndarray] = []  # experts chosen in each layer for the last token
        self.router_probs: dict[int, np.ndarray] = {}  # MoE layer -> softmax of its router, last token
        self.reset()

    @property
    def lm_head(self) -> np.ndarray:
        return self.w["embed"] if self.spec.tied else self.w["lm_head"]

    def _mm(self, name: str, x: np.ndarray) -> np.ndarray:
        """W x, as the runtime computes it: int8 activations for its q8 matrices (corrections excepted)."""
        w = self.w[name]
        if self._q16 is not None and self._q16(name):
            return w @ quantize_q16(x)
        if self._q8 is None or not self._q8(name):
            return w @ x
        xq = self._quantize_activations(x)
        y = w @ xq
        if name not in self._corr_cache:
            c = self._corrections(name) if self._corrections else None
            self._corr_cache[name] = None if c is None else (c[0] // w.shape[1], c[0] % w.shape[1], c[1])
        corr = self._corr_cache[name]
        if corr is not None:  # W = base + corrections; the base takes xq, the corrections x
            rows, cols, vals = corr
            y = y + np.bincount(rows, vals * (x - xq)[cols], minlength=w.shape[0]).astype(F32)
        return y

    def reset(self) -> None:
        """Forget the sequence: the next token is at position 0."""
        s = self.spec
        self.pos = 0
        if s.mla:  # the compressed cache: the normed latent and the rotated rope key of each position
            self.k_cache = np.zeros((s.n_layers, self.max_seq, s.kv_lora_rank), dtype=F32)
            self.v_cache = np.zeros((s.n_layers, self.max_seq, s.head_dim), dtype=F32)
            return
        shape = (s.n_layers, self.max_seq, s.n_kv_heads, s.head_dim)
        self.k_cache = np.zeros(shape, dtype=F32)
        self.v_cache = np.zeros(shape, dtype=F32)

    def _mla(self, layer: int, x: np.ndarray) -> np.ndarray:
        """DeepSeek's multi-head latent attention as transformers computes it: the latent and the rope key
        cached, each head's keys and values expanded from the latents (kv_b), softmax scale
        1/sqrt(qk_head_dim); the rope rows are in rotate_half order (the importer permuted them)."""
        s, w, p = self.spec, self.w, f"layers.{layer}."
        eps, nope, r = MLA_NORM_EPS, s.qk_nope_head_dim, s.kv_lora_rank
        if s.q_lora_rank:
            q = self._mm(p + "attn.q_b", rms_norm(self._mm(p + "attn.q_a", x), w[p + "attn.q_a_norm"], eps))
        else:
            q = self._mm(p + "attn.q", x)
        q = q.reshape(s.n_heads, s.qk_head_dim)
        ckv = self._mm(p + "attn.kv_a", x)
        cos, sin = rope_cos_sin(self.inv_freq, self.pos)
        self.k_cache[layer, self.pos] = rms_norm(ckv[:r], w[p + "attn.kv_a_norm"], eps)
        self.v_cache[layer, self.pos] = apply_rope(ckv[r:][None, :], cos, sin)[0]
        q_nope, q_pe = q[:, :nope], apply_rope(q[:, nope:], cos, sin)
        n = self.pos + 1
        latent, k_pe = self.k_cache[layer, :n], self.v_cache[layer, :n]
        kv = (latent @ w[p + "attn.kv_b"].T).reshape(n, s.n_heads, nope + s.v_head_dim)
        scale = F32(s.qk_head_dim ** -0.5)
        out = np.empty((s.n_heads, s.v_head_dim), dtype=F32)
        for h in range(s.n_heads):
            scores = (kv[:, h, :nope] @ q_nope[h] + k_pe @ q_pe[h]) * scale
            out[h] = softmax(scores) @ kv[:, h, nope:]
        return self._mm(p + "attn.o", out.reshape(-1))

    def _attention(self, layer: int, x: np.ndarray) -> np.ndarray:
        s, w, p = self.spec, self.w, f"layers.{layer}."
        if s.mla:
            return self._mla(layer, x)
        q, k, v = self._mm(p + "attn.q", x), self._mm(p + "attn.k", x), self._mm(p + "attn.v", x)
        if s.qkv_bias:
            q, k, v = q + w[p + "attn.q_bias"], k + w[p + "attn.k_bias"], v + w[p + "attn.v_bias"]
        if s.qk_norm == "full":  # OLMoE: over all heads at once
            q, k = rms_norm(q, w[p + "attn.q_norm"], s.rms_eps), rms_norm(k, w[p + "attn.k_norm"], s.rms_eps)
        q = q.reshape(s.n_heads, s.head_dim)
        k = k.reshape(s.n_kv_heads, s.head_dim)
        v = v.reshape(s.n_kv_heads, s.head_dim)
        if s.qk_norm == "head":  # Qwen3: each head on its own
            q = np.stack([rms_norm(h, w[p + "attn.q_norm"], s.rms_eps) for h in q])
            k = np.stack([rms_norm(h, w[p + "attn.k_norm"], s.rms_eps) for h in k])
        cos, sin = rope_cos_sin(self.inv_freq, self.pos)
        self.k_cache[layer, self.pos] = kv_round(apply_rope(k, cos, sin), self.kv)
        self.v_cache[layer, self.pos] = kv_round(v, self.kv)
        q = apply_rope(q, cos, sin)
        n = self.pos + 1
        lo = window_start(s, layer, self.pos)
        group = s.n_heads // s.n_kv_heads
        scale = F32(s.head_dim ** -0.5)
        out = np.empty((s.n_heads, s.head_dim), dtype=F32)
        for h in range(s.n_heads):
            kv = h // group  # HF repeat_kv: query head h reads kv head h // group
            scores = (self.k_cache[layer, lo:n, kv] @ q[h]) * scale
            if s.attn_sinks:  # gpt-oss: the head's sink joins the softmax as a position without a value
                probs = softmax(np.append(scores, w[p + "attn.sinks"][h]).astype(F32))[:-1]
            else:
                probs = softmax(scores)
            out[h] = probs @ self.v_cache[layer, lo:n, kv]
        o = self._mm(p + "attn.o", out.reshape(-1))
        return o + w[p + "attn.o_bias"] if s.o_bias else o

    def _mlp(self, prefix: str, x: np.ndarray) -> np.ndarray:
        return self._mm(prefix + "down", silu(self._mm(prefix + "gate", x)) * self._mm(prefix + "up", x))

    def _expert(self, prefix: str, x: np.ndarray) -> np.ndarray:
        """A routed expert: the SiLU-gated MLP, or gpt-oss's with biases and its clamped SwiGLU."""
        s, w = self.spec, self.w
        if not (s.expert_bias or s.swiglu_limit):
            return self._mlp(prefix, x)
        g, u = self._mm(prefix + "gate", x), self._mm(prefix + "up", x)
        if s.expert_bias:
            g, u = g + w[prefix + "gate_bias"], u + w[prefix + "up_bias"]
        if s.swiglu_limit:
            h = clamped_swiglu(g, u, s.swiglu_alpha, s.swiglu_limit)
        else:
            h = silu(g) * u
        y = self._mm(prefix + "down", h)
        return y + w[prefix + "down_bias"] if s.expert_bias else y

    def _moe(self, layer: int, x: np.ndarray) -> np.ndarray:
        if self.spec.is_dense(layer):
            self.routing.append(np.zeros(0, dtype=np.int64))
            return self._mlp(f"layers.{layer}.mlp.", x)
        experts, weights = self.moe_route(layer, x)
        return self.moe_combine(layer, x, [self.moe_expert(layer, e, x) for e in experts], weights)

    def moe_route(self, layer: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """An MoE layer's chosen experts for the normed hidden state x, in order, and their weights."""
        s, w, p = self.spec, self.w, f"layers.{layer}.moe."
        logits = w[p + "router"] @ x
        if s.expert_bias:  # gpt-oss: top-k of the biased logits, softmax over the chosen (= renormalised)
            logits = logits + w[p + "router_bias"]
        self.router_probs[layer] = softmax(logits)
        if s.router_scoring == "softmax" and s.group_score == "none":
            experts, weights = route(logits, s.top_k, s.norm_topk_prob, s.routed_scale)
        else:
            bias = w[p + "choice_bias"] if s.router_scoring == "sigmoid" else None
            experts, weights = route_grouped(logits, s, bias)
        self.routing.append(experts)
        return experts, weights

    def moe_expert(self, layer: int, e: int, x: np.ndarray) -> np.ndarray:
        return self._expert(f"layers.{layer}.moe.experts.{e}.", x)

    def moe_combine(self, layer: int, x: np.ndarray, outs: Sequence[np.ndarray], weights: np.ndarray) -> np.ndarray:
        """The MoE layer's output from its chosen experts' outputs (moe_route's order) and the shared expert."""
        s, w, p = self.spec, self.w, f"layers.{layer}.moe."
        acc = np.zeros_like(x)
        for out, g in zip(outs, weights, strict=True):
            acc += out * g
        if s.shared_ffn:
            shared = self._mlp(p + "shared.", x)
            if s.shared_gate:
                g = (w[p + "shared_gate"] @ x).astype(F32)
                shared = (F32(1.0) / (F32(1.0) + np.exp(-g))) * shared
            acc = acc + shared
        return acc

    def embed(self, token: int) -> np.ndarray:
        """The hidden state a token enters the first layer with."""
        if not 0 <= token < self.spec.vocab:
            raise ValueError(f"token id {token} out of range 0..{self.spec.vocab - 1}")
        return self.w["embed"][token].copy()

    def layer(self, layer: int, x: np.ndarray) -> np.ndarray:
        """One layer on the hidden state x of the token at position self.pos (its K/V cached there)."""
        s, p = self.spec, f"layers.{layer}."
        x = x + self._attention(layer, rms_norm(x, self.w[p + "attn_norm"], s.rms_eps))
        return x + self._moe(layer, rms_norm(x, self.w[p + "ffn_norm"], s.rms_eps))

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The output head on a last layer's hidden state."""
        return self._mm("embed" if self.spec.tied else "lm_head", rms_norm(x, self.w["final_norm"], self.spec.rms_eps))

    def _step(self, token: int) -> np.ndarray:
        s = self.spec
        x = self.embed(token)
        if self.pos >= min(self.max_seq, s.max_position):
            raise ValueError(f"sequence longer than max_seq {self.max_seq} or the model's "
                             f"max_position {s.max_position}")
        self.routing = []
        for layer in range(s.n_layers):
            x = self.layer(layer, x)
        self.pos += 1
        return x

    def forward(self, tokens: Sequence[int]) -> np.ndarray:
        """Append tokens to the sequence; the logits (vocab,) float32 of the last one."""
        if len(tokens) == 0:
            raise ValueError("forward needs at least one token")
        for t in tokens:
            x = self._step(int(t))
        return self.logits(x)

    def generate(self, tokens: Sequence[int], n: int) -> list[int]:
        """Greedy decoding (ties -> lowest id) continuing the current sequence; only the n new ids.

        The last new id is not fed back, so the cache then holds the prompt and the first n - 1 new ids.
        """
        if n <= 0:
            return []
        logits = self.forward(tokens)
        out: list[int] = []
        while True:
            out.append(int(np.argmax(logits)))
            if len(out) == n:
                return out
            logits = self.forward(out[-1:])
