"""llama.cpp's Q8_0, as ggml's quantize_row_q8_0_ref defines it: the baseline int8c must beat.

Blocks of 32 consecutive inputs; d = amax / 127 stored as fp16; q = roundf(x * (1 / d))
with d still in fp32 (round half away from zero); dequantized as fp16(d) * q.
8 bits per weight + 16 bits per 32 weights = 8.5 bits per weight.
"""

from __future__ import annotations

import numpy as np

QK8_0 = 32
BITS_PER_WEIGHT = 8.5


def q8_0_dequantized(w: np.ndarray) -> np.ndarray:
    rows, cols = w.shape
    if cols % QK8_0:
        raise ValueError(f"Q8_0 needs rows that are a multiple of {QK8_0} (got {cols})")
    blocks = w.astype(np.float32).reshape(rows, cols // QK8_0, QK8_0)
    d = np.max(np.abs(blocks), axis=2, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    x = blocks * inv
    q = np.clip(np.sign(x) * np.floor(np.abs(x) + np.float32(0.5)), -127, 127)  # roundf
    return (d.astype(np.float16).astype(np.float32) * q).reshape(rows, cols)
