"""HuggingFace OLMoE (OlmoeForCausalLM): config keys -> ModelSpec, tensor names -> canonical names.

Family quirks, as transformers' modeling_olmoe.py defines them:
- RMSNorm over the whole q projection (weights of hidden_size = heads * head_dim) and the whole k
  projection (weights of (hidden_size / heads) * kv_heads), before the rotary embedding.
- routing: softmax, top-k, renormalised only when `norm_topk_prob` (default false).
- experts have `intermediate_size`; every layer is MoE; no shared expert.
- `clip_qkv` and `attention_bias` are refused (not implemented).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..spec import ModelSpec
from . import _hf
from ._registry import Importer, register

ARCHITECTURES = ("OlmoeForCausalLM",)
MODEL_TYPES = ("olmoe",)
# Other spellings of config keys (canonical -> aliases), as the family's HF config class accepts them.
# transformers 5.x OlmoeConfig: attribute_map {"num_local_experts": "num_experts"}.
ALIASES: dict[str, tuple[str, ...]] = {"num_experts": ("num_local_experts",)}
NAMES = _hf.Names()


def parse_config(data: Mapping[str, Any], path: Path) -> ModelSpec:
    cfg = _hf.make_config(data, path, ALIASES)
    _hf.reject_keys(cfg)
    _hf.reject_attention_bias(cfg)
    if cfg.data.get("head_dim") is not None:
        raise cfg.fail("head_dim", "OLMoE derives head_dim from hidden_size / num_attention_heads; "
                                   "an explicit head_dim is not supported")
    f = _hf.common_fields(cfg, sliding_key=None)
    return ModelSpec(
        arch="olmoe", **f,
        ffn=cfg.positive_int("intermediate_size"),
        qk_norm="full",
        norm_topk_prob=_hf.bool_key(cfg, "norm_topk_prob", False),
    )


tensor_map = NAMES.tensor_map
is_ignored = NAMES.is_ignored
IMPORTER = register(Importer("olmoe", ARCHITECTURES, MODEL_TYPES, parse_config, tensor_map, is_ignored,
                             NAMES.source_name))
