"""llama.cpp's Q8_0, as ggml's quantize_row_q8_0_ref defines it: the baseline int8c must beat.

Blocks of 32 consecutive inputs; d = amax / 127 stored as fp16; q = roundf(x * (1 / d))
with d still in fp32 (round half away from zero); dequantized as fp16(d) * q.
8 bits per weight + 16 bits per 32 weights = 8.5 bits per weight.

llama.cpp multiplies a Q8_0 matrix with activations quantized the same way (ggml's vec_dot_type for
Q8_0 is Q8_0: quantize_row_q8_0 on each token's input, then integer block dot products), so
`Q8_0Weights` tells the numpy reference to do that for the Q8_0 matrices.
"""

from __future__ import annotations

import numpy as np

QK8_0 = 32
BITS_PER_WEIGHT = 8.5


def q8_0_dequantized(w: np.ndarray) -> np.ndarray:
    """Q8_0 weights, dequantized (a matrix of rows of whole 32-blocks)."""
    rows, cols = w.shape
    if cols % QK8_0:
        raise ValueError(f"Q8_0 needs rows that are a multiple of {QK8_0} (got {cols})")
    blocks = w.astype(np.float32).reshape(rows, cols // QK8_0, QK8_0)
    d = np.max(np.abs(blocks), axis=2, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    x = blocks * inv
    q = np.clip(np.sign(x) * np.floor(np.abs(x) + np.float32(0.5)), -127, 127)  # roundf
    return (d.astype(np.float16).astype(np.float32) * q).reshape(rows, cols)


def q8_0_activations(x: np.ndarray) -> np.ndarray:
    """A token's input as llama.cpp's Q8_0 matmul sees it: quantize_row_q8_0, dequantized."""
    return q8_0_dequantized(np.asarray(x, dtype=np.float32)[None, :])[0]


class Q8_0Weights(dict):
    """Weights for codegen.reference.Reference: the matrices in `quantized` are Q8_0 and take Q8_0
    activations (the reference's q8 hook), everything else stays as given."""

    def __init__(self, weights: dict[str, np.ndarray], quantized: set[str]) -> None:
        super().__init__({n: q8_0_dequantized(w) if n in quantized else w for n, w in weights.items()})
        self.quantized = quantized

    def q8(self, name: str) -> bool:
        return name in self.quantized

    def corrections(self, name: str) -> None:
        return None

    @staticmethod
    def quantize_activations(x: np.ndarray) -> np.ndarray:
        return q8_0_activations(x)
