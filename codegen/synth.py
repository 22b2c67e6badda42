"""Synthetic HuggingFace-format checkpoints: deterministic, small, and with weights that matter.

The scales keep activations O(1) through the layers while making attention, routing and the
greedy token genuinely depend on the weights: linear weights ~ N(0, 1/in), router logits with
std ~2 so that top-k choices vary from token to token, norm weights ~ 1 + 0.1 N(0, 1), embeddings
~ N(0, 1) (or N(0, TIED_EMBED_STD^2 / hidden) when tied: a tied lm_head reads the residual
stream through the embedding itself, and a large embedding would make every model echo its last
input token). `heavy_tail` draws Student-t (df 3) weights, with the same std, so outliers exist.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from .importers import FAMILIES, IMPORTERS
from .spec import ModelSpec, canonical_names, canonical_shape

DTYPES = {"f32": ("F32", "float32"), "f16": ("F16", "float16"), "bf16": ("BF16", "bfloat16")}
ROUTER_LOGIT_STD = 2.0
TIED_EMBED_STD = 0.25
RMS_EPS = 1e-5
BIAS_STD = 0.2
ARCHES = FAMILIES  # the importers' registry
_IMPORTER = {imp.family: imp for imp in IMPORTERS}


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even (inputs are finite)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def encode(x: np.ndarray, dtype: str) -> bytes:
    """Little-endian bytes of x in a safetensors dtype (F32, F16 or BF16)."""
    if dtype == "F32":
        return np.ascontiguousarray(x, dtype="<f4").tobytes()
    if dtype == "F16":
        return np.ascontiguousarray(x, dtype="<f2").tobytes()
    if dtype == "BF16":
        return to_bf16_bits(x).tobytes()
    raise ValueError(f"cannot encode dtype {dtype}")


def write_safetensors(path: str | Path, tensors: Iterable[tuple[str, str, tuple[int, ...], bytes]],
                      metadata: dict[str, str] | None = None) -> int:
    """Write (name, dtype, shape, raw bytes) entries, in the given order; returns the data size."""
    header: dict[str, object] = {"__metadata__": metadata if metadata is not None else {"format": "pt"}}
    chunks, offset = [], 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format allows space padding; keeps data 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for raw in chunks:
            f.write(raw)
    return offset


OUTLIER_CHANNEL_GAIN = 8.0  # as bench/hf_checkpoints.py's outlier-channel checkpoint


def _weight(rng: np.random.Generator, spec: ModelSpec, name: str, heavy_tail: bool) -> np.ndarray:
    shape = canonical_shape(spec, name)
    if name.endswith("norm"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("_bias"):
        return (BIAS_STD * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("attn.sinks"):  # gpt-oss: a logit per head, of the scores' order
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    if name == "embed":
        std = TIED_EMBED_STD / math.sqrt(spec.hidden) if spec.tied else 1.0
    elif name.endswith("router"):
        std = ROUTER_LOGIT_STD / math.sqrt(shape[1])
    else:
        std = 1.0 / math.sqrt(shape[1])
    if heavy_tail:
        z = rng.standard_t(3.0, shape) / math.sqrt(3.0)  # df 3 has variance 3
    else:
        z = rng.standard_normal(shape)
    return (z * std).astype(np.float32)


def _family_config(spec: ModelSpec) -> dict[str, object]:
    """The config keys of a family beyond Mixtral's (HF names, HF meanings)."""
    dense = list(spec.dense_layers)
    if spec.arch == "qwen2_moe":
        return {"intermediate_size": spec.dense_ffn or spec.ffn, "moe_intermediate_size": spec.ffn,
                "shared_expert_intermediate_size": spec.shared_ffn, "num_experts": spec.n_experts,
                "norm_topk_prob": spec.norm_topk_prob, "decoder_sparse_step": 1, "mlp_only_layers": dense,
                "qkv_bias": spec.qkv_bias, "use_sliding_window": False, "sliding_window": None,
                "max_window_layers": spec.n_layers}
    if spec.arch == "qwen3_moe":
        return {"intermediate_size": spec.dense_ffn or spec.ffn, "moe_intermediate_size": spec.ffn,
                "num_experts": spec.n_experts, "norm_topk_prob": spec.norm_topk_prob, "decoder_sparse_step": 1,
                "mlp_only_layers": dense, "attention_bias": False, "use_sliding_window": False,
                "sliding_window": None}
    if spec.arch == "olmoe":
        return {"intermediate_size": spec.ffn, "num_experts": spec.n_experts,
                "norm_topk_prob": spec.norm_topk_prob, "attention_bias": False, "clip_qkv": None}
    if spec.arch == "deepseek":
        if dense != list(range(len(dense))):
            raise ValueError("synth: deepseek dense layers must be the first ones (first_k_dense_replace)")
        return {"intermediate_size": spec.dense_ffn or spec.ffn, "moe_intermediate_size": spec.ffn,
                "n_routed_experts": spec.n_experts, "n_shared_experts": spec.shared_ffn // spec.ffn,
                "first_k_dense_replace": len(dense), "moe_layer_freq": 1, "norm_topk_prob": spec.norm_topk_prob,
                "routed_scaling_factor": spec.routed_scale, "scoring_func": "softmax", "topk_method": "greedy",
                "attention_bias": False}
    if spec.arch in MLA_ARCHES:
        if dense != list(range(len(dense))):
            raise ValueError(f"synth: {spec.arch} dense layers must be the first ones (first_k_dense_replace)")
        out = {"intermediate_size": spec.dense_ffn or spec.ffn, "moe_intermediate_size": spec.ffn,
               "n_routed_experts": spec.n_experts, "n_shared_experts": spec.shared_ffn // spec.ffn,
               "first_k_dense_replace": len(dense), "routed_scaling_factor": spec.routed_scale,
               "norm_topk_prob": spec.norm_topk_prob, "attention_bias": False, "head_dim": spec.head_dim,
               "kv_lora_rank": spec.kv_lora_rank, "q_lora_rank": spec.q_lora_rank or None,
               "qk_nope_head_dim": spec.qk_nope_head_dim, "qk_rope_head_dim": spec.head_dim,
               "v_head_dim": spec.v_head_dim, "n_group": spec.n_group, "topk_group": spec.topk_group}
        if spec.arch == "deepseek-v2":
            out["topk_method"] = "greedy" if spec.group_score == "none" else "group_limited_greedy"
        else:
            out.update(rope_interleave=True, scoring_func="sigmoid", topk_method="noaux_tc")
        return out
    if spec.arch in DENSE_ARCHES:
        out = {"intermediate_size": spec.dense_ffn, "head_dim": spec.head_dim}
        if spec.arch == "mistral":
            out["sliding_window"] = spec.sliding_window[0] if spec.sliding_window else None
        if spec.arch in ("qwen2", "qwen3"):
            out["use_sliding_window"] = False
        if spec.arch in ("llama", "qwen3"):
            out["attention_bias"] = False
        return out
    if spec.arch == "gpt-oss":  # explicit rope and layer types: GptOssConfig's defaults are YaRN, alternating
        w = max(spec.sliding_window, default=0)
        return {"intermediate_size": spec.ffn, "num_local_experts": spec.n_experts, "attention_bias": True,
                "swiglu_alpha": spec.swiglu_alpha, "swiglu_limit": spec.swiglu_limit, "head_dim": spec.head_dim,
                "layer_types": ["sliding_attention" if v else "full_attention"
                                for v in spec.sliding_window or (0,) * spec.n_layers],
                "sliding_window": w or None,
                "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta}}
    if spec.arch == "granitemoe":
        return {"intermediate_size": spec.ffn, "num_local_experts": spec.n_experts,
                "shared_intermediate_size": spec.shared_ffn, "attention_bias": False,
                **{k: 1.0 for k in ("embedding_multiplier", "logits_scaling", "residual_multiplier")},
                "attention_multiplier": spec.head_dim ** -0.5}
    return {"intermediate_size": spec.ffn, "num_local_experts": spec.n_experts}


DENSE_ARCHES = ("llama", "mistral", "qwen2", "qwen3")  # every layer a dense MLP (importers/dense.py)
MLA_ARCHES = ("deepseek-v2", "deepseek-v3")  # multi-head latent attention (importers/deepseek_v2.py)


def _mla_features(arch: str, hidden: int, heads: int, head_dim: int, experts: int, top_k: int,
                  kv_lora_rank: int | None, q_lora_rank: int | None) -> dict[str, object]:
    """A small MLA: head_dim the nope and v width of a head, rope dims half of it (even, at least 2), latents of
    hidden / 2; V3 with a q latent and the best of 2 expert groups, V2 with a plain q_proj and greedy top-k."""
    rope = max(2, head_dim // 4 * 2)
    out: dict[str, object] = dict(
        n_kv_heads=heads, head_dim=rope, qk_nope_head_dim=head_dim, v_head_dim=head_dim,
        kv_lora_rank=kv_lora_rank or max(2, hidden // 2),
        q_lora_rank=(max(2, hidden // 2) if arch == "deepseek-v3" else 0) if q_lora_rank is None else q_lora_rank)
    if arch == "deepseek-v3":
        out["router_scoring"] = "sigmoid"
        if experts % 2 == 0 and experts >= 4 and top_k <= experts // 2:
            out.update(group_score="top2_sum", n_group=2, topk_group=1)
    return out


def _config(spec: ModelSpec, torch_dtype: str, explicit_head_dim: bool) -> dict[str, object]:
    family = _family_config(spec)
    cfg: dict[str, object] = {
        "architectures": [_IMPORTER[spec.arch].architectures[1 if spec.arch == "granitemoe" and spec.shared_ffn
                                                             else 0]],
        "model_type": "granitemoeshared" if spec.arch == "granitemoe" and spec.shared_ffn
        else _IMPORTER[spec.arch].model_types[0],
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": family.pop("intermediate_size"),
        "num_hidden_layers": spec.n_layers,
        "num_attention_heads": spec.n_heads,
        "num_key_value_heads": spec.n_kv_heads,
    }
    if explicit_head_dim:
        cfg["head_dim"] = spec.head_dim
    cfg.update({
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position,
        "rms_norm_eps": spec.rms_eps,
        "rope_theta": spec.rope_theta,
        **({"sliding_window": None} if spec.arch == "mixtral" else {}),
        "tie_word_embeddings": spec.tied,
        **family,
        **({} if spec.arch in DENSE_ARCHES else {  # a dense config class has no router keys
            "num_experts_per_tok": spec.top_k, "router_aux_loss_coef": 0.0, "output_router_logits": False}),
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "use_cache": True,
        "torch_dtype": torch_dtype,
    })
    return cfg


def _split(sizes: list[int], shards: int) -> list[int]:
    """Shard index of each tensor: contiguous runs of roughly equal bytes, none empty."""
    total, out, shard, done, in_shard = sum(sizes), [], 0, 0, 0
    for i, size in enumerate(sizes):
        if shard < shards - 1 and in_shard > 0 and (
                done >= total * (shard + 1) / shards or len(sizes) - i == shards - 1 - shard):
            shard, in_shard = shard + 1, 0
        out.append(shard)
        done += size
        in_shard += 1
    return out


def _write_weights(tmp: Path, entries: list[tuple[str, str, tuple[int, ...], bytes]], shards: int) -> None:
    if shards == 1:
        write_safetensors(tmp / "model.safetensors", entries)
        return
    which = _split([len(e[3]) for e in entries], shards)
    weight_map, total = {}, 0
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = [e for e, w in zip(entries, which, strict=True) if w == s]
        total += write_safetensors(tmp / fname, part)
        weight_map.update({e[0]: fname for e in part})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


CHECKPOINT_FILES = ("config.json", "model.safetensors.index.json", "colibri.json")


def check_replaceable(out: Path) -> None:
    """synth replaces only a missing or empty directory or a checkpoint (config.json, the index, colibri.json
    and *.safetensors files, nothing else); anything else is refused before any work."""
    if not (out.exists() or out.is_symlink()):
        return
    if out.is_symlink() or not out.is_dir():
        raise ValueError(f"synth: {out} exists and is not a directory; refusing to replace it")
    other = sorted(p.name for p in out.iterdir() if not (p.name in CHECKPOINT_FILES or p.suffix == ".safetensors")
                   or not p.is_file())
    if other:
        raise ValueError(f"synth: {out} holds {other[0]!r}, not a checkpoint file; refusing to replace it "
                         "(synth writes into a new or empty directory, or over a checkpoint)")


def _replace_dir(tmp: Path, out: Path) -> None:
    """Move tmp to out; an existing out is swapped away first and then removed."""
    old = None
    if out.exists() or out.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.rename(out, old / out.name)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old)


def _windows(arch: str, layers: int, window: int | None) -> tuple[int, ...]:
    """Mistral: every layer; gpt-oss: the even layers (its layer_types, sliding first)."""
    if not window:
        return ()
    return tuple(window if arch == "mistral" or i % 2 == 0 else 0 for i in range(layers))


def _features(arch: str, ffn: int, shared_ffn: int | None, dense_ffn: int | None,
              dense_layers: tuple[int, ...] | list[int] | None, norm_topk_prob: bool | None,
              routed_scale: float) -> dict[str, object]:
    dense = tuple(dense_layers or ())
    out: dict[str, object] = {"dense_layers": dense, "dense_ffn": (dense_ffn or 2 * ffn) if dense else 0}
    if arch == "granitemoe":
        out.update(norm_topk_prob=True, shared_ffn=shared_ffn or 0)
    elif arch in ("qwen2", "qwen3"):
        out.update(qkv_bias=True) if arch == "qwen2" else out.update(qk_norm="head")
    elif arch == "gpt-oss":
        out.update(norm_topk_prob=True, qkv_bias=True, o_bias=True, attn_sinks=True, expert_bias=True,
                   swiglu_limit=7.0)
    if arch == "qwen2_moe":
        shared = 2 * ffn if shared_ffn is None else shared_ffn
        out.update(qkv_bias=True, shared_ffn=shared, shared_gate=shared > 0,
                   norm_topk_prob=False if norm_topk_prob is None else norm_topk_prob)
    elif arch == "qwen3_moe":
        out.update(qk_norm="head", norm_topk_prob=True if norm_topk_prob is None else norm_topk_prob)
    elif arch == "olmoe":
        out.update(qk_norm="full", norm_topk_prob=False if norm_topk_prob is None else norm_topk_prob)
    elif arch == "deepseek" or arch in MLA_ARCHES:
        shared = ffn if shared_ffn is None else shared_ffn
        if shared % ffn:
            raise ValueError(f"synth: {arch} shared_ffn {shared} is not a multiple of ffn {ffn}")
        out.update(shared_ffn=shared, routed_scale=float(routed_scale),
                   norm_topk_prob=False if norm_topk_prob is None else norm_topk_prob)
    return out


def synth_checkpoint(out_dir: str | Path, *, arch: str = "mixtral", layers: int, hidden: int, ffn: int,
                     heads: int, kv_heads: int, experts: int, top_k: int, vocab: int, seed: int,
                     dtype: str = "f32", tie: bool = False, head_dim: int | None = None,
                     rope_theta: float = 1e6, max_position: int = 4096, heavy_tail: bool = False,
                     shards: int = 1, shared_ffn: int | None = None, dense_ffn: int | None = None,
                     dense_layers: tuple[int, ...] | list[int] | None = None, norm_topk_prob: bool | None = None,
                     routed_scale: float = 1.0, sliding_window: int | None = None, kv_lora_rank: int | None = None,
                     q_lora_rank: int | None = None, outlier_channels: int = 0) -> Path:
    """Write config.json and model.safetensors (or `shards` shards and an index); same bytes for a seed.

    `arch` picks the HF family (names and config keys); its features take the family's typical values
    unless given: Qwen2-MoE has q/k/v biases, a sigmoid-gated shared expert (shared_ffn, default 2 * ffn)
    and norm_topk_prob false; Qwen3-MoE per-head q/k norms and norm_topk_prob true; OLMoE whole-projection
    q/k norms and norm_topk_prob false; DeepSeek an ungated shared expert (a multiple of ffn). dense_layers
    (with dense_ffn, default 2 * ffn) become `mlp_only_layers` (first_k_dense_replace for DeepSeek).
    DeepSeek-V2/V3 are MLA (see _mla_features; kv_heads is heads, key and value being per head): kv_lora_rank
    and q_lora_rank (0: a plain q_proj) default to hidden / 2, V2 without a q latent.
    `outlier_channels` input columns of every matrix (the embedding's being the hidden features) are
    multiplied by OUTLIER_CHANNEL_GAIN, the outlier features of real LLMs; chosen by a generator of their
    own, so the other weights are those of the same seed without them.
    """
    if outlier_channels < 0:
        raise ValueError(f"synth: outlier_channels {outlier_channels} is negative")
    if arch not in ARCHES:
        raise ValueError(f"synth: unsupported arch {arch!r} (supported: {', '.join(ARCHES)})")
    if arch in ("mixtral", "olmoe", *DENSE_ARCHES) and (dense_layers or shared_ffn):
        raise ValueError(f"synth: {arch} has no dense layers or shared experts")
    if sliding_window is not None and arch not in ("mistral", "gpt-oss"):
        raise ValueError(f"synth: {arch} has no sliding window (mistral and gpt-oss have)")
    if arch == "gpt-oss" and (dense_layers or shared_ffn):
        raise ValueError("synth: gpt-oss has no dense layers or shared experts")
    if arch in DENSE_ARCHES:  # every layer dense, of width ffn; no router, no experts
        dense_layers, dense_ffn, experts, top_k = list(range(layers)), ffn, 1, 1
    if dtype not in DTYPES:
        raise ValueError(f"synth: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if head_dim is None and heads > 0 and hidden % heads:
        raise ValueError(f"synth: hidden {hidden} is not a multiple of heads {heads}; give head_dim")
    dims: dict[str, object] = dict(n_kv_heads=kv_heads, head_dim=head_dim if head_dim is not None
                                   else hidden // max(heads, 1))
    if arch in MLA_ARCHES:
        dims = _mla_features(arch, hidden, heads, int(dims["head_dim"]), experts, top_k, kv_lora_rank,
                             q_lora_rank)
    features = _features(arch, ffn, shared_ffn, dense_ffn, dense_layers, norm_topk_prob, routed_scale)
    if arch == "deepseek-v3" and norm_topk_prob is None:
        features["norm_topk_prob"] = True  # DeepseekV3Config's default
    spec = ModelSpec(
        arch=arch, vocab=vocab, hidden=hidden, n_layers=layers, n_heads=heads, ffn=ffn, n_experts=experts,
        top_k=top_k, rms_eps=RMS_EPS, rope_theta=float(rope_theta), tied=bool(tie), max_position=max_position,
        **dims, **features, sliding_window=_windows(arch, layers, sliding_window),
    )
    n_tensors = len(canonical_names(spec))
    if not 1 <= shards <= n_tensors:
        raise ValueError(f"synth: shards must be in 1..{n_tensors}, got {shards}")
    st_dtype, torch_dtype = DTYPES[dtype]
    rng = np.random.default_rng(seed)
    col_rng = np.random.default_rng([seed, 1])
    entries = []
    view = _IMPORTER[arch].view
    fused: dict[str, np.ndarray] = {}  # families whose files fuse tensors: each file tensor assembled
    for name in canonical_names(spec):
        w = _weight(rng, spec, name, heavy_tail)
        if outlier_channels and w.ndim == 2 and not name.endswith(("norm", "_bias", "router", "sinks")):
            cols = col_rng.choice(w.shape[1], size=min(outlier_channels, w.shape[1]), replace=False)
            w[:, cols] *= np.float32(OUTLIER_CHANNEL_GAIN)
        src = _IMPORTER[arch].source_name(name)
        if view is None:
            entries.append((src, st_dtype, w.shape, encode(w, st_dtype)))
            continue
        v = view(spec, {}, name)  # synth writes multipliers of 1 (attention_multiplier 1/sqrt(head_dim))
        if src not in fused:
            fused[src] = np.zeros(v.shape, dtype=np.float32)
        fused[src][v.index if v.index else ...] = w.T if v.transpose else w
    for src, w in fused.items():
        entries.append((src, st_dtype, w.shape, encode(w, st_dtype)))

    out = Path(os.path.abspath(out_dir))
    if not out.name:
        raise ValueError(f"synth: {out} is the root directory")
    check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        config = _config(spec, torch_dtype, head_dim is not None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        _write_weights(tmp, entries, shards)
        os.chmod(tmp, 0o755)
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
