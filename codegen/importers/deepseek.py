"""DeepSeek-MoE (DeepseekForCausalLM, model_type "deepseek", deepseek-moe-16b's remote code). DeepSeek-V2/V3
(always MLA) are importers/deepseek_v2.py.

Accepted: plain multi-head / grouped attention (q_proj, k_proj, v_proj, o_proj without biases),
`n_routed_experts` experts of `moe_intermediate_size`, `n_shared_experts` shared experts (one MLP of
n_shared_experts * moe_intermediate_size, added ungated), the first `first_k_dense_replace` layers and
those with L % `moe_layer_freq` != 0 dense MLPs of `intermediate_size`, softmax scoring with greedy
top-k, `norm_topk_prob` (applied when top_k > 1, as DeepSeek does), `routed_scaling_factor`.
Refused, naming the key: MLA attention (`kv_lora_rank`, `q_lora_rank`, `qk_rope_head_dim`), group-limited
routing (`n_group` / `topk_group` > 1, `topk_method` other than greedy), `scoring_func` other than
softmax, attention biases.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..spec import ModelSpec
from . import _hf
from ._registry import Importer, register

ARCHITECTURES = ("DeepseekForCausalLM",)
MODEL_TYPES = ("deepseek",)
# Other spellings of config keys (canonical -> aliases), as the family's HF config class accepts them.
# The remote-code DeepseekConfig (deepseek-moe) reads n_routed_experts only; num_local_experts kept as an
# alias (what the V2/V3 classes' attribute_map spells it).
ALIASES: dict[str, tuple[str, ...]] = {"n_routed_experts": ("num_local_experts",)}
NAMES = _hf.Names(shared="mlp.shared_experts")


def parse_config(data: Mapping[str, Any], path: Path) -> ModelSpec:
    cfg = _hf.make_config(data, path, ALIASES)
    _hf.reject_keys(cfg)
    archs = data.get("architectures") or []
    if data.get("model_type") in MODEL_TYPES[1:] or (archs and archs[0] in ARCHITECTURES[1:]):
        # transformers' DeepSeek-V2/V3 always build MLA attention (kv_lora_rank defaults to 512)
        raise cfg.fail("kv_lora_rank", "DeepSeek-V2/V3 use multi-head latent attention (MLA), which is not "
                                       "supported; only DeepseekForCausalLM (deepseek-moe) layouts are")
    for key in ("n_group", "topk_group"):
        if cfg.get(key, 1, required=False) not in (1, None):
            raise cfg.fail(key, f"group-limited routing is not supported (value {cfg.data[key]!r})")
    if cfg.get("topk_method", "greedy", required=False) != "greedy":
        raise cfg.fail("topk_method", f"only 'greedy' is supported, got {cfg.data['topk_method']!r}")
    if cfg.get("scoring_func", "softmax", required=False) != "softmax":
        raise cfg.fail("scoring_func", f"only 'softmax' is supported, got {cfg.data['scoring_func']!r}")
    _hf.reject_attention_bias(cfg, "biases on the attention projections are not supported")
    f = _hf.common_fields(cfg, sliding_key=None, experts_key="n_routed_experts")
    moe_ffn = cfg.positive_int("moe_intermediate_size")
    n_shared = cfg.get("n_shared_experts", 0, required=False)
    if not isinstance(n_shared, int) or isinstance(n_shared, bool) or n_shared < 0:
        raise cfg.fail("n_shared_experts", f"must be a non-negative integer, got {n_shared!r}")
    first_dense = cfg.get("first_k_dense_replace", 0, required=False)
    if not isinstance(first_dense, int) or isinstance(first_dense, bool) or first_dense < 0:
        raise cfg.fail("first_k_dense_replace", f"must be a non-negative integer, got {first_dense!r}")
    freq = cfg.positive_int("moe_layer_freq", 1)
    dense = tuple(L for L in range(f["n_layers"]) if not (L >= first_dense and L % freq == 0))
    scale = cfg.positive_float("routed_scaling_factor", cfg.get("routed_scaling_factor", 1.0, required=False))
    return ModelSpec(
        arch="deepseek", **f, ffn=moe_ffn,
        norm_topk_prob=_hf.bool_key(cfg, "norm_topk_prob", False) and f["top_k"] > 1,
        routed_scale=scale, shared_ffn=n_shared * moe_ffn,
        dense_ffn=cfg.positive_int("intermediate_size") if dense else 0, dense_layers=dense,
    )


tensor_map = NAMES.tensor_map
is_ignored = NAMES.is_ignored
IMPORTER = register(Importer("deepseek", ARCHITECTURES, MODEL_TYPES, parse_config, tensor_map, is_ignored,
                             NAMES.source_name))
