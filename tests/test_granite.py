"""Granite-MoE (GraniteMoeForCausalLM, GraniteMoeSharedForCausalLM) on checkpoints transformers itself
writes: fused experts on disk, the four multipliers folded into weights at import, the shared MLP, routing
as top-k then softmax; the reference against transformers, the C runtime (f32, int8c, int4c) against the
reference on every Linux target (tests/every_target.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from every_target import QUANTS, check_every_target
from test_dense import N_GEN, PROMPT, SEQ_LENS, hf_logits, make_hf, reference, runtime_expectation

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.errors import ExportError
from colibri.codegen.spec import canonical_names
from colibri.runtime import load

VOCAB = 89
_BASE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, num_local_experts=5, num_experts_per_tok=2, max_position_embeddings=128,
             rms_norm_eps=1e-6, embedding_multiplier=6.0, attention_multiplier=0.0625, residual_multiplier=0.22,
             logits_scaling=4.0, rope_parameters=dict(rope_type="default", rope_theta=10000.0))
CASES = {
    "granitemoe": ("GraniteMoeConfig", dict(_BASE, tie_word_embeddings=True)),
    "granitemoeshared": ("GraniteMoeSharedConfig", dict(_BASE, shared_intermediate_size=40,
                                                        tie_word_embeddings=False)),
}


@pytest.fixture(scope="module")
def granite_ckpts(tmp_path_factory):
    base = tmp_path_factory.mktemp("granite")
    return {f: make_hf(base / f, *CASES[f], seed=40 + i) for i, f in enumerate(sorted(CASES))}


def test_spec_features(granite_ckpts):
    s = {f: open_checkpoint(p).spec for f, p in granite_ckpts.items()}
    assert s["granitemoe"].shared_ffn == 0 and s["granitemoe"].tied and s["granitemoe"].norm_topk_prob
    assert s["granitemoeshared"].shared_ffn == 40 and not s["granitemoeshared"].shared_gate
    assert all(sp.n_experts == 5 and sp.top_k == 2 and sp.ffn == 24 for sp in s.values())


@pytest.mark.parametrize("family", sorted(CASES))
def test_reference_matches_transformers(family, granite_ckpts):
    rng = np.random.default_rng(8)
    for n in SEQ_LENS:
        tokens = [int(t) for t in rng.integers(0, VOCAB, n)]
        want = hf_logits(granite_ckpts[family], tokens)
        r = reference(granite_ckpts[family])
        got = np.stack([r.forward([t]) for t in tokens])
        assert float(np.max(np.abs(got - want))) <= 1e-5 * float(np.max(np.abs(want))), (family, n)


@pytest.mark.parametrize("quant", ["f32", "int8c"])
@pytest.mark.parametrize("family", sorted(CASES))
def test_host_matches_reference(family, quant, granite_ckpts, build_model):
    out = build_model(granite_ckpts[family], quant)
    _, want_logits, want_tokens = runtime_expectation(family, quant, out, granite_ckpts[family])
    m = load(out / "model.bin")
    got = m.forward(PROMPT)
    if quant == "f32":
        assert float(np.max(np.abs(got - want_logits))) <= 1e-4 * float(np.max(np.abs(want_logits)))
    m.reset()
    assert m.generate(PROMPT, N_GEN) == want_tokens, f"{family} {quant}: greedy tokens differ"


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("family", sorted(CASES))
def test_every_target_matches_reference(family, quant, granite_ckpts, build_model):
    ckpt = granite_ckpts[family]
    check_every_target(build_model, ckpt, quant, lambda w: reference(ckpt, w), PROMPT, N_GEN, what=family)


GRANITE = {"architectures": ["GraniteMoeForCausalLM"], "model_type": "granitemoe", "vocab_size": 100,
           "hidden_size": 32, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
           "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}


@pytest.mark.parametrize("cfg, key", [
    ({**GRANITE, "attention_bias": True}, "attention_bias"),
    ({**GRANITE, "embedding_multiplier": 0}, "embedding_multiplier"),
    ({**GRANITE, "logits_scaling": "x"}, "logits_scaling"),
    ({**GRANITE, "residual_multiplier": -1.0}, "residual_multiplier"),
    ({**GRANITE, "attention_multiplier": float("inf")}, "attention_multiplier"),
    ({**GRANITE, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({**GRANITE, "num_experts_per_tok": 5}, "num_experts_per_tok"),
    ({**GRANITE, "architectures": ["GraniteMoeSharedForCausalLM"], "shared_intermediate_size": -2},
     "shared_intermediate_size"),
])
def test_unsupported_config_names_the_key(cfg, key, tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportError, match=f"key '{key}'"):
        open_checkpoint(d)


def test_fused_expert_of_wrong_shape_is_refused(granite_ckpts, tmp_path):
    """input_linear must hold gate and up of every expert: one expert short is refused, naming the tensor."""
    from safetensors.numpy import load_file, save_file

    src = granite_ckpts["granitemoe"]
    d = tmp_path / "ck"
    d.mkdir()
    (d / "config.json").write_text((src / "config.json").read_text())
    t = load_file(src / "model.safetensors")
    name = "model.layers.1.block_sparse_moe.input_linear.weight"
    t[name] = t[name][:4]
    save_file(t, d / "model.safetensors")
    with pytest.raises(ExportError, match="input_linear"):
        open_checkpoint(d)
    assert canonical_names(open_checkpoint(src).spec)
