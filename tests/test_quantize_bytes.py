"""Corners of the quantizer that its speed-ups (#19) must keep byte for byte and that the exports of
test_export_hashes.py do not reach: int8c's outlier selection when ties straddle the cut (the n_out entries
of largest |w| / rms(group), as np.argpartition picks them below LEAN_MIN_WEIGHTS, and of the entries tied
at the threshold those first in memory order from it on, the row-chunked path), and the scale of a group of
zeros."""

from __future__ import annotations

import numpy as np

from colibri.codegen.quantize import DEFAULT_OUTLIER_FRAC, LEAN_MIN_WEIGHTS, quantize


def _tied_weights(rows: int, cols: int, seed: int) -> np.ndarray:
    """Weights of 41 distinct values: the threshold value is shared by many entries."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-20, 21, size=(rows, cols)) * 0.01).astype(np.float32)


def _scores(w: np.ndarray, g: int) -> np.ndarray:
    """|w| over the rms of its group of g inputs, float64, in memory order."""
    groups = np.abs(w).reshape(w.shape[0], -1, g).astype(np.float64)
    rms = np.sqrt(np.mean(groups * groups, axis=2, keepdims=True))
    return (groups / np.where(rms > 0, rms, 1.0)).reshape(-1)


def _straddles(score: np.ndarray, n_out: int) -> bool:
    kth = np.sort(score)[-n_out]
    return np.count_nonzero(score >= kth) > n_out


def test_ties_small_matrix_as_argpartition_picks():
    w = _tied_weights(256, 64, 1)
    n_out = int(DEFAULT_OUTLIER_FRAC * w.size)
    score = _scores(w, 64)
    assert _straddles(score, n_out)  # the case under test: more entries tie at the cut than fit
    want = np.sort(np.argpartition(-score, n_out - 1)[:n_out])
    assert np.array_equal(quantize(w, "int8c").oidx, want)


def test_ties_lean_matrix_first_in_memory_order():
    w = _tied_weights(-(-LEAN_MIN_WEIGHTS // 64), 64, 2)
    assert w.size >= LEAN_MIN_WEIGHTS
    for g in (64, 32):
        n_out = int(DEFAULT_OUTLIER_FRAC * w.size)
        score = _scores(w, g)
        assert _straddles(score, n_out)
        want = np.sort(np.argsort(-score, kind="stable")[:n_out])  # ties: the first in memory order
        assert np.array_equal(quantize(w, "int8c", group_size=g).oidx, want), g


def test_scale_of_zeros_is_positive_zero():
    w = np.ones((3, 64), dtype=np.float32)
    w[1], w[2] = 0.0, -0.0  # |w| is +0.0: the groups' scale is +0.0 (a -0.0 would be other bytes in the blob)
    for g in (0, 32):
        scales = quantize(w, "int8", group_size=g).scales
        assert scales[1:].tolist() == [[0.0] * scales.shape[1]] * 2 and not np.signbit(scales).any(), g
