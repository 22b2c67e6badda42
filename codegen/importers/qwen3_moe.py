"""HuggingFace Qwen3-MoE (Qwen3MoeForCausalLM): config keys -> ModelSpec, tensor names -> canonical names.

Family quirks, as transformers' modeling_qwen3_moe.py defines them:
- RMSNorm over each head of q and k (weights of `head_dim`), before the rotary embedding.
- `head_dim` may differ from hidden_size / num_attention_heads.
- routing: softmax, top-k, renormalised when `norm_topk_prob` (the released models set it true;
  the config class defaults to false, and so do we when the key is absent).
- no shared expert; dense layers as Qwen2-MoE (`mlp_only_layers`, `decoder_sparse_step`).
- `attention_bias` true would add a bias to o_proj too, which is not implemented: refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..spec import ModelSpec
from . import _hf
from ._registry import Importer, register
from .qwen2_moe import dense_layers

ARCHITECTURES = ("Qwen3MoeForCausalLM",)
MODEL_TYPES = ("qwen3_moe",)
# Other spellings of config keys (canonical -> aliases), as the family's HF config class accepts them.
# transformers 5.x Qwen3MoeConfig: attribute_map {"num_experts": "num_local_experts"}.
ALIASES: dict[str, tuple[str, ...]] = {"num_experts": ("num_local_experts",)}
NAMES = _hf.Names()


def parse_config(data: Mapping[str, Any], path: Path) -> ModelSpec:
    cfg = _hf.make_config(data, path, ALIASES)
    _hf.reject_keys(cfg)
    _hf.reject_attention_bias(cfg)
    f = _hf.common_fields(cfg)
    dense = dense_layers(cfg, f["n_layers"])
    return ModelSpec(
        arch="qwen3_moe", **f,
        ffn=cfg.positive_int("moe_intermediate_size"),
        qk_norm="head",
        norm_topk_prob=_hf.bool_key(cfg, "norm_topk_prob", False),
        dense_ffn=cfg.positive_int("intermediate_size") if dense else 0, dense_layers=dense,
    )


tensor_map = NAMES.tensor_map
is_ignored = NAMES.is_ignored
IMPORTER = register(Importer("qwen3_moe", ARCHITECTURES, MODEL_TYPES, parse_config, tensor_map, is_ignored,
                             NAMES.source_name))
