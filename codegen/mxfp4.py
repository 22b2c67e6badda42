"""MXFP4 expert tensors as the Hub's gpt-oss checkpoints store them (`<name>_blocks`, `<name>_scales`),
dequantized exactly as transformers' convert_moe_packed_tensors (integrations/mxfp4.py) does, in float32.

`<name>_blocks` (*prefix, rows, G, 16) uint8: per row G blocks of 32 FP4 (E2M1) codes, two a byte, the low
nibble first; `<name>_scales` (*prefix, rows, G) uint8: each block's power of two, biased by 127. The
dequantized (*prefix, rows, 32·G) is then transposed in its last two axes (transformers' `transpose(1, 2)`)
into the layout of the plain tensor (gpt-oss: gate_up_proj (experts, hidden, 2·ffn), down_proj
(experts, ffn, hidden)).
"""

from __future__ import annotations

import numpy as np

FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      dtype=np.float32)
BLOCK = 32  # values a scale covers
SUFFIXES = ("_blocks", "_scales")


def problem(blocks_shape: tuple[int, ...], scales_shape: tuple[int, ...]) -> str | None:
    """Why a blocks / scales pair is not MXFP4 (None when it is)."""
    if len(blocks_shape) < 3 or blocks_shape[-1] != BLOCK // 2:
        return f"blocks of shape {list(blocks_shape)}: not (..., rows, blocks, {BLOCK // 2}) bytes"
    if blocks_shape[:-1] != scales_shape:
        return f"blocks {list(blocks_shape)} and scales {list(scales_shape)} disagree on the block count"
    return None


def dequantized_shape(blocks_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The plain tensor's shape (after the transpose) of an MXFP4 pair."""
    *prefix, rows, groups, _ = blocks_shape
    return (*prefix, groups * BLOCK, rows)


def dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 (*prefix, 32·G, rows): the codes' values times 2^(scale − 127), transposed as transformers does."""
    codes = blocks.astype(np.uint8)
    out = np.empty((*codes.shape[:-1], codes.shape[-1] * 2), dtype=np.float32)
    out[..., 0::2] = FP4_VALUES[codes & 0x0F]
    out[..., 1::2] = FP4_VALUES[codes >> 4]
    out = np.ldexp(out, (scales.astype(np.int32) - 127)[..., None]).astype(np.float32)
    out = out.reshape(*codes.shape[:-2], codes.shape[-2] * codes.shape[-1] * 2)
    return np.ascontiguousarray(np.swapaxes(out, -1, -2))
