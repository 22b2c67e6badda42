"""The numpy reference against HuggingFace transformers, live, for every family colibri imports.

transformers and torch are dev-only extras that the README's test command installs; under CI=true a
missing one fails (conftest). Three sequences per family, every position, from an empty cache.
DeepSeek-MoE's own HF class is remote code that cannot be fetched here: its layers are assembled from
transformers' LlamaForCausalLM (attention, norms, dense MLPs) and DeepseekV2Moe (softmax greedy top-k
routing, routed_scaling_factor, ungated shared experts), which is that architecture exactly when
norm_topk_prob is false (V2's router never renormalises; the renormalising case is Qwen3-MoE's, above).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hf_reference import HF_NATIVE, transformers_logits
from test_families import FAMILIES

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.reference import Reference
from colibri.codegen.spec import canonical_names

from conftest import synth

MIXTRAL = dict(arch="mixtral", layers=2, hidden=44, ffn=52, heads=4, kv_heads=2, head_dim=10, experts=5, top_k=2,
               vocab=97, seed=11, dtype="bf16", rope_theta=10000.0)
DEEPSEEK = dict(FAMILIES["deepseek"], norm_topk_prob=False, seed=35)
CASES = {"mixtral": MIXTRAL, **{f: FAMILIES[f] for f in HF_NATIVE if f != "mixtral"}, "deepseek": DEEPSEEK}
SEQ_LENS = (1, 9, 40)


def _sequences(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [[int(t) for t in rng.integers(0, vocab, n)] for n in SEQ_LENS]


def _numpy_logits(ckpt: Path, tokens: list[int]) -> np.ndarray:
    c = open_checkpoint(ckpt)
    r = Reference(c.spec, {n: c.get(n) for n in canonical_names(c.spec)}, max_seq=64)
    return np.stack([r.forward([t]) for t in tokens])


def _deepseek_logits(ckpt: Path, tokens: list[int]) -> np.ndarray:
    """DeepSeek-MoE from transformers' own modules (see the module doc)."""
    import json

    import torch
    import transformers
    from safetensors.numpy import load_file
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as dv2

    cfg = json.loads((ckpt / "config.json").read_text())
    assert not cfg.get("norm_topk_prob") and cfg.get("topk_method", "greedy") == "greedy"
    llama = transformers.LlamaConfig(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"], rms_norm_eps=cfg["rms_norm_eps"],
        rope_theta=cfg["rope_theta"], max_position_embeddings=cfg["max_position_embeddings"],
        tie_word_embeddings=cfg.get("tie_word_embeddings", False), attention_bias=False, hidden_act="silu")
    moe = transformers.DeepseekV2Config(
        hidden_size=cfg["hidden_size"], moe_intermediate_size=cfg["moe_intermediate_size"],
        n_routed_experts=cfg["n_routed_experts"], num_experts_per_tok=cfg["num_experts_per_tok"],
        n_shared_experts=cfg["n_shared_experts"], routed_scaling_factor=cfg["routed_scaling_factor"],
        topk_method="greedy", n_group=1, topk_group=1, hidden_act="silu",
        num_attention_heads=cfg["num_attention_heads"], num_key_value_heads=cfg["num_key_value_heads"])
    model = transformers.LlamaForCausalLM(llama).eval()
    first_dense = cfg.get("first_k_dense_replace", 0)
    for i, layer in enumerate(model.model.layers):
        if i >= first_dense and i % cfg.get("moe_layer_freq", 1) == 0:
            layer.mlp = dv2.DeepseekV2Moe(moe)
    raw = load_file(ckpt / "model.safetensors")
    state = {k: torch.from_numpy(v.astype(np.float32)) for k, v in raw.items() if ".mlp.experts." not in k}
    n_exp = cfg["n_routed_experts"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp"
        if f"{p}.experts.0.gate_proj.weight" not in raw:
            continue
        get = lambda e, w, p=p: raw[f"{p}.experts.{e}.{w}_proj.weight"].astype(np.float32)  # noqa: E731
        state[f"{p}.experts.gate_up_proj"] = torch.from_numpy(
            np.stack([np.concatenate([get(e, "gate"), get(e, "up")]) for e in range(n_exp)]))
        state[f"{p}.experts.down_proj"] = torch.from_numpy(np.stack([get(e, "down") for e in range(n_exp)]))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(m == "lm_head.weight" and llama.tie_word_embeddings for m in missing), \
        (missing, unexpected)
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].numpy().astype(np.float32)


@pytest.mark.parametrize("family", sorted(CASES))
def test_reference_matches_transformers(family, tmp_path):
    ckpt = synth(tmp_path / family, **CASES[family])
    vocab = CASES[family]["vocab"]
    for tokens in _sequences(vocab):
        want = _deepseek_logits(ckpt, tokens) if family == "deepseek" else transformers_logits(ckpt, tokens)
        got = _numpy_logits(ckpt, tokens)
        assert got.shape == want.shape == (len(tokens), vocab)
        assert float(np.max(np.abs(got - want))) <= 1e-5 * float(np.max(np.abs(want))), (family, len(tokens))
