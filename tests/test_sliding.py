"""Sliding-window attention (Mistral `sliding_window`) on a checkpoint transformers itself writes: the
numpy reference against transformers' logits at every position for sequences longer than the window, the
C runtime (f32, int8c; single steps and prefill blocks through a ring KV cache) against the reference on
host, rpi4 and riscv64, the blob's SLIDING_WINDOW parameters and the ring cache's arena bytes.

The window (6) is far below the sequences (up to 40 positions) and the blob's max_seq (48); with
PREFILL_BLOCK=4 each layer's cache is a ring of 6 + 4 - 1 = 9 positions, so the 20-token prompt wraps it
inside a prefill block and the 16 generated tokens wrap it again.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from test_cross import _parse, _run
from test_dense import _BASE, VOCAB, hf_logits, make_hf

from colibri.codegen import format as fmt
from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.inspect import format_report, inspect
from colibri.codegen.plan import plan_arena
from colibri.codegen.reference import Reference
from colibri.codegen.spec import canonical_names
from colibri.runtime import load

from blobread import header, params_records
from blobread import weights as blob_weights
from conftest import require_target

WINDOW = 6
MAX_SEQ = 48
BLOCK = 4
PROMPT = [3, 17, 42, 5, 9, 60, 11, 2, 88, 31, 7, 19, 54, 23, 70, 1, 45, 38, 12, 96]  # 20 > the window
N_GEN = 16
SEQ_LENS = (1, 9, 40)
OPTS = (f"MAX_SEQ={MAX_SEQ}", f"PREFILL_BLOCK={BLOCK}")
TARGETS = ["rpi4", "riscv64"]


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    kw = dict(_BASE, sliding_window=WINDOW, rope_parameters=dict(rope_type="default", rope_theta=10000.0))
    return make_hf(tmp_path_factory.mktemp("sliding") / "mistral", "MistralConfig", kw, seed=11)


def reference(ckpt, weights=None) -> Reference:
    c = open_checkpoint(ckpt)
    w = weights if weights is not None else {n: c.get(n) for n in canonical_names(c.spec)}
    return Reference(c.spec, w, max_seq=MAX_SEQ)


def test_spec_keeps_max_position_and_windows_every_layer(mistral):
    spec = open_checkpoint(mistral).spec
    assert spec.max_position == _BASE["max_position_embeddings"]  # no longer capped at the window
    assert spec.sliding_window == (WINDOW,) * _BASE["num_hidden_layers"]


def test_reference_matches_transformers_past_the_window(mistral):
    rng = np.random.default_rng(5)
    for n in SEQ_LENS:
        tokens = [int(t) for t in rng.integers(0, VOCAB, n)]
        want = hf_logits(mistral, tokens)
        r = reference(mistral)
        got = np.stack([r.forward([t]) for t in tokens])
        assert float(np.max(np.abs(got - want))) <= 1e-5 * float(np.max(np.abs(want))), n
    # the window matters: full attention gives other logits past it
    c = open_checkpoint(mistral)
    full = Reference(replace(c.spec, sliding_window=()), {n: c.get(n) for n in canonical_names(c.spec)},
                     max_seq=MAX_SEQ)
    got_full = np.stack([full.forward([t]) for t in tokens])
    assert float(np.max(np.abs(got_full - want))) > 1e-3 * float(np.max(np.abs(want)))


def expectation(quant, out, ckpt):
    ref = reference(ckpt, None if quant == "f32" else blob_weights(out / "model.bin"))
    want_logits = ref.forward(PROMPT)
    ref.reset()
    return want_logits, ref.generate(PROMPT, N_GEN)


def test_blob_parameters_and_ring_arena(mistral, build_model):
    out = build_model(mistral, "f32", "host", *OPTS)
    raw = (out / "model.bin").read_bytes()
    h = header(raw)
    assert h["flags"] & (1 << 11) and h["flags"] & (1 << 10)  # SLIDING_WINDOW, PARAMS
    assert params_records(raw) == [(1, layer, WINDOW) for layer in range(_BASE["num_hidden_layers"])]
    spec = open_checkpoint(mistral).spec
    ring = WINDOW + BLOCK - 1
    row = fmt.kv_row_bytes("f32", spec.n_kv_heads, spec.head_dim)
    plan = plan_arena(spec, MAX_SEQ, BLOCK)
    assert plan.kv_cache_bytes == 2 * spec.n_layers * ring * row  # not max_seq rows
    full = plan_arena(replace(spec, sliding_window=()), MAX_SEQ, BLOCK)
    assert full.kv_cache_bytes == 2 * spec.n_layers * MAX_SEQ * row
    assert h["arena_bytes"] == plan.arena_bytes < full.arena_bytes
    print(f"\nmistral window {WINDOW}, max_seq {MAX_SEQ}, block {BLOCK}: KV cache {plan.kv_cache_bytes} bytes "
          f"(ring of {ring}) vs {full.kv_cache_bytes}; arena {plan.arena_bytes} vs {full.arena_bytes}")
    report = format_report(inspect(out / "model.bin"))
    assert f"SLIDING_WINDOW: layer 0 {WINDOW}, layer 1 {WINDOW}" in report


@pytest.mark.parametrize("quant", ["f32", "int8c"])
def test_host_matches_reference(quant, mistral, build_model):
    out = build_model(mistral, quant, "host", *OPTS)
    want_logits, want_tokens = expectation(quant, out, mistral)
    m = load(out / "model.bin")
    got = m.forward(PROMPT)  # prefill blocks of 4 through the ring
    if quant == "f32":
        assert float(np.max(np.abs(got - want_logits))) <= 1e-4 * float(np.max(np.abs(want_logits)))
    m.reset()
    step = np.stack([m.forward([t]) for t in PROMPT])[-1]  # single steps give the prefill's logits
    assert np.array_equal(step, got)
    m.reset()
    assert m.generate(PROMPT, N_GEN) == want_tokens, f"{quant}: greedy tokens differ"


@pytest.mark.parametrize("quant", ["f32", "int8c"])
@pytest.mark.parametrize("target", TARGETS)
def test_target_matches_reference(target, quant, mistral, build_model):
    require_target(target)
    out = build_model(mistral, quant, target, *OPTS)
    want_logits, want_tokens = expectation(quant, out, mistral)
    args = ("--tokens", ",".join(map(str, PROMPT)), "--generate", str(N_GEN), "--print-logits")
    tokens, logits = _parse(_run(target, out / "colibri_demo", *args))
    assert tokens == want_tokens, f"{target} {quant}: tokens differ from the reference"
    if quant == "f32":
        assert float(np.max(np.abs(logits - want_logits))) <= 1e-4 * float(np.max(np.abs(want_logits)))
