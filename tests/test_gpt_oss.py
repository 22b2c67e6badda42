"""gpt-oss (GptOssForCausalLM) on a checkpoint transformers itself writes (save_pretrained of a randomly
initialised tiny model: stacked, interleaved expert tensors): the numpy reference against transformers'
logits at every position for sequences past the sliding window, the C runtime (f32, int8c, int4c) against
the reference on every Linux target (tests/every_target.py), and the refusals.

The tiny model keeps every feature in play: alternating sliding (window 5) and full layers, sinks and
biases made nonzero by make_hf, YaRN with its attention factor, and a SwiGLU limit (0.05) small enough
that the clamps bite.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest
from every_target import QUANTS, check_every_target
from test_dense import hf_logits, make_hf

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.errors import ExportError
from colibri.codegen.reference import Reference
from colibri.codegen.spec import canonical_names
from colibri.runtime import load

from blobread import header, params_records
from blobread import weights as blob_weights

VOCAB = 97
PROMPT = [3, 17, 42, 5, 9, 60, 11, 2, 88, 31]  # 10 > the window
N_GEN = 16
SEQ_LENS = (1, 9, 40)
MAX_SEQ = 64
WINDOW = 5
LIMIT = 0.05
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
              max_position_embeddings=128, swiglu_limit=LIMIT, tie_word_embeddings=False, initializer_range=0.2,
              rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0, beta_fast=32.0, beta_slow=1.0,
                                   truncate=False, original_max_position_embeddings=32))


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    return make_hf(tmp_path_factory.mktemp("gpt-oss") / "gpt-oss", "GptOssConfig", CONFIG, seed=4)


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


@pytest.mark.parametrize("quant", QUANTS)
def test_every_target_matches_reference(quant, gpt_oss, build_model):
    check_every_target(build_model, gpt_oss, quant, lambda w: reference(gpt_oss, w), PROMPT, N_GEN,
                       f"MAX_SEQ={MAX_SEQ}", what="gpt-oss")


def test_greedy_stream_is_not_constant(gpt_oss):
    """A constant greedy stream would match a broken runtime too (hence initializer_range 0.2 and this seed)."""
    assert len(set(expectation("f32", None, gpt_oss)[1])) >= 4


def test_yarn_shows_in_the_target_prompt(gpt_oss):
    """The every-target test above is YaRN's on every Linux target: on its prompt the YaRN frequencies move the
    logits past that test's f32 tolerance and change its greedy tokens (a target left at default rope fails)."""
    want_logits, want_tokens = expectation("f32", None, gpt_oss)
    plain = reference(gpt_oss, rope_type="default")
    logits = plain.forward(PROMPT)
    plain.reset()
    assert float(np.max(np.abs(logits - want_logits))) > 1e-4 * float(np.max(np.abs(want_logits)))
    assert plain.generate(PROMPT, N_GEN) != want_tokens

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


# ---- MXFP4 checkpoints (the Hub's layout: `<expert tensor>_blocks`, `<expert tensor>_scales`)

def to_mxfp4(plain: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A stacked expert tensor (E, in, out) as MXFP4 blocks (E, out, in/32, 16) and scales (E, out, in/32):
    the layout transformers' convert_moe_packed_tensors reads (its transpose(1, 2) undone), each block's
    power of two the smallest that fits its largest value in FP4's 6, each value its nearest FP4 code."""
    values = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    w = np.swapaxes(plain, 1, 2).astype(np.float64)  # (E, out, in)
    e_, out, n_in = w.shape
    blocks = w.reshape(e_, out, n_in // 32, 32)
    amax = np.max(np.abs(blocks), axis=-1)
    exp = np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)).astype(np.int32)
    scaled = blocks / np.ldexp(1.0, exp)[..., None]
    codes = np.argmin(np.abs(scaled[..., None] - values), axis=-1).astype(np.uint8)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.astype(np.uint8), (exp + 127).astype(np.uint8)


@pytest.fixture(scope="module")
def mxfp4_ckpt(tmp_path_factory):
    """The MXFP4 round trip's cost is measured at transformers' own initializer_range (0.02), the scale of real
    weights, not at the 0.2 that keeps gpt_oss's greedy stream from settling."""
    from safetensors.numpy import load_file, save_file

    config = {k: v for k, v in CONFIG.items() if k != "initializer_range"}
    out = make_hf(tmp_path_factory.mktemp("gpt-oss-mxfp4") / "gpt-oss-mxfp4", "GptOssConfig", config, seed=3)
    tensors = load_file(out / "model.safetensors")
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = to_mxfp4(tensors.pop(name))
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def test_mxfp4_dequantizes_as_transformers(mxfp4_ckpt):
    import torch
    from safetensors.numpy import load_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    t = load_file(mxfp4_ckpt / "model.safetensors")
    c = open_checkpoint(mxfp4_ckpt)
    assert c.source_dtypes["layers.1.moe.experts.2.gate"] == "MXFP4"
    for layer in range(2):
        p = f"model.layers.{layer}.mlp.experts."
        gate_up, down = (convert_moe_packed_tensors(torch.from_numpy(t[p + f"{w}_blocks"]),
                                                    torch.from_numpy(t[p + f"{w}_scales"]), dtype=torch.float32).numpy()
                         for w in ("gate_up_proj", "down_proj"))
        for e in range(4):
            q = f"layers.{layer}.moe.experts.{e}."
            assert np.array_equal(c.get(q + "gate"), gate_up[e][:, 0::2].T)
            assert np.array_equal(c.get(q + "up"), gate_up[e][:, 1::2].T)
            assert np.array_equal(c.get(q + "down"), down[e].T)


def test_mxfp4_to_int8c(mxfp4_ckpt, build_model):
    """MXFP4 -> float32 -> int8c: the int8c runtime's greedy tokens equal the reference's on the dequantized
    weights, and what the second quantization costs (printed: weight error, logit error, KL)."""
    out = build_model(mxfp4_ckpt, "int8c", "host", f"MAX_SEQ={MAX_SEQ}")
    deq = reference(mxfp4_ckpt)
    want_tokens = deq.generate(PROMPT, N_GEN)
    m = load(out / "model.bin")
    assert m.generate(PROMPT, N_GEN) == want_tokens
    c, bw = open_checkpoint(mxfp4_ckpt), blob_weights(out / "model.bin")
    experts = [n for n in canonical_names(c.spec) if ".experts." in n and not n.endswith("_bias")]
    err = np.sqrt(sum(float(np.sum((bw[n] - c.get(n)) ** 2)) for n in experts)
                  / sum(float(np.sum(c.get(n) ** 2)) for n in experts))
    a, b = _all_positions(reference(mxfp4_ckpt), PROMPT), _all_positions(reference(mxfp4_ckpt, bw), PROMPT)
    pa = np.exp(a - a.max(-1, keepdims=True))
    pa /= pa.sum(-1, keepdims=True)
    pb = np.exp(b - b.max(-1, keepdims=True))
    pb /= pb.sum(-1, keepdims=True)
    kl = float(np.max(np.sum(pa * np.log(pa / pb), axis=-1)))
    rel = float(np.max(np.abs(a - b)) / np.max(np.abs(a)))
    print(f"\nMXFP4 -> int8c: expert weights rel. error {err:.2e}, max logit error {rel:.2e} of max|logit|, "
          f"max KL {kl:.2e} nats over {len(PROMPT)} positions")
    assert err < 2e-2 and kl < 1e-3


@pytest.mark.parametrize("blocks, scales, what", [
    ((4, 64, 2, 16), (4, 64, 2), "2 blocks of 32 dequantize"),  # one block too many for hidden 32
    ((4, 64, 1, 16), (4, 64, 2), "disagree on the block count"),
    ((4, 64, 1, 8), (4, 64, 1), "not (..., rows, blocks, 16) bytes"),
])
def test_mxfp4_wrong_blocks_named(mxfp4_ckpt, tmp_path, blocks, scales, what):
    import shutil

    from safetensors.numpy import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(mxfp4_ckpt, bad)
    t = load_file(bad / "model.safetensors")
    name = "model.layers.1.mlp.experts.gate_up_proj_blocks"
    t[name] = np.zeros(blocks, np.uint8)
    t[name.replace("_blocks", "_scales")] = np.full(scales, 127, np.uint8)
    save_file(t, bad / "model.safetensors")
    with pytest.raises(ExportError, match=re.escape(what)) as e:
        open_checkpoint(bad)
    assert name in str(e.value)


def test_mixed_layers_ring_cache(gpt_oss, build_model):
    """Prefill blocks of 4: the sliding layer's cache is a ring of 5 + 4 - 1 = 8 positions, the full layer's
    max_seq; the 10-token prompt and 16 new tokens wrap the ring, and the runtime still equals the reference."""
    import json as _json

    from colibri.codegen import format as fmt

    out = build_model(gpt_oss, "f32", "host", f"MAX_SEQ={MAX_SEQ}", "PREFILL_BLOCK=4")
    spec = open_checkpoint(gpt_oss).spec
    arena = _json.loads((out / "manifest.json").read_text())["arena"]
    row = fmt.kv_row_bytes("f32", spec.n_kv_heads, spec.head_dim)
    assert arena["prefill_block"] == 4 and arena["kv_cache_bytes"] == 2 * (WINDOW + 4 - 1 + MAX_SEQ) * row
    want_logits, want_tokens = expectation("f32", out, gpt_oss)
    m = load(out / "model.bin")
    got = m.forward(PROMPT)
    assert float(np.max(np.abs(got - want_logits))) <= 1e-4 * float(np.max(np.abs(want_logits)))
    m.reset()
    assert m.generate(PROMPT, N_GEN) == want_tokens
