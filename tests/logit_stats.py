"""Logits of a model run token by token, and their log-softmax: shared by the tests that compare a
quantized model's logits with the fp32 reference's."""

from __future__ import annotations

import numpy as np


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def stepwise(forward, reset, seqs) -> np.ndarray:
    """The logits at every position of every sequence, one forward step per token (reset between them)."""
    out = []
    for s in seqs:
        reset()
        out += [forward([int(t)]) for t in s]
    return np.array(out)
