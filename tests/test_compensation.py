"""int8c against llama.cpp's Q8_0 at no more bits, end to end (KL and top-1 against fp32)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.reference import Reference
from colibri.codegen.spec import canonical_names
from colibri.runtime import load

from conftest import synth
from logit_stats import log_softmax, stepwise
from q8_0 import BITS_PER_WEIGHT, Q8_0Weights

HEAVY = {
    "heavy_a": dict(layers=2, hidden=128, ffn=256, heads=4, kv_heads=2, experts=4, top_k=2, vocab=256, seed=5,
                    heavy_tail=True),
    "heavy_b": dict(layers=3, hidden=192, ffn=384, heads=6, kv_heads=2, experts=6, top_k=2, vocab=320, seed=17,
                    heavy_tail=True),
}
N_SEQS, SEQ_LEN = 48, 24


def _keeps_precision(name: str) -> bool:  # llama.cpp keeps norms and the expert router in f32 too
    return name.endswith("norm") or name.endswith("moe.router")


def _errors(base: np.ndarray, other: np.ndarray) -> tuple[float, float]:
    p, q = log_softmax(base), log_softmax(other)
    kl = float(np.mean(np.sum(np.exp(p) * (p - q), axis=-1)))
    return kl, float(np.mean(base.argmax(-1) == other.argmax(-1)))


@pytest.mark.parametrize("case", sorted(HEAVY))
def test_int8c_beats_q8_0_at_no_more_bits(case, tmp_path, build_model):
    ckpt = synth(tmp_path / case, **HEAVY[case])
    c = open_checkpoint(ckpt)
    weights = {n: c.get(n) for n in canonical_names(c.spec)}
    seqs = np.random.default_rng(0).integers(0, c.spec.vocab, size=(N_SEQS, SEQ_LEN))

    fp32 = Reference(c.spec, weights, max_seq=64)
    base = stepwise(fp32.forward, fp32.reset, seqs)
    q8 = Reference(c.spec, Q8_0Weights(weights, {n for n in weights if not _keeps_precision(n)}), max_seq=64)
    q8_err = _errors(base, stepwise(q8.forward, q8.reset, seqs))

    out = build_model(ckpt, "int8c", "host", "GROUP_SIZE=64", "MAX_SEQ=64")
    manifest = json.loads((out / "manifest.json").read_text())
    quantized = [t for t in manifest["tensors"] if t["quant"] == "int8c"]
    bits = sum(t["payload_bits"] for t in quantized) / sum(int(np.prod(t["shape"])) for t in quantized)
    assert {t["name"] for t in quantized} == {n for n in weights if not _keeps_precision(n)}
    assert bits <= BITS_PER_WEIGHT, f"int8c spends {bits:.3f} bits per weight"

    m = load(out / f"libcolibri_{out.name}.so")
    i8c_err = _errors(base, stepwise(m.forward, m.reset, seqs))
    assert i8c_err[0] < q8_err[0], f"KL: int8c {i8c_err[0]:.3e} vs Q8_0 {q8_err[0]:.3e}"
    assert i8c_err[1] > q8_err[1], f"top-1 agreement: int8c {i8c_err[1]:.4f} vs Q8_0 {q8_err[1]:.4f}"
