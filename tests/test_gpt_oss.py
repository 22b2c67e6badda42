"""gpt-oss (GptOssForCausalLM) on a checkpoint transformers itself writes (save_pretrained of a randomly
initialised tiny model: stacked, interleaved expert tensors): the numpy reference against transformers'
logits at every position for sequences past the sliding window, the C runtime (f32, int8c) against the
reference on host, rpi4 and riscv64, and the refusals.

The tiny model keeps every feature in play: alternating sliding (window 5) and full layers, sinks and
biases made nonzero by make_hf, YaRN with its attention factor, and a SwiGLU limit (0.05) small enough
that the clamps bite.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from test_cross import _parse, _run
from test_dense import hf_logits, make_hf

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.errors import ExportError
from colibri.codegen.reference import Reference
from colibri.codegen.spec import canonical_names
from colibri.runtime import load

from blobread import header, params_records
from blobread import weights as blob_weights
from conftest import require_target

VOCAB = 97
PROMPT = [3, 17, 42, 5, 9, 60, 11, 2, 88, 31]  # 10 > the window
N_GEN = 16
SEQ_LENS = (1, 9, 40)
MAX_SEQ = 64
WINDOW = 5
LIMIT = 0.05
TARGETS = ["rpi4", "riscv64"]
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
              max_position_embeddings=128, swiglu_limit=LIMIT, tie_word_embeddings=False,
              rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0, beta_fast=32.0, beta_slow=1.0,
                                   truncate=False, original_max_position_embeddings=32))


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    return make_hf(tmp_path_factory.mktemp("gpt-oss") / "gpt-oss", "GptOssConfig", CONFIG, seed=3)


def reference(ckpt, weights=None, **change) -> Reference:
    c = open_checkpoint(ckpt)
    w = weights if weights is not None else {n: c.get(n) for n in canonical_names(c.spec)}
    return Reference(replace(c.spec, **change), w, max_seq=MAX_SEQ)


def _all_positions(r: Reference, tokens: list[int]) -> np.ndarray:
    return np.stack([r.forward([t]) for t in tokens])


def test_spec_features(gpt_oss):
    s = open_checkpoint(gpt_oss).spec
    assert s.arch == "gpt-oss" and s.n_experts == 4 and s.top_k == 2 and s.ffn == 32 and s.head_dim == 8
    assert s.qkv_bias and s.o_bias and s.attn_sinks and s.expert_bias and s.norm_topk_prob
    assert s.sliding_window == (WINDOW, 0)  # layer_types: sliding, full
    assert (s.swiglu_alpha, s.swiglu_limit) == (1.702, LIMIT)
    assert s.rope_type == "yarn" and not s.rope_truncate and s.rope_attention_factor == pytest.approx(
        0.1 * np.log(4.0) + 1)


def test_reference_matches_transformers(gpt_oss):
    rng = np.random.default_rng(3)
    for n in SEQ_LENS:
        tokens = [int(t) for t in rng.integers(0, VOCAB, n)]
        want = hf_logits(gpt_oss, tokens)
        got = _all_positions(reference(gpt_oss), tokens)
        assert float(np.max(np.abs(got - want))) <= 1e-5 * float(np.max(np.abs(want))), n
    # each feature matters here: without the clamp, the sinks or the window the logits move
    scale = float(np.max(np.abs(want)))
    for change in (dict(swiglu_limit=1e9), dict(attn_sinks=False), dict(sliding_window=())):
        other = _all_positions(reference(gpt_oss, **change), tokens)
        assert float(np.max(np.abs(other - want))) > 1e-3 * scale, change


def expectation(quant, out, ckpt):
    ref = reference(ckpt, None if quant == "f32" else blob_weights(out / "model.bin"))
    want_logits = ref.forward(PROMPT)
    ref.reset()
    return want_logits, ref.generate(PROMPT, N_GEN)


def test_blob_flags_and_parameters(gpt_oss, build_model):
    raw = (build_model(gpt_oss, "f32", "host", f"MAX_SEQ={MAX_SEQ}") / "model.bin").read_bytes()
    flags = header(raw)["flags"]
    # QKV_BIAS, PARAMS, SLIDING_WINDOW, ATTN_SINKS, O_BIAS, EXPERT_BIAS, CLAMPED_SWIGLU
    for bit in (1, 10, 11, 12, 13, 16, 17):
        assert flags >> bit & 1, bit
    recs = params_records(raw)
    assert recs[0] == (1, 0, WINDOW) and [r[:2] for r in recs] == [(1, 0), (2, 0), (3, 0)]  # layer 1: full
    assert np.float32(np.frombuffer(np.uint32(recs[2][2]).tobytes(), np.float32)[0]) == np.float32(LIMIT)


@pytest.mark.parametrize("quant", ["f32", "int8c", "int4c"])
def test_host_matches_reference(quant, gpt_oss, build_model):
    out = build_model(gpt_oss, quant, "host", f"MAX_SEQ={MAX_SEQ}")
    want_logits, want_tokens = expectation(quant, out, gpt_oss)
    m = load(out / "model.bin")
    got = m.forward(PROMPT)
    if quant == "f32":
        assert float(np.max(np.abs(got - want_logits))) <= 1e-4 * float(np.max(np.abs(want_logits)))
    m.reset()
    assert m.generate(PROMPT, N_GEN) == want_tokens, f"{quant}: greedy tokens differ"


@pytest.mark.parametrize("quant", ["f32", "int8c"])
@pytest.mark.parametrize("target", TARGETS)
def test_target_matches_reference(target, quant, gpt_oss, build_model):
    require_target(target)
    out = build_model(gpt_oss, quant, target, f"MAX_SEQ={MAX_SEQ}")
    want_logits, want_tokens = expectation(quant, out, gpt_oss)
    args = ("--tokens", ",".join(map(str, PROMPT)), "--generate", str(N_GEN), "--print-logits")
    tokens, logits = _parse(_run(target, out / "colibri_demo", *args))
    assert tokens == want_tokens, f"{target} {quant}: tokens differ from the reference"
    if quant == "f32":
        assert float(np.max(np.abs(logits - want_logits))) <= 1e-4 * float(np.max(np.abs(want_logits)))


BASE = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", **CONFIG}


@pytest.mark.parametrize("change, key", [
    ({"layer_types": ["sliding_attention", "chunked_attention"]}, "layer_types"),
    ({"layer_types": ["full_attention"]}, "layer_types"),
    ({"sliding_window": 0}, "sliding_window"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}, "rope_parameters"),
    ({"swiglu_limit": -1.0}, "swiglu_limit"),
    ({"attention_bias": "yes"}, "attention_bias"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
])
def test_unsupported_config_names_the_key(change, key, tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**BASE, **change}))
    with pytest.raises(ExportError, match=f"key '{key}'"):
        open_checkpoint(d)
