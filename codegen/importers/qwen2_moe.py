"""HuggingFace Qwen2-MoE (Qwen2MoeForCausalLM): config keys -> ModelSpec, tensor names -> canonical names.

Family quirks, as transformers' modeling_qwen2_moe.py defines them:
- q/k/v projections have biases (`qkv_bias`, default true); o_proj has none.
- every MoE block has a shared expert of `shared_expert_intermediate_size` whose output is scaled by
  sigmoid(`shared_expert_gate` . x) and added to the routed experts' sum.
- routing: softmax over all experts, top-k, renormalised only when `norm_topk_prob` (default false).
- layer L is a dense MLP of `intermediate_size` when L is in `mlp_only_layers` or
  (L + 1) % `decoder_sparse_step` != 0; experts have `moe_intermediate_size`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..spec import ModelSpec
from . import _hf
from ._registry import Importer, register

ARCHITECTURES = ("Qwen2MoeForCausalLM",)
MODEL_TYPES = ("qwen2_moe",)
# Other spellings of config keys (canonical -> aliases), as the family's HF config class accepts them.
# transformers 5.x Qwen2MoeConfig has no attribute_map.
ALIASES: dict[str, tuple[str, ...]] = {}
NAMES = _hf.Names()


def dense_layers(cfg: _hf._Config, n_layers: int) -> tuple[int, ...]:
    """Layers HF builds as a dense MLP (Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer)."""
    only = _hf.layer_list(cfg, "mlp_only_layers", n_layers)
    step = cfg.positive_int("decoder_sparse_step", 1)
    return tuple(L for L in range(n_layers) if L in only or (L + 1) % step != 0)


def parse_config(data: Mapping[str, Any], path: Path) -> ModelSpec:
    cfg = _hf.make_config(data, path, ALIASES)
    _hf.reject_keys(cfg)
    f = _hf.common_fields(cfg)
    dense = dense_layers(cfg, f["n_layers"])
    shared = cfg.get("shared_expert_intermediate_size", 0, required=False)
    if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
        raise cfg.fail("shared_expert_intermediate_size", f"must be a non-negative integer, got {shared!r}")
    return ModelSpec(
        arch="qwen2_moe", **f,
        ffn=cfg.positive_int("moe_intermediate_size"),
        qkv_bias=_hf.bool_key(cfg, "qkv_bias", True),
        norm_topk_prob=_hf.bool_key(cfg, "norm_topk_prob", False),
        shared_ffn=shared, shared_gate=shared > 0,
        dense_ffn=cfg.positive_int("intermediate_size") if dense else 0, dense_layers=dense,
    )


tensor_map = NAMES.tensor_map
is_ignored = NAMES.is_ignored
IMPORTER = register(Importer("qwen2_moe", ARCHITECTURES, MODEL_TYPES, parse_config, tensor_map, is_ignored,
                             NAMES.source_name))
