"""Qwen2-MoE, Qwen3-MoE, OLMoE and DeepSeek-MoE: importers, reference and C runtime on every Linux target.

Checkpoints are written in each family's HF layout by `colibri synth --arch`. The numpy reference was
checked against transformers' own Qwen2MoeForCausalLM / Qwen3MoeForCausalLM / OlmoeForCausalLM on these
very checkpoints; their logits are recorded in fixtures/hf_families.json (no torch needed here).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_cross import _parse, _run

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.errors import ExportError
from colibri.codegen.reference import Reference
from colibri.codegen.spec import canonical_names
from colibri.runtime import load

from blobread import header
from blobread import weights as blob_weights
from conftest import require_target, synth

FIXTURE = Path(__file__).parent / "fixtures" / "hf_families.json"
PROMPT = [3, 17, 42, 5, 9]
N_GEN = 16

FAMILIES = {
    # biases, a sigmoid-gated shared expert of its own size, a dense MLP layer, norm_topk_prob false
    "qwen2_moe": dict(arch="qwen2_moe", layers=3, hidden=40, ffn=24, heads=4, kv_heads=2, experts=6, top_k=2,
                      vocab=101, seed=31, dense_layers=[1], dense_ffn=56, shared_ffn=36),
    # per-head q/k norms, head_dim 12 != 40 / 4, norm_topk_prob true, a dense layer
    "qwen3_moe": dict(arch="qwen3_moe", layers=3, hidden=40, ffn=24, heads=4, kv_heads=2, head_dim=12, experts=5,
                      top_k=2, vocab=101, seed=32, dense_layers=[0], dense_ffn=48),
    # q/k norms over the whole projections, top-3 without renormalisation
    "olmoe": dict(arch="olmoe", layers=2, hidden=40, ffn=28, heads=4, kv_heads=2, experts=6, top_k=3, vocab=101,
                  seed=33),
    # first layer dense, two ungated shared experts, routed scaling factor 1.5, norm_topk_prob true
    "deepseek": dict(arch="deepseek", layers=3, hidden=40, ffn=16, heads=4, kv_heads=4, experts=6, top_k=2,
                     vocab=101, seed=34, dense_layers=[0], shared_ffn=32, routed_scale=1.5, norm_topk_prob=True),
}
TARGETS = ["host", "rpi4", "riscv64"]


@pytest.fixture(scope="module")
def family_ckpts(tmp_path_factory):
    base = tmp_path_factory.mktemp("families")
    return {name: synth(base / name, **kw) for name, kw in FAMILIES.items()}


def _reference(ckpt, weights=None):
    c = open_checkpoint(ckpt)
    w = weights if weights is not None else {n: c.get(n) for n in canonical_names(c.spec)}
    return Reference(c.spec, w, max_seq=64)


@pytest.mark.parametrize("family", ["qwen2_moe", "qwen3_moe", "olmoe"])
def test_reference_matches_transformers(family, family_ckpts):
    """Logits recorded from transformers 5 on the same synthetic checkpoints (see module doc)."""
    want = np.array(json.loads(FIXTURE.read_text())[family]["logits"], dtype=np.float32)
    got = _reference(family_ckpts[family]).forward(PROMPT)
    assert float(np.max(np.abs(got - want))) <= 1e-5 * float(np.max(np.abs(want)))


def test_spec_features(family_ckpts):
    s = {name: open_checkpoint(p).spec for name, p in family_ckpts.items()}
    assert s["qwen2_moe"].qkv_bias and s["qwen2_moe"].shared_gate and s["qwen2_moe"].shared_ffn == 36
    assert s["qwen2_moe"].dense_layers == (1,) and s["qwen2_moe"].dense_ffn == 56
    assert not s["qwen2_moe"].norm_topk_prob and s["qwen3_moe"].norm_topk_prob
    assert s["qwen3_moe"].qk_norm == "head" and s["qwen3_moe"].head_dim == 12
    assert s["olmoe"].qk_norm == "full" and not s["olmoe"].norm_topk_prob
    assert s["deepseek"].shared_ffn == 32 and not s["deepseek"].shared_gate and s["deepseek"].routed_scale == 1.5


@pytest.mark.parametrize("quant", ["f32", "int8c"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_host_matches_reference(family, quant, family_ckpts, build_model):
    ckpt = family_ckpts[family]
    out = build_model(ckpt, quant)
    h = header((out / "model.bin").read_bytes())
    # 1.1 features; 1.2 when some int8 matrix has a width that is a multiple of 32 (integer matmuls); 1.4 with
    # prefill blocks of more than one token (a scores row per attention lane)
    spec = open_checkpoint(ckpt).spec
    widths = [spec.hidden, spec.n_heads * spec.head_dim, spec.ffn, spec.shared_ffn, spec.dense_ffn]
    q8 = quant == "int8c" and any(w and w % 32 == 0 for w in widths)
    minor = 4 if h["prefill_block"] > 1 else 2 if q8 else 1
    assert (h["version_major"], h["version_minor"], h["xq_offset"] != 0) == (1, minor, q8)
    weights = None if quant == "f32" else blob_weights(out / "model.bin")
    ref = _reference(ckpt, weights)
    want = [ref.forward(PROMPT)] + [ref.forward([t]) for t in PROMPT[:3]]
    ref.reset()
    want_tokens = ref.generate(PROMPT, N_GEN)
    for how, m in {"embedded": load(out / f"libcolibri_{out.name}.so"), "generic": load(out / "model.bin")}.items():
        got = [m.forward(PROMPT)] + [m.forward([t]) for t in PROMPT[:3]]
        if quant == "f32":
            for step, (g, e) in enumerate(zip(got, want, strict=True)):
                err, bound = float(np.max(np.abs(g - e))), 1e-4 * float(np.max(np.abs(e)))
                assert err <= bound, f"{family} {how} step {step}: max abs error {err:.3g} > {bound:.3g}"
        m.reset()
        assert m.generate(PROMPT, N_GEN) == want_tokens, f"{family} {how}: greedy tokens differ"


@pytest.mark.parametrize("quant", ["f32", "int8c"])
@pytest.mark.parametrize("target", [t for t in TARGETS if t != "host"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_target_matches_reference(family, target, quant, family_ckpts, build_model):
    require_target(target)
    ckpt = family_ckpts[family]
    out = build_model(ckpt, quant, target)
    weights = None if quant == "f32" else blob_weights(out / "model.bin")
    ref = _reference(ckpt, weights)
    want_logits = ref.forward(PROMPT)
    ref.reset()
    want_tokens = ref.generate(PROMPT, N_GEN)
    args = ("--tokens", ",".join(map(str, PROMPT)), "--generate", str(N_GEN), "--print-logits")
    tokens, logits = _parse(_run(target, out / "colibri_demo", *args))
    assert tokens == want_tokens, f"{family} {target} {quant}: tokens differ from the reference"
    if quant == "f32":
        assert float(np.max(np.abs(logits - want_logits))) <= 1e-4 * float(np.max(np.abs(want_logits)))


def _config(tmp_path: Path, cfg: dict) -> Path:
    d = tmp_path / "ck"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


DEEPSEEK_V2 = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "vocab_size": 100, "hidden_size": 32,
    "intermediate_size": 64, "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "kv_lora_rank": 16, "q_lora_rank": None, "qk_rope_head_dim": 8, "v_head_dim": 8, "qk_nope_head_dim": 8,
    "first_k_dense_replace": 1, "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
}


@pytest.mark.parametrize("cfg, key", [
    ({**DEEPSEEK_V2, "qk_rope_head_dim": 7}, "qk_rope_head_dim"),
    ({**DEEPSEEK_V2, "architectures": ["DeepseekForCausalLM"], "model_type": "deepseek"}, "kv_lora_rank"),
    ({**DEEPSEEK_V2, "architectures": ["DeepseekForCausalLM"], "model_type": "deepseek", "kv_lora_rank": None,
      "qk_rope_head_dim": None, "n_group": 4, "topk_group": 2}, "n_group"),
    ({**DEEPSEEK_V2, "architectures": ["DeepseekForCausalLM"], "model_type": "deepseek", "kv_lora_rank": None,
      "qk_rope_head_dim": None, "scoring_func": "sigmoid"}, "scoring_func"),
    ({"architectures": ["OlmoeForCausalLM"], "clip_qkv": 8.0}, "clip_qkv"),
    ({"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": True}, "attention_bias"),
])
def test_unsupported_config_names_the_key(cfg, key, tmp_path):
    with pytest.raises(ExportError, match=f"'{key}'"):
        open_checkpoint(_config(tmp_path, cfg))
