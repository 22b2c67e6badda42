"""YaRN rope scaling (`rope_parameters` type `yarn`) on checkpoints transformers itself writes: the numpy
reference (codegen/rope.py's frequencies, the attention factor folded into the q/k weights or q/k norms)
against transformers' logits at every position, the C runtime (f32, int8c) against the reference on host
(YaRN changes only the exported tensors: the cross targets run them through tests/test_gpt_oss.py), and
the refused spellings.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_dense import _BASE, LLAMA, VOCAB, hf_logits, make_hf

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.errors import ExportError
from colibri.codegen.reference import Reference
from colibri.codegen.spec import canonical_names
from colibri.runtime import load

from blobread import weights as blob_weights

PROMPT = [3, 17, 42, 5, 9, 60, 11]
N_GEN = 16
SEQ_LENS = (1, 9, 40)
MAX_SEQ = 64
_YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=32)
CASES = {
    # the paper's attention factor (0.1 ln 4 + 1), default betas, truncated correction range
    "llama": ("LlamaConfig", dict(_BASE, rope_parameters=_YARN)),
    # per-head q/k norms: the factor goes into the norm weights; explicit betas, no truncation
    "qwen3": ("Qwen3Config", dict(_BASE, head_dim=16, rope_parameters=dict(
        _YARN, beta_fast=16.0, beta_slow=2.0, truncate=False))),
    # q/k biases; DeepSeek's mscale / mscale_all_dim ratio as the attention factor
    "qwen2": ("Qwen2Config", dict(_BASE, rope_parameters=dict(_YARN, factor=8.0, mscale=1.0, mscale_all_dim=0.5))),
}


@pytest.fixture(scope="module")
def yarn_ckpts(tmp_path_factory):
    base = tmp_path_factory.mktemp("yarn")
    return {f: make_hf(base / f, *CASES[f], seed=20 + i) for i, f in enumerate(sorted(CASES))}


def reference(ckpt, weights=None) -> Reference:
    c = open_checkpoint(ckpt)
    w = weights if weights is not None else {n: c.get(n) for n in canonical_names(c.spec)}
    return Reference(c.spec, w, max_seq=MAX_SEQ)


def test_spec_fields(yarn_ckpts):
    s = {f: open_checkpoint(p).spec for f, p in yarn_ckpts.items()}
    assert all(spec.rope_type == "yarn" and spec.rope_original_max == 32 for spec in s.values())
    assert s["llama"].rope_attention_factor == pytest.approx(0.1 * np.log(4.0) + 1.0)
    assert (s["qwen3"].rope_beta_fast, s["qwen3"].rope_beta_slow, s["qwen3"].rope_truncate) == (16.0, 2.0, False)
    assert s["qwen2"].rope_attention_factor == pytest.approx((0.1 * np.log(8.0) + 1) / (0.05 * np.log(8.0) + 1))


@pytest.mark.parametrize("family", sorted(CASES))
def test_reference_matches_transformers(family, yarn_ckpts):
    rng = np.random.default_rng(9)
    for n in SEQ_LENS:
        tokens = [int(t) for t in rng.integers(0, VOCAB, n)]
        want = hf_logits(yarn_ckpts[family], tokens)
        got = _all_positions(reference(yarn_ckpts[family]), tokens)
        assert float(np.max(np.abs(got - want))) <= 1e-5 * float(np.max(np.abs(want))), (family, n)


def _all_positions(r: Reference, tokens: list[int]) -> np.ndarray:
    return np.stack([r.forward([t]) for t in tokens])


def test_attention_factor_matters(yarn_ckpts):
    """Without the folded factor the logits move: the fold is what makes the reference agree."""
    from dataclasses import replace

    c = open_checkpoint(yarn_ckpts["llama"])
    tokens = list(range(1, 21))
    want = hf_logits(yarn_ckpts["llama"], tokens)
    spec = replace(c.spec, rope_attention_factor=1.0)
    f = c.spec.rope_attention_factor
    w = {n: c.get(n) / np.float32(f) if n.endswith(("attn.q", "attn.k")) else c.get(n)
         for n in canonical_names(c.spec)}
    got = _all_positions(Reference(spec, w, max_seq=MAX_SEQ), tokens)
    assert float(np.max(np.abs(got - want))) > 1e-3 * float(np.max(np.abs(want)))


def expectation(quant, out, ckpt):
    ref = reference(ckpt, None if quant == "f32" else blob_weights(out / "model.bin"))
    want_logits = ref.forward(PROMPT)
    ref.reset()
    return want_logits, ref.generate(PROMPT, N_GEN)


@pytest.mark.parametrize("quant", ["f32", "int8c"])
def test_host_matches_reference(quant, yarn_ckpts, build_model):
    out = build_model(yarn_ckpts["llama"], quant, "host", f"MAX_SEQ={MAX_SEQ}")
    want_logits, want_tokens = expectation(quant, out, yarn_ckpts["llama"])
    m = load(out / "model.bin")
    got = m.forward(PROMPT)
    if quant == "f32":
        assert float(np.max(np.abs(got - want_logits))) <= 1e-4 * float(np.max(np.abs(want_logits)))
    m.reset()
    assert m.generate(PROMPT, N_GEN) == want_tokens, f"{quant}: greedy tokens differ"


@pytest.mark.parametrize("rope, key", [
    ({"rope_type": "yarn", "rope_theta": 1e4, "factor": 0.5, "original_max_position_embeddings": 16},
     "rope_parameters.factor"),
    ({"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 0},
     "rope_parameters.original_max_position_embeddings"),
    ({"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "beta_fast": "fast"}, "rope_parameters.beta_fast"),
    ({"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "truncate": 1}, "rope_parameters.truncate"),
    ({"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "attention_factor": -1.0},
     "rope_parameters.attention_factor"),
    ({"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "low_freq_factor": 1.0},
     "rope_parameters.low_freq_factor"),
    ({"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}, "rope_parameters"),
    ({"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0}, "rope_parameters"),
])
def test_bad_yarn_names_the_key(rope, key, tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**LLAMA, "rope_parameters": rope}))
    with pytest.raises(ExportError, match=f"key '{key}'"):
        open_checkpoint(d)
