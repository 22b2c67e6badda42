"""int16's numpy side (quantize.quantize_int16, reference.quantize_q16; FORMAT.md "int16"): 14-bit weights with
a scale per row, multiplied with 14-bit activations per block of 32. Its range (a block's integer dot must fit
int32 on every ISA), its rounding bound, that it is far finer than int8 on heavy-tailed weights, and that the
reference really takes 14-bit activations for the matrices its hook names. (tests/test_int16.py: the runtime.)"""

from __future__ import annotations

import numpy as np
import pytest

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.format import INT16_MAX
from colibri.codegen.quantize import quantize, quantize_int16, relative_error
from colibri.codegen.reference import Reference, quantize_q8, quantize_q16
from colibri.codegen.spec import canonical_names

from conftest import synth


def heavy(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_t(3, size=(rows, cols)).astype(np.float32)


def test_a_blocks_integer_dot_fits_int32():
    assert 32 * INT16_MAX**2 < 2**31  # the ACT_BLOCK products of two 14-bit values, summed exactly in int32
    assert INT16_MAX < 2**15  # stored in int16


def test_weights_stay_in_range_and_within_half_a_step():
    w = heavy(24, 96)
    w[5] = 0.0
    qt = quantize_int16(w)
    q = qt.data.astype(np.int64)
    assert qt.data.dtype == np.int16 and qt.scales.dtype == np.float32 and qt.scales.shape == (24, 1)
    assert np.abs(q).max() <= INT16_MAX
    nonzero = np.arange(24) != 5
    assert (np.abs(q[nonzero]).max(axis=1) == INT16_MAX).all()  # each row's largest weight takes the full range
    assert (q[5] == 0).all() and qt.scales[5, 0] == 0.0 and (qt.dequantize()[5] == 0.0).all()
    step = qt.scales[:, 0].astype(np.float64)
    err = np.abs(w.astype(np.float64) - qt.dequantize().astype(np.float64))
    assert (err <= step[:, None] * 0.5 * (1 + 1e-5) + 1e-30).all()
    assert qt.payload_bits() == 16 * 24 * 96 + 32 * 24


def test_far_finer_than_int8_and_int8c_on_heavy_tails():
    w = heavy(64, 256, seed=1)
    e16 = relative_error(w, quantize_int16(w).dequantize())
    for quant in ("int8", "int8c"):
        assert e16 * 30 < relative_error(w, quantize(w, quant).dequantize()), quant


def test_activations_within_half_a_step_of_their_block():
    x = heavy(1, 32 * 7 + 5, seed=2).reshape(-1) * np.float32(3.0)
    xq = quantize_q16(x)
    pad = np.concatenate([x, np.zeros(-x.size % 32, dtype=np.float32)]).reshape(-1, 32)
    step = np.abs(pad).max(axis=1).astype(np.float64) / INT16_MAX
    err = np.abs(pad - np.concatenate([xq, np.zeros(-x.size % 32, dtype=np.float32)]).reshape(-1, 32))
    assert (err <= step[:, None] * 0.5 * (1 + 1e-4)).all()
    assert (err < np.abs(pad - np.concatenate([quantize_q8(x), np.zeros(-x.size % 32, np.float32)])
                    .reshape(-1, 32)) + step[:, None]).all()
    # the values are whole steps of their block: q * amax / QMAX with |q| <= QMAX
    q = np.rint(np.concatenate([xq, np.zeros(-x.size % 32, np.float32)]).reshape(-1, 32) / step[:, None])
    assert np.abs(q).max() == INT16_MAX


class Hooked(dict):
    """The float weights, with the reference's activation hooks naming every attention matrix."""

    def __init__(self, weights: dict[str, np.ndarray], hook: str) -> None:
        super().__init__(weights)
        self.hook = hook

    def q8(self, name: str) -> bool:
        return self.hook == "q8" and ".attn." in name

    def q16(self, name: str) -> bool:
        return self.hook == "q16" and ".attn." in name


@pytest.fixture(scope="module")
def logits(tmp_path_factory) -> dict[str, np.ndarray]:
    ck = synth(tmp_path_factory.mktemp("i16") / "ck", layers=2, hidden=64, ffn=64, heads=4, kv_heads=2, experts=2,
               top_k=1, vocab=96, seed=3)
    c = open_checkpoint(ck)
    weights = {n: np.asarray(c.get(n), dtype=np.float32) for n in canonical_names(c.spec)}
    out = {}
    for hook in ("none", "q8", "q16"):
        ref = Reference(c.spec, Hooked(weights, hook), max_seq=8)
        out[hook] = np.array([ref.forward([t]) for t in (5, 17, 42, 7)])
    return out


def test_the_reference_takes_14_bit_activations_where_the_hook_says(logits):
    e8 = np.abs(logits["q8"] - logits["none"]).max()
    e16 = np.abs(logits["q16"] - logits["none"]).max()
    assert e16 > 0.0  # the hook was taken: the activations were rounded
    assert e16 * 20 < e8  # to 14 bits, not 8 (2^6 finer steps)
