"""Weight quantization: f32, f16, int8 and int8c (int8 + sparse fp16 compensation).

int8c stores W ~ S*Q + E: Q int8 with one scale per row (or per group of
`group_size` inputs), and E a sparse fp16 correction at the entries plain int8
serves worst. Those are the entries far above the rest of their group: taking
them out of the scale computation makes every other step of that group finer,
and E then carries their residual exactly enough.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QUANTS = ("f32", "f16", "int8", "int8c")
DEFAULT_QUANT = "int8c"  # what `colibri export` and `colibri build` use unless told
DEFAULT_OUTLIER_FRAC = 0.005
F16_MIN_NORMAL = float(np.finfo(np.float16).tiny)
F16_MAX = float(np.finfo(np.float16).max)
OUTLIER_BITS = 16 + 16  # u16 gap to the previous flat index + f16 value
MAX_GAP = 0xFFFF
# From this many weights on, error sums and outlier selection go by row chunks, keeping temporaries to a
# few bytes a weight (an embedding of 65M weights would otherwise need over 1.5 GB). Smaller tensors keep
# the whole-array computation, so their exports stay byte for byte what they were.
LEAN_MIN_WEIGHTS = 4_000_000
CHUNK_WEIGHTS = 1 << 20


@dataclass
class QuantTensor:
    """One quantized matrix, shape (rows, cols); vectors are stored as 1 x n."""

    dtype: str  # "f32" | "f16" | "int8" | "int8c"
    rows: int
    cols: int
    data: np.ndarray  # (rows, cols): float32, float16 or int8
    group_size: int = 0  # inputs per scale; == cols for per-row
    scales: np.ndarray | None = None  # (rows, n_groups) float16 or float32
    oidx: np.ndarray | None = None  # uint32 flat indices, strictly increasing
    oval: np.ndarray | None = None  # float16 corrections

    @property
    def n_groups(self) -> int:
        return -(-self.cols // self.group_size) if self.group_size else 0

    @property
    def n_outliers(self) -> int:
        return 0 if self.oidx is None else int(self.oidx.size)

    def dequantize(self) -> np.ndarray:
        """The float32 matrix the C kernels compute with."""
        if self.dtype in ("f32", "f16"):
            return self.data.astype(np.float32)
        assert self.scales is not None
        s = np.repeat(self.scales.astype(np.float32), self.group_size, axis=1)[:, : self.cols]
        w = s * self.data.astype(np.float32)
        if self.n_outliers:
            flat = w.reshape(-1)
            flat[self.oidx] += self.oval.astype(np.float32)
        return w

    def payload_bits(self) -> int:
        """Bits of weights, scales and corrections (row padding excluded)."""
        elem = {"f32": 32, "f16": 16, "int8": 8, "int8c": 8}[self.dtype]
        bits = elem * self.rows * self.cols
        if self.scales is not None:
            bits += self.scales.dtype.itemsize * 8 * self.scales.size
        return bits + OUTLIER_BITS * (encode_outliers(self.oidx, self.oval)[0].size if self.n_outliers else 0)

    def bits_per_weight(self) -> float:
        return self.payload_bits() / (self.rows * self.cols)


def encode_outliers(oidx: np.ndarray, oval: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted flat indices as u16 gaps (the first from 0), with zero-valued filler
    entries wherever two outliers lie more than 65535 entries apart."""
    idx = oidx.astype(np.int64)
    gaps = np.diff(idx, prepend=0)
    fillers = np.maximum((gaps - 1) // MAX_GAP, 0)
    if not fillers.any():
        return gaps.astype("<u2"), oval.astype("<f2")
    out_gaps, out_vals = [], []
    for gap, n_fill, val in zip(gaps.tolist(), fillers.tolist(), oval.tolist(), strict=True):
        out_gaps += [MAX_GAP] * n_fill + [gap - MAX_GAP * n_fill]
        out_vals += [0.0] * n_fill + [val]
    return np.array(out_gaps, dtype="<u2"), np.array(out_vals, dtype="<f2")


def _row_chunks(rows: int, cols: int) -> list[slice]:
    step = max(1, CHUNK_WEIGHTS // max(cols, 1))
    return [slice(r, min(r + step, rows)) for r in range(0, rows, step)]


def sum_squares(w: np.ndarray) -> float:
    """sum(W^2) in float64."""
    if w.size < LEAN_MIN_WEIGHTS:
        return float(np.sum(w.astype(np.float64) ** 2))
    w2 = w.reshape(-1, w.shape[-1])
    return sum(float(np.sum(np.square(w2[c].astype(np.float64)))) for c in _row_chunks(*w2.shape))


def relative_error(w: np.ndarray, w_hat: np.ndarray) -> float:
    """||W - W_hat|| / ||W||, accumulated in float64 (ufunc sums: no BLAS call per tensor)."""
    if w.size >= LEAN_MIN_WEIGHTS:
        w2, h2 = w.reshape(-1, w.shape[-1]), w_hat.reshape(-1, w.shape[-1])
        norm2 = sum_squares(w2)
        err2 = sum(float(np.sum(np.square(w2[c].astype(np.float64) - h2[c]))) for c in _row_chunks(*w2.shape))
        return float(np.sqrt(err2 / norm2)) if norm2 else 0.0
    w64 = w.astype(np.float64)
    norm2 = float(np.sum(np.square(w64)))
    return float(np.sqrt(np.sum(np.square(w64 - w_hat)) / norm2)) if norm2 else 0.0


def quantize(
    w: np.ndarray, quant: str, *, group_size: int = 0, outlier_frac: float = DEFAULT_OUTLIER_FRAC
) -> QuantTensor:
    """Quantize a float32 matrix (or vector, as one row). group_size 0 means per row."""
    w2 = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, w.shape[-1]) if w.ndim else w
    rows, cols = w2.shape
    if quant == "f32":
        return QuantTensor("f32", rows, cols, w2)
    if quant == "f16":
        return QuantTensor("f16", rows, cols, w2.astype(np.float16))
    if quant not in ("int8", "int8c"):
        raise ValueError(f"unknown quantization {quant!r} (expected one of {', '.join(QUANTS)})")
    g = cols if group_size <= 0 or group_size >= cols else group_size
    n_out = int(outlier_frac * rows * cols) if quant == "int8c" else 0
    select = _outlier_mask_lean if w2.size >= LEAN_MIN_WEIGHTS else _outlier_mask
    mask = select(w2, g, n_out) if n_out else None
    scales = _group_scales(w2, g, mask)
    s_full = np.repeat(scales.astype(np.float32), g, axis=1)[:, :cols]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s_full > 0, np.rint(w2 / s_full), 0.0)
    q = np.clip(q, -127, 127).astype(np.int8)
    qt = QuantTensor(quant, rows, cols, q, group_size=g, scales=scales)
    if mask is not None:
        idx = np.flatnonzero(mask.reshape(-1)).astype(np.uint32)
        residual = w2.reshape(-1)[idx] - s_full.reshape(-1)[idx] * q.reshape(-1)[idx].astype(np.float32)
        qt.oidx = idx
        qt.oval = np.clip(residual, -F16_MAX, F16_MAX).astype(np.float16)
    return qt


def _padded_groups(a: np.ndarray, g: int, fill: float) -> np.ndarray:
    """View (rows, cols) as (rows, n_groups, g), padding the last group with `fill`."""
    rows, cols = a.shape
    n_groups = -(-cols // g)
    if n_groups * g != cols:
        a = np.concatenate([a, np.full((rows, n_groups * g - cols), fill, dtype=a.dtype)], axis=1)
    return a.reshape(rows, n_groups, g)


def _outlier_mask(w: np.ndarray, g: int, n_out: int) -> np.ndarray:
    """The n_out entries standing furthest above their group's typical magnitude."""
    mag = np.abs(w)
    groups = _padded_groups(mag, g, np.nan)
    rms = np.sqrt(np.nanmean(groups.astype(np.float64) ** 2, axis=2, keepdims=True))
    rms = np.where(rms > 0, rms, 1.0)
    score = (groups / rms).reshape(w.shape[0], -1)[:, : w.shape[1]].reshape(-1)
    # introselect is deterministic for a given input, so exports stay byte-identical
    top = np.argpartition(-score, n_out - 1)[:n_out]
    mask = np.zeros(w.size, dtype=bool)
    mask[top] = True
    return mask.reshape(w.shape)


def _group_rms(mag: np.ndarray, g: int) -> np.ndarray:
    groups = _padded_groups(mag, g, np.nan)
    rms = np.sqrt(np.nanmean(groups.astype(np.float64) ** 2, axis=2, keepdims=True))
    return np.where(rms > 0, rms, 1.0)


def _outlier_mask_lean(w: np.ndarray, g: int, n_out: int) -> np.ndarray:
    """_outlier_mask by row chunks, in about 9 bytes a weight: the same scores, the n_out-th largest
    found by an in-place partition; of the entries tied with it, those first in memory order are taken."""
    rows, cols = w.shape
    chunks = _row_chunks(rows, cols)
    rms = np.concatenate([_group_rms(np.abs(w[c]), g) for c in chunks])

    def score(c: slice) -> np.ndarray:
        groups = _padded_groups(np.abs(w[c]), g, np.nan)
        return (groups / rms[c]).reshape(c.stop - c.start, -1)[:, :cols]

    neg = np.empty(w.size, dtype=np.float64)
    for c in chunks:
        np.negative(score(c), out=neg[c.start * cols: c.stop * cols].reshape(-1, cols))
    neg.partition(n_out - 1)
    threshold = -neg[n_out - 1]
    del neg
    mask = np.zeros(w.shape, dtype=bool)
    ties = []
    for c in chunks:
        sc = score(c)
        mask[c] = sc > threshold
        ties.append(np.flatnonzero(sc == threshold) + c.start * cols)
    n_ties = n_out - int(np.count_nonzero(mask))
    mask.reshape(-1)[np.concatenate(ties)[:n_ties]] = True
    return mask


def _group_scales(w: np.ndarray, g: int, mask: np.ndarray | None) -> np.ndarray:
    mag = np.abs(w)
    if mask is not None:
        mag = np.where(mask, 0.0, mag)
    amax = _padded_groups(mag, g, 0.0).max(axis=2)
    scales = (amax / 127.0).astype(np.float32)
    nonzero = scales[scales > 0]
    # fp16 scales are exact enough and half the size, unless they would be subnormal
    if nonzero.size == 0 or (nonzero.min() >= F16_MIN_NORMAL and nonzero.max() <= F16_MAX / 2):
        return scales.astype(np.float16)
    return scales
