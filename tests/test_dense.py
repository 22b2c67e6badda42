"""Dense Llama, Mistral, Qwen2 and Qwen3 on checkpoints transformers itself writes (save_pretrained of a
randomly initialised tiny model): the numpy reference against transformers' logits at every position,
the C runtime (f32, int8c, int4c) against the reference on every Linux target (tests/every_target.py), and
the refusals.

torch and transformers are dev-only extras (see README); the checkpoints are made here, so a missing
extra skips (a failure under CI=true, conftest). The version used is written to each checkpoint's
colibri_fixture.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from every_target import QUANTS, check_every_target

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.errors import ExportError
from colibri.codegen.reference import Reference
from colibri.codegen.spec import canonical_names
from colibri.runtime import load

from blobread import weights as blob_weights

PROMPT = [3, 17, 42, 5, 9]
N_GEN = 16
SEQ_LENS = (1, 9, 40)
VOCAB = 97
_BASE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False)
CASES = {
    # llama3 rope scaling (Llama 3.2), head_dim 12 != 32 / 4, tied embeddings
    "llama": ("LlamaConfig", dict(_BASE, head_dim=12, tie_word_embeddings=True, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16))),
    # sliding window of 64 >= every sequence here (tests/test_sliding.py runs sequences past a window)
    "mistral": ("MistralConfig", dict(_BASE, sliding_window=64, rope_parameters=dict(rope_type="default",
                                                                                      rope_theta=10000.0))),
    "qwen2": ("Qwen2Config", dict(_BASE, rope_parameters=dict(rope_type="default", rope_theta=1e6))),
    "qwen3": ("Qwen3Config", dict(_BASE, head_dim=16, rope_parameters=dict(rope_type="default", rope_theta=1e6))),
}


def make_hf(path: Path, cls: str, kw: dict, seed: int) -> Path:
    """save_pretrained of a randomly initialised transformers model of config class `cls`."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = getattr(transformers, cls)(**kw)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # HF initialises norms to 1 and biases to 0: make them matter
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(path)
    (path / "colibri_fixture.json").write_text(json.dumps({"transformers": transformers.__version__,
                                                           "torch": torch.__version__}) + "\n")
    return path


@pytest.fixture(scope="module")
def dense_ckpts(tmp_path_factory):
    base = tmp_path_factory.mktemp("dense")
    return {f: make_hf(base / f, *CASES[f], seed=i + 1) for i, f in enumerate(sorted(CASES))}


def reference(ckpt: Path, weights=None) -> Reference:
    c = open_checkpoint(ckpt)
    w = weights if weights is not None else {n: c.get(n) for n in canonical_names(c.spec)}
    return Reference(c.spec, w, max_seq=64)


def hf_logits(ckpt: Path, tokens: list[int]) -> np.ndarray:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].numpy().astype(np.float32)


def test_spec_features(dense_ckpts):
    s = {f: open_checkpoint(p).spec for f, p in dense_ckpts.items()}
    for f, spec in s.items():
        assert spec.all_dense and spec.dense_ffn == 48 and spec.arch == f, f
        assert not any(n.startswith("layers.0.moe") for n in canonical_names(spec)), f
    assert s["llama"].rope_type == "llama3" and s["llama"].head_dim == 12 and s["llama"].tied
    assert s["mistral"].max_position == 128 and s["mistral"].sliding_window == (64, 64)
    assert s["qwen2"].qkv_bias and s["qwen3"].qk_norm == "head" and s["qwen3"].head_dim == 16


@pytest.mark.parametrize("family", sorted(CASES))
def test_reference_matches_transformers(family, dense_ckpts):
    rng = np.random.default_rng(7)
    for n in SEQ_LENS:
        tokens = [int(t) for t in rng.integers(0, VOCAB, n)]
        want = hf_logits(dense_ckpts[family], tokens)
        r = reference(dense_ckpts[family])
        got = np.stack([r.forward([t]) for t in tokens])
        assert float(np.max(np.abs(got - want))) <= 1e-5 * float(np.max(np.abs(want))), (family, n)


def runtime_expectation(family, quant, out, ckpt):
    weights = None if quant == "f32" else blob_weights(out / "model.bin")
    ref = reference(ckpt, weights)
    want_logits = ref.forward(PROMPT)
    ref.reset()
    return ref, want_logits, ref.generate(PROMPT, N_GEN)


@pytest.mark.parametrize("quant", ["f32", "int8c"])
@pytest.mark.parametrize("family", sorted(CASES))
def test_host_matches_reference(family, quant, dense_ckpts, build_model):
    out = build_model(dense_ckpts[family], quant)
    _, want_logits, want_tokens = runtime_expectation(family, quant, out, dense_ckpts[family])
    m = load(out / "model.bin")
    got = m.forward(PROMPT)
    if quant == "f32":
        assert float(np.max(np.abs(got - want_logits))) <= 1e-4 * float(np.max(np.abs(want_logits)))
    m.reset()
    assert m.generate(PROMPT, N_GEN) == want_tokens, f"{family} {quant}: greedy tokens differ"


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("family", sorted(CASES))
def test_every_target_matches_reference(family, quant, dense_ckpts, build_model):
    ckpt = dense_ckpts[family]
    check_every_target(build_model, ckpt, quant, lambda w: reference(ckpt, w), PROMPT, N_GEN, what=family)


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 100, "hidden_size": 32,
         "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}


@pytest.mark.parametrize("cfg, key", [
    ({**LLAMA, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({**LLAMA, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, "rope_parameters"),
    ({**LLAMA, "rope_parameters": {"rope_type": "longrope", "factor": 4.0, "rope_theta": 1e4}}, "rope_parameters"),
    ({**LLAMA, "rope_parameters": {"rope_type": "no-such-rope", "rope_theta": 1e4}}, "rope_parameters"),
    ({**LLAMA, "rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}},
     "rope_parameters.low_freq_factor"),
    ({**LLAMA, "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({**LLAMA, "attention_bias": True}, "attention_bias"),
    ({**LLAMA, "mlp_bias": True}, "mlp_bias"),
    ({**LLAMA, "hidden_act": "gelu"}, "hidden_act"),
    ({**LLAMA, "head_dim": 7}, "head_dim"),
    ({**LLAMA, "tie_word_embeddings": "yes"}, "tie_word_embeddings"),
    ({**LLAMA, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True}, "use_sliding_window"),
    ({**LLAMA, "architectures": ["Qwen3ForCausalLM"], "attention_bias": True}, "attention_bias"),
    ({**LLAMA, "architectures": ["MistralForCausalLM"], "sliding_window": 0}, "sliding_window"),
])
def test_unsupported_config_names_the_key(cfg, key, tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportError, match=f"key '{key}'"):
        open_checkpoint(d)
