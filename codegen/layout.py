"""How int8 and int4 weights are arranged for the target's kernels, and the activation scratch they need.

The blob format (runtime_c/FORMAT.md "Integer matmuls", codegen/format.py): an int8/int8c matrix whose columns and scale
groups are multiples of ACT_BLOCK is multiplied with int8 activations, quantized per token in blocks
of ACT_BLOCK with one f32 scale each, and exact int32 dot products; such a matrix is "q8". The kernels
of a target want its bytes in one of two orders, recorded in the blob header:

- "rows": row-major, as every other tensor (best for reductions into a scalar: Cortex-M MVE's
  VMLADAVA, the Cortex-M DSP's SMLAD, plain C);
- "tiled16": tiles of TILE_ROWS rows; within a tile, for every group of four columns, the four bytes
  of row 0, then of row 1, ..., row 15 (64 bytes). A vector of int32 lanes then holds one row per lane
  and a 4-byte dot product per lane (x86 VPDPBUSD/PMADDUBSW, Arm SDOT, RVV widening multiply-add)
  accumulates sixteen rows at once with one broadcast of the activations. Rows are padded to a multiple
  of TILE_ROWS with zero weights and zero scales; the scales are tiled the same way: for tile t and
  group g, the scales of its sixteen rows in row order.
"""

from __future__ import annotations

import numpy as np

from .format import INT4_DTYPES, LAYOUTS, TILE_COLS, TILE_ROWS, int4_row_bytes
from .format import Q8_BLOCK as ACT_BLOCK
from .spec import ModelSpec

__all__ = ["ACT_BLOCK", "INT4_DTYPES", "LAYOUTS", "TILE_COLS", "TILE_ROWS", "int4_row_bytes"]
DEFAULT_LAYOUT = "tiled16"


def effective_group(cols: int, group_size: int) -> int:
    """The group size a tensor is stored with (quantize(): 0 or >= cols means one group per row)."""
    return cols if group_size <= 0 or group_size >= cols else group_size


def is_q8(dtype: str, cols: int, group_size: int) -> bool:
    """Whether the kernels multiply this tensor with int8 activations (group_size as stored): int8/int8c
    of whole blocks, and int4/int4c always (their only kernels; a last partial block is zero-padded)."""
    if dtype in INT4_DTYPES:
        return True
    return dtype in ("int8", "int8c") and cols % ACT_BLOCK == 0 and group_size % ACT_BLOCK == 0


def pack_int4(q: np.ndarray) -> np.ndarray:
    """(rows, cols) values in [-8, 7] -> (rows, int4_row_bytes) bytes, FORMAT.md "int4": per block of
    ACT_BLOCK, byte i holds q[i] + 8 in its low nibble and q[i + 16] + 8 in its high one; the columns past
    cols hold 0 (nibble 8). int4 matrices are row-major whatever the header's layout."""
    rows, cols = q.shape
    blocks = -(-cols // ACT_BLOCK)
    u = np.full((rows, blocks * ACT_BLOCK), 8, dtype=np.uint8)
    u[:, :cols] = (q.astype(np.int16) + 8).astype(np.uint8)
    u = u.reshape(rows, blocks, 2, ACT_BLOCK // 2)
    return np.ascontiguousarray((u[:, :, 0] | (u[:, :, 1] << 4)).reshape(rows, -1))


def unpack_int4(b: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """The inverse of pack_int4: (rows, int4_row_bytes(cols)) bytes -> (rows, cols) int8 in [-8, 7]."""
    b = b.reshape(rows, -1, ACT_BLOCK // 2)
    u = np.concatenate([b & 15, b >> 4], axis=2).reshape(rows, -1)[:, :cols]
    return (u.astype(np.int16) - 8).astype(np.int8)


def matmul_cols(spec: ModelSpec) -> list[int]:
    """Input widths of every weight matrix of the model."""
    return [c for c in (spec.hidden, spec.n_heads * spec.head_dim, spec.o_dim, spec.q_lora_rank, spec.ffn,
                        spec.shared_ffn, spec.dense_ffn) if c]


def uses_q8(spec: ModelSpec, quant: str, group_size: int) -> bool:
    return any(is_q8(quant, c, effective_group(c, group_size)) for c in matmul_cols(spec))


def xq_row_bytes(spec: ModelSpec) -> int:
    """Bytes of one token's quantized activations: int8 values, f32 block scales, i32 block sums,
    each part 64-byte aligned, sized for the widest matrix input (the runtime's cb_xq_row_bytes)."""
    k = -(-max(matmul_cols(spec)) // ACT_BLOCK) * ACT_BLOCK
    blocks = k // ACT_BLOCK

    def a64(n: int) -> int:
        return -(-n // 64) * 64

    return a64(k) + 2 * a64(4 * blocks)


def padded_rows(rows: int) -> int:
    return -(-rows // TILE_ROWS) * TILE_ROWS


def tile(q: np.ndarray) -> np.ndarray:
    """(rows, cols) int8 -> the tiled16 byte order, rows padded with zeros; cols % TILE_COLS == 0."""
    rows, cols = q.shape
    if rows % TILE_ROWS:
        p = np.zeros((padded_rows(rows), cols), dtype=q.dtype)
        p[:rows] = q
    else:
        p = np.ascontiguousarray(q)
    # each run of TILE_COLS bytes moves as one element (a 4-byte void), not byte by byte
    runs = p.reshape(-1, TILE_ROWS, cols // TILE_COLS, TILE_COLS).view(np.dtype((np.void, TILE_COLS * q.itemsize)))
    return np.ascontiguousarray(runs.transpose(0, 2, 1, 3)).view(q.dtype)


def tile_scales(s: np.ndarray) -> np.ndarray:
    """(rows, n_groups) scales -> per tile, per group, the tile's sixteen rows; padded rows scale 0."""
    rows, groups = s.shape
    p = np.zeros((padded_rows(rows), groups), dtype=s.dtype)
    p[:rows] = s
    return np.ascontiguousarray(p.reshape(-1, TILE_ROWS, groups).transpose(0, 2, 1))


def untile(t: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """The inverse of tile() (for readers of the blob)."""
    q = t.reshape(-1, cols // TILE_COLS, TILE_ROWS, TILE_COLS).transpose(0, 2, 1, 3).reshape(-1, cols)
    return q[:rows]


def untile_scales(t: np.ndarray, rows: int, groups: int) -> np.ndarray:
    return t.reshape(-1, groups, TILE_ROWS).transpose(0, 2, 1).reshape(-1, groups)[:rows]
