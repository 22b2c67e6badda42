"""Weight quantization: f32, f16, int8, int8c (int8 + sparse fp16 compensation), int4 and int4c.

int8c stores W ~ S*Q + E: Q int8 with one scale per row (or per group of
`group_size` inputs), and E a sparse fp16 correction at the entries plain int8
serves worst. Those are the entries far above the rest of their group: taking
them out of the scale computation makes every other step of that group finer,
and E then carries their residual exactly enough.

int4 stores 4-bit values q in [-8, 7] in groups of INT4_GROUP inputs with one f16 scale per group
(4.5 bits a weight), symmetric: w ~ s*q. Each group's scale is searched (after llama.cpp's
make_qx_quants): INT4_CANDIDATES trial scales around max|w|/8 of either sign, each rounded, refined by
least squares (s = sum(w q) / sum(q q)), the one of least squared error kept. int4c adds int8c's sparse
fp16 corrections, INT4C_OUTLIER_FRAC of the weights by default. In both, the V projection (and MLA's
cached latent) is 8-bit (V_QUANT), and int4c gives the K projection K_OUTLIER_SCALE times the corrections,
which keeps int4c under llama.cpp's Q4_0 bits counted over all weights (4.59 against 4.64 on
bench/hf_checkpoints.py's model, K and V 1.9% of it; about 4.54 at Mixtral 8x7B's widths). A per-group
minimum (asymmetric 4-bit) was measured and not kept: it costs 16 more bits a group (0.5 a weight), and on
zero-centred weights the same bits spent on corrections lower the error more (see tests/test_int4.py
test_symmetric_beats_offset_at_equal_bits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .format import INT16_MAX, Q8_BLOCK

QUANTS = ("f32", "f16", "int8", "int8c", "int4", "int4c", "int16")  # the choices of --quant and QUANT=
DEFAULT_QUANT = "int8c"  # what `colibri export` and `colibri build` use unless told
DEFAULT_OUTLIER_FRAC = 0.005
MAX_OUTLIER_FRAC = 0.1  # the largest --outlier-frac taken
INT4_QUANTS = ("int4", "int4c")
INT4_GROUP = 32  # inputs per int4 scale: the activation block (layout.ACT_BLOCK)
INT4C_OUTLIER_FRAC = 0.001  # 4.5 + 0.001 * 32 = 4.532 bits a weight in the int4c matrices
# A 4-bit export's V projection (stream.V_TENSORS) takes the 8-bit flavour of its kind, and int4c's K
# projection K_OUTLIER_SCALE times its corrections (llama.cpp's Q4_0 keeps both at Q8_0 in an 8-expert
# model). On the transformers checkpoints of bench/hf_checkpoints.py (bench/quant_table.py's scoring), against
# K and V both 8-bit: K and V both 4-bit raise int4c's mean KL by 19-27%, K 4-bit with V 8-bit by 3-8% (seed
# 1), and K 4-bit with ten times the corrections by -1% to +4% (seeds 1 and 0), for 0.032 fewer bits a weight.
V_QUANT = {"int4": "int8", "int4c": "int8c"}
K_OUTLIER_SCALE = 10
INT4_CANDIDATES = np.concatenate([-8.0 - 0.25 * np.arange(-4, 5), 7.0 + 0.25 * np.arange(-4, 5)])
F16_MIN_NORMAL = float(np.finfo(np.float16).tiny)
F16_MAX = float(np.finfo(np.float16).max)
OUTLIER_BITS = 16 + 16  # u16 gap to the previous flat index + f16 value
MAX_GAP = 0xFFFF
# From this many weights on, error sums and outlier selection go by row chunks, keeping temporaries to a
# few bytes a weight (an embedding of 65M weights would otherwise need over 1.5 GB). Smaller tensors keep
# the whole-array computation, so their exports stay byte for byte what they were.
LEAN_MIN_WEIGHTS = 4_000_000
CHUNK_WEIGHTS = 1 << 20
ERROR_CHUNK_WEIGHTS = 1 << 18  # error sums go by chunks of 1 MB of float32 (smaller ones cost more in calls)
INT4_CHUNK_WEIGHTS = 1 << 16  # the int4 scale search goes by chunks whose float64 temporaries stay in the cache
SAMPLE_STEP = 16  # outlier selection: every 16th score estimates a bound below the threshold
SAMPLE_MIN_ROWS = 256  # from this many rows on, the sample is every 16th row
# --calib: an input column's error weighs (E[x^2] / its mean over the columns)^CALIB_ALPHA + CALIB_FLOOR
CALIB_ALPHA = 1.0
CALIB_FLOOR = 0.05
# int16 (FORMAT.md "int16"): 14-bit values in int16, one f32 scale per row, multiplied with activations quantized
# to the same range per block of Q8_BLOCK (reference.quantize_q16). 14 bits so that a block's integer dot fits
# int32 on every ISA: 32 * 8191^2 = 2,146,959,392 < 2^31. Meant for the few matrices where int8c's rounding of
# weights and activations costs most (--attn-quant int16:1: the embedding and the first layer's attention).
# The range is format.INT16_MAX.


@dataclass
class QuantTensor:
    """One quantized matrix, shape (rows, cols); vectors are stored as 1 x n."""

    dtype: str  # "f32" | "f16" | "int8" | "int8c" | "int4" | "int4c" | "int16" (quantize_int16)
    rows: int
    cols: int
    data: np.ndarray  # (rows, cols): float32, float16, int8 (int4: values in [-8, 7], packed by the blob) or int16
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

    def dequantize_rows(self, rows: slice) -> np.ndarray:
        """dequantize()[rows], computed for those rows only (the same float32 values)."""
        if self.dtype in ("f32", "f16"):
            return self.data[rows].astype(np.float32)
        assert self.scales is not None
        start, stop = rows.start, rows.stop
        g, n_groups = self.group_size, self.n_groups
        s = self.scales[rows].astype(np.float32)
        q = self.data[rows]
        if n_groups * g == self.cols:
            w = (s[:, :, None] * q.reshape(stop - start, n_groups, g).astype(np.float32)).reshape(-1, self.cols)
        else:
            w = np.repeat(s, g, axis=1)[:, : self.cols] * q.astype(np.float32)
        if self.n_outliers:
            lo, hi = np.searchsorted(self.oidx, [start * self.cols, stop * self.cols])
            if hi > lo:
                flat = w.reshape(-1)
                flat[self.oidx[lo:hi].astype(np.int64) - start * self.cols] += self.oval[lo:hi].astype(np.float32)
        return w

    def squared_error(self, w: np.ndarray) -> float:
        """sum((W - dequantize())^2) in float64, by row chunks (no whole-matrix temporaries)."""
        w2 = w.reshape(self.rows, self.cols)
        if self.dtype == "f32":
            return 0.0 if np.array_equal(w2, self.data) else _chunked_sq_diff(w2, self)
        return _chunked_sq_diff(w2, self)

    def payload_bits(self) -> int:
        """Bits of weights, scales and corrections (row padding excluded)."""
        elem = {"f32": 32, "f16": 16, "int8": 8, "int8c": 8, "int4": 4, "int4c": 4, "int16": 16}[self.dtype]
        bits = elem * self.rows * self.cols
        if self.scales is not None:
            bits += self.scales.dtype.itemsize * 8 * self.scales.size
        return bits + OUTLIER_BITS * (encode_outliers(self.oidx, self.oval)[0].size if self.n_outliers else 0)

    def bits_per_weight(self) -> float:
        return self.payload_bits() / (self.rows * self.cols)


def quantize_int16(w: np.ndarray) -> QuantTensor:
    """w (rows, cols, or a vector as 1 x n) as int16: per row, scale = max|w| / INT16_MAX in float32 and
    q = round-half-even(w / scale) in [-INT16_MAX, INT16_MAX]; an all-zero row has scale 0 and q 0."""
    w2 = np.asarray(w, dtype=np.float32).reshape(-1, w.shape[-1] if w.ndim else 1)
    amax = np.max(np.abs(w2), axis=1, keepdims=True)
    scale = (amax / np.float32(INT16_MAX)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale > 0, np.rint(w2 / np.where(scale > 0, scale, np.float32(1))), 0)
    q = np.clip(q, -INT16_MAX, INT16_MAX).astype(np.int16)
    rows, cols = w2.shape
    return QuantTensor("int16", rows, cols, q, group_size=cols, scales=scale)


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


def _row_chunks(rows: int, cols: int, weights: int = CHUNK_WEIGHTS) -> list[slice]:
    step = max(1, weights // max(cols, 1))
    return [slice(r, min(r + step, rows)) for r in range(0, rows, step)]


def _chunked_sq_diff(w2: np.ndarray, qt: QuantTensor) -> float:
    total = 0.0
    for c in _row_chunks(*w2.shape, ERROR_CHUNK_WEIGHTS):
        d = np.subtract(w2[c], qt.dequantize_rows(c), dtype=np.float64)
        total += float(np.sum(np.square(d, out=d)))
    return total


def sum_squares(w: np.ndarray) -> float:
    """sum(W^2) in float64, by row chunks whose float64 copy stays in the cache."""
    w2 = w.reshape(-1, w.shape[-1]) if w.ndim > 1 else w.reshape(1, -1)
    total = 0.0
    for c in _row_chunks(*w2.shape, ERROR_CHUNK_WEIGHTS):
        sq = w2[c].astype(np.float64)
        total += float(np.sum(np.square(sq, out=sq)))
    return total


def error_from_squared(sq_err: float, norm2: float) -> float:
    """relative_error(w, w_hat) from ||W - W_hat||^2 (quantize_measured's) and norm2 = sum_squares(w)."""
    return float(np.sqrt(sq_err / norm2)) if norm2 else 0.0


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


def default_outlier_frac(quant: str) -> float:
    """The fraction of fp16 corrections a quantization gets unless told otherwise."""
    return INT4C_OUTLIER_FRAC if quant == "int4c" else DEFAULT_OUTLIER_FRAC


def quantize(
    w: np.ndarray, quant: str, *, group_size: int = 0, outlier_frac: float | None = None,
    importance: np.ndarray | None = None,
) -> QuantTensor:
    """Quantize a float32 matrix (or vector, as one row). group_size 0 means per row (int4: always
    INT4_GROUP); outlier_frac None: default_outlier_frac(quant); importance: see column_weights."""
    return _quantize(w, quant, group_size, outlier_frac, measure=False, importance=importance)[0]


def quantize_measured(
    w: np.ndarray, quant: str, *, group_size: int = 0, outlier_frac: float | None = None,
    importance: np.ndarray | None = None,
) -> tuple[QuantTensor, float]:
    """quantize() and qt.squared_error(w), the error (int8, int8c) summed in the pass that quantizes:
    the same float64 differences in the same chunks as squared_error, so the same sum."""
    qt, sq, _ = _quantize(w, quant, group_size, outlier_frac, measure=True, importance=importance)
    if sq is None:
        sq = qt.squared_error(w)
    return qt, sq


PLAIN = {"int8c": "int8", "int4c": "int4"}  # the plain flavour of a compensated quantization


@dataclass(frozen=True)
class Measured:
    """A quantized tensor with its float64 sums over the source W: the squared error, sum(W^2), and the
    squared error its plain flavour (PLAIN) would have (None unless asked for)."""

    qt: QuantTensor
    sq_err: float
    norm2: float
    plain_sq_err: float | None = None


def quantize_report(w: np.ndarray, quant: str, *, group_size: int = 0, outlier_frac: float | None = None,
                    plain: bool = False, importance: np.ndarray | None = None) -> Measured:
    """quantize_measured(), sum_squares(w) and, with `plain` (quant int8c or int4c), quantize_measured(w,
    PLAIN[quant])'s error. For int8c all three are summed in the chunk loop that quantizes, while each chunk
    is in the cache (the same float64 sums, chunk by chunk, as the separate calls); int4's values are
    int4c's except in the groups holding a correction (_int4_plain)."""
    fused = plain and quant == "int8c"
    qt, sq, extra = _quantize(w, quant, group_size, outlier_frac, measure=True, extra=fused, importance=importance)
    if sq is None:
        sq = qt.squared_error(w)
    if extra is not None:
        return Measured(qt, sq, *extra)
    alt = None
    if plain and quant == "int4c":
        w2 = np.ascontiguousarray(w, dtype=np.float32).reshape(qt.rows, qt.cols)
        alt = _int4_plain(w2, qt, column_weights(importance, qt.cols)).squared_error(w)
    elif plain:
        alt = quantize_measured(w, PLAIN[quant], group_size=group_size, outlier_frac=outlier_frac,
                                importance=importance)[1]
    return Measured(qt, sq, sum_squares(w), alt)


def _quantize(w: np.ndarray, quant: str, group_size: int, outlier_frac: float | None, measure: bool,
              extra: bool = False, importance: np.ndarray | None = None
              ) -> tuple[QuantTensor, float | None, tuple[float, float] | None]:
    """The tensor, its squared error if measured in the loop (else None), and with `extra` (int8/int8c)
    (sum(W^2), plain int8's squared error) if summed in the loop (else None)."""
    if outlier_frac is None:
        outlier_frac = default_outlier_frac(quant)
    w2 = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, w.shape[-1]) if w.ndim else w
    rows, cols = w2.shape
    if quant == "f32":
        return QuantTensor("f32", rows, cols, w2), None, None
    if quant == "f16":
        return QuantTensor("f16", rows, cols, w2.astype(np.float16)), None, None
    if quant == "int16":
        if cols % Q8_BLOCK:
            raise ValueError(f"int16 takes widths that are multiples of {Q8_BLOCK}, not {cols}")
        return quantize_int16(w2), None, None
    colw = column_weights(importance, cols)
    if quant in INT4_QUANTS:
        return _quantize_int4(w2, quant, outlier_frac, colw), None, None
    if quant not in ("int8", "int8c"):
        raise ValueError(f"unknown quantization {quant!r} (expected one of {', '.join(QUANTS)})")
    g = cols if group_size <= 0 or group_size >= cols else group_size
    n_out = int(outlier_frac * rows * cols) if quant == "int8c" else 0
    idx = mag = plain = None
    norm2 = float("nan")
    if n_out:
        mag = np.abs(w2)
        if extra:  # plain int8's scales, from |w| before the corrections' entries are left out of it
            plain = _stored_scales(_padded_groups(mag, g, 0.0).max(axis=2))
        if colw is None:
            idx, norm2 = _outlier_index(mag, g, n_out, lean=w2.size >= LEAN_MIN_WEIGHTS)
        else:  # the entries of most weighted error: |w| * sqrt(E[x^2]) against its group's
            idx = _outlier_index(_salience(mag, colw), g, n_out, lean=w2.size >= LEAN_MIN_WEIGHTS)[0]
    scales = _group_scales(w2, g, idx, mag)
    idx = idx.astype(np.uint32) if idx is not None else None
    del mag
    if extra and plain is None:
        plain = scales
    q, oval, sq, sums = _int8_values(w2, scales, g, idx, measure, plain, norm2)
    qt = QuantTensor(quant, rows, cols, q, group_size=g, scales=scales)
    if idx is not None:
        qt.oidx = idx
        qt.oval = oval
    return qt, sq, sums


def _residuals(w2: np.ndarray, s32: np.ndarray, g: int, q: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """W - S*Q at the flat indices idx, clipped to f16 (the corrections E)."""
    r, c = np.divmod(idx.astype(np.int64), w2.shape[1])
    residual = w2[r, c] - s32[r, c // g] * q[r, c].astype(np.float32)
    return np.clip(residual, -F16_MAX, F16_MAX).astype(np.float16)


def _int8_values(w2: np.ndarray, scales: np.ndarray, g: int, idx: np.ndarray | None, measure: bool,
                 plain: np.ndarray | None = None, norm2: float = float("nan")
                 ) -> tuple[np.ndarray, np.ndarray | None, float | None, tuple[float, float] | None]:
    """rint(W / S) clipped to [-127, 127] (0 where S is 0), by row chunks; f32 division as a whole matrix.
    With idx (sorted flat indices) also the corrections W - S*Q there (_residuals); with `measure` also
    sum((W - S*Q - E)^2) in float64, chunk by chunk as _chunked_sq_diff sums it (None if not measured);
    with `plain` (plain int8's scales) also (sum(W^2), plain int8's squared error), summed in the same loop
    (None where the groups do not divide the rows); sum(W^2) is `norm2` where that is known (not NaN)."""
    rows, cols = w2.shape
    s32 = scales.astype(np.float32)
    n_groups = s32.shape[1]
    if n_groups * g != cols:
        s_full = np.repeat(s32, g, axis=1)[:, :cols]
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(s_full > 0, np.rint(w2 / s_full), 0.0)
        q = np.clip(q, -127, 127).astype(np.int8)
        return q, None if idx is None else _residuals(w2, s32, g, q, idx), None, None
    p32 = None if plain is None else plain.astype(np.float32)
    q = np.empty((rows, cols), dtype=np.int8)
    ovals: list[np.ndarray] = []
    chunks = _row_chunks(rows, cols, ERROR_CHUNK_WEIGHTS)
    firsts = None if idx is None else _chunk_firsts(idx, chunks, cols)
    sum_w2 = math.isnan(norm2)
    total = plain_total = 0.0
    if sum_w2:
        norm2 = 0.0
    for k, c in enumerate(chunks):
        s = s32[c][:, :, None]
        wc3 = w2[c].reshape(-1, n_groups, g)
        t = _int8_rounded(wc3, s)
        q[c] = t.reshape(-1, cols)
        if idx is None and not measure:
            continue
        deq = np.multiply(s, t, out=t).reshape(-1)  # S*Q as dequantize_rows computes it (t holds Q exactly)
        wc = wc3.reshape(-1)
        if idx is not None:
            local = idx[firsts[k]:firsts[k + 1]].astype(np.int64) - c.start * cols
            ov = np.clip(wc[local] - deq[local], -F16_MAX, F16_MAX).astype(np.float16)
            ovals.append(ov)
            deq[local] += ov.astype(np.float32)
        if measure:
            total += _sq_diff_sum(wc, deq)
        if p32 is not None:  # sum_squares' and plain int8's sums over this chunk, while it is in the cache
            if sum_w2:
                norm2 += float(np.sum(np.square(wc, dtype=np.float64)))
            sp = p32[c][:, :, None]
            tp = _int8_rounded(wc3, sp)
            plain_total += _sq_diff_sum(wc, np.multiply(sp, tp, out=tp).reshape(-1))
    oval = None if idx is None else (np.concatenate(ovals) if ovals else np.zeros(0, dtype=np.float16))
    return q, oval, total if measure else None, None if p32 is None else (norm2, plain_total)


def _chunk_firsts(idx: np.ndarray, chunks: list[slice], cols: int) -> np.ndarray:
    """Where each row chunk's entries start in the sorted flat indices idx, and where the last one ends: one
    search, in idx's own dtype (a search with int64 keys would cast the whole of idx per call)."""
    return np.searchsorted(idx, np.array([c.start * cols for c in chunks] + [chunks[-1].stop * cols], dtype=idx.dtype))


def _int8_rounded(w3: np.ndarray, s: np.ndarray) -> np.ndarray:
    """rint(W / S) clipped to [-127, 127], 0 where S is 0, as a new float32 array (W by groups, S (.., .., 1))."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.divide(w3, s)
    np.rint(t, out=t)
    if not (s > 0).all():
        t = np.where(s > 0, t, 0.0)
    return np.clip(t, -127, 127, out=t)


def _sq_diff_sum(w: np.ndarray, deq: np.ndarray) -> float:
    """sum((W - D)^2) in float64, D (overwritten) the dequantized weights. W - D in float32 is exact
    (Sterbenz: the two lie within a factor of 2 of each other, or D is 0; not where a correction was
    clipped to float16's range, where the error is off by a float32 rounding), so its float64 square is
    the float64 difference's."""
    return float(np.sum(np.square(np.subtract(w, deq, out=deq), dtype=np.float64)))


def _padded_groups(a: np.ndarray, g: int, fill: float) -> np.ndarray:
    """View (rows, cols) as (rows, n_groups, g), padding the last group with `fill`."""
    rows, cols = a.shape
    n_groups = -(-cols // g)
    if n_groups * g != cols:
        a = np.concatenate([a, np.full((rows, n_groups * g - cols), fill, dtype=a.dtype)], axis=1)
    return a.reshape(rows, n_groups, g)


def _outlier_index(mag: np.ndarray, g: int, n_out: int, lean: bool) -> tuple[np.ndarray, float]:
    """The flat indices, ascending, of the n_out entries standing furthest above their group's typical
    magnitude: of the scores |w| / rms(group) (float64), the n_out largest. Every SAMPLE_STEP-th score
    gives a bound below the n_out-th; only the entries whose |w| passes a float32 threshold just under the
    bound get their score computed. Of the entries tied with the n_out-th score, `lean` takes those first
    in memory order; otherwise, if a tie straddles the cut, an argpartition of every score decides
    (deterministic for a given input, so exports stay byte-identical). Also sum(W^2) in float64, from the
    groups' sums (NaN if the groups do not divide the rows).

    The sample that sets the bound is every SAMPLE_STEP-th row where there are enough rows (contiguous
    reads; every SAMPLE_STEP-th entry otherwise): the indices do not depend on it, only how many scores
    get computed (all of them if the bound comes out above the n_out-th score)."""
    rows, cols = mag.shape
    n = mag.size
    chunks = _row_chunks(rows, cols)
    # by smaller chunks, whose float64 squares stay in the cache (the same sums: each group's own)
    parts = [_group_rms(mag[c], g) for c in _row_chunks(rows, cols, ERROR_CHUNK_WEIGHTS)]
    rms = np.concatenate([r for r, _ in parts]).reshape(rows, -1)
    norm2 = sum(t for _, t in parts)

    def scores_at(flat: np.ndarray) -> np.ndarray:  # the same float64 quotients as the whole score array
        return mag.reshape(-1)[flat] / rms.reshape(-1)[flat // cols * rms.shape[1] + flat % cols // g]

    def every_score() -> np.ndarray:  # in memory order, by row chunks
        return np.concatenate([(_padded_groups(mag[c], g, np.nan) / rms[c][:, :, None])
                               .reshape(c.stop - c.start, -1)[:, :cols].reshape(-1) for c in chunks])

    cand = idx = None
    if lean or n >= 64 * SAMPLE_STEP:
        if rows >= SAMPLE_MIN_ROWS and cols % g == 0:
            sample = (mag[::SAMPLE_STEP].reshape(-1, rms.shape[1], g) / rms[::SAMPLE_STEP][:, :, None]).reshape(-1)
        else:
            at = np.arange(0, n, SAMPLE_STEP)
            sample = mag.reshape(-1)[::SAMPLE_STEP] / rms.reshape(-1)[at // cols * rms.shape[1] + at % cols // g]
        j = min(sample.size, 2 * (n_out // SAMPLE_STEP) + 64)
        bound = np.partition(sample, sample.size - j)[sample.size - j]
        vals, where = [], []
        for c in chunks:
            # |w| >= thr whenever |w| / rms >= bound: thr a little under bound * rms, rounded down to float32
            thr = (bound * (1 - 1e-9)) * rms[c]
            thr32 = thr.astype(np.float32)
            thr32 = np.where(thr32 > thr, np.nextafter(thr32, np.float32(0)), thr32)
            m = mag[c]
            if cols % g == 0:
                hit = np.flatnonzero(m.reshape(m.shape[0], -1, g) >= thr32[:, :, None])
            else:
                hit = np.flatnonzero(m >= np.repeat(thr32, g, axis=1)[:, :cols])
            hit += c.start * cols
            sc = scores_at(hit)
            keep = sc >= bound
            vals.append(sc[keep])
            where.append(hit[keep])
        cand, idx = np.concatenate(vals), np.concatenate(where)
    if cand is None or cand.size < n_out:  # small, or the bound was too high: every score
        cand = every_score()
        idx = None
    threshold = np.partition(cand, cand.size - n_out)[cand.size - n_out]
    above = cand > threshold
    tied = np.flatnonzero(cand == threshold)
    n_ties = n_out - int(np.count_nonzero(above))
    if idx is None:  # cand is every score, in memory order
        if lean or n_ties == tied.size:
            return np.sort(np.concatenate([np.flatnonzero(above), tied[:n_ties]])), norm2
        return np.sort(np.argpartition(-cand, n_out - 1)[:n_out]), norm2
    if lean or n_ties == tied.size:  # lean: of the tied, those first in memory order (idx is in that order)
        return np.sort(np.concatenate([idx[above], idx[tied[:n_ties]]])), norm2
    return np.sort(np.argpartition(-every_score(), n_out - 1)[:n_out]), norm2  # a tie straddles the cut


def _group_rms(mag: np.ndarray, g: int) -> tuple[np.ndarray, float]:
    """Each group's rms (1 where 0), and sum(W^2) in float64 (NaN if the groups do not divide the rows)."""
    rows, cols = mag.shape
    if cols % g:
        groups = _padded_groups(mag, g, np.nan)
        rms = np.sqrt(np.nanmean(groups.astype(np.float64) ** 2, axis=2, keepdims=True))
        total = float("nan")
    else:  # nanmean's own sum and division when there is no padding
        sq = np.square(mag.reshape(rows, cols // g, g), dtype=np.float64)  # exact: a float32's square fits
        sums = np.sum(sq, axis=2, keepdims=True)
        total = float(np.sum(sums))
        rms = np.sqrt(sums / g)
    return np.where(rms > 0, rms, 1.0), total


def _group_scales(w: np.ndarray, g: int, idx: np.ndarray | None, mag: np.ndarray | None = None) -> np.ndarray:
    """Per group max |w| / 127 (the entries at the flat indices `idx` left out), f16 unless out of its
    normal range. `mag`, |w| if given, is overwritten."""
    rows, cols = w.shape
    if idx is None and cols % g == 0 and mag is None:  # max |w| as max(max w, -min w), without |w|; + 0.0
        groups = w.reshape(rows, cols // g, g)  # makes -0.0 0.0
        return _stored_scales(np.maximum(groups.max(axis=2), -groups.min(axis=2)) + np.float32(0.0))
    mag = np.abs(w) if mag is None else mag
    if idx is not None:
        mag.reshape(-1)[idx] = 0.0
    return _stored_scales(_padded_groups(mag, g, 0.0).max(axis=2))


def _stored_scales(amax: np.ndarray) -> np.ndarray:
    """The int8 scales amax / 127 as stored."""
    scales = (amax / 127.0).astype(np.float32)
    nonzero = scales[scales > 0]
    # fp16 scales are exact enough and half the size, unless they would be subnormal
    if nonzero.size == 0 or (nonzero.min() >= F16_MIN_NORMAL and nonzero.max() <= F16_MAX / 2):
        return scales.astype(np.float16)
    return scales


def column_weights(importance: np.ndarray | None, cols: int) -> np.ndarray | None:
    """The weight of each input column's error, from a calibration set's mean x^2 of that input
    (None: uncalibrated, every column 1): (E[x^2] / mean E[x^2])^CALIB_ALPHA + CALIB_FLOOR, float64, so a
    column the calibration set never lit still counts a little."""
    if importance is None:
        return None
    imp = np.asarray(importance, dtype=np.float64).reshape(-1)
    if imp.size != cols or not np.all(np.isfinite(imp)) or np.any(imp < 0):
        raise ValueError(f"importance: expected {cols} finite non-negative values, got {imp.size}")
    mean = float(np.mean(imp))
    return (imp / mean if mean > 0 else np.zeros_like(imp)) ** CALIB_ALPHA + CALIB_FLOOR


def _salience(mag: np.ndarray, colw: np.ndarray) -> np.ndarray:
    """|w| * sqrt(column weight): what outlier selection ranks in a calibrated export."""
    return mag * np.sqrt(colw).astype(np.float32)[None, :]


def _quantize_int4(w2: np.ndarray, quant: str, outlier_frac: float, colw: np.ndarray | None = None) -> QuantTensor:
    rows, cols = w2.shape
    g = INT4_GROUP
    n_out = int(outlier_frac * rows * cols) if quant == "int4c" else 0
    idx = None
    if n_out:
        mag = np.abs(w2) if colw is None else _salience(np.abs(w2), colw)
        idx = _outlier_index(mag, g, n_out, lean=w2.size >= LEAN_MIN_WEIGHTS)[0]
        del mag
    scales = np.empty((rows, -(-cols // g)), dtype=np.float32)
    q = np.empty((rows, cols), dtype=np.int8)
    chunks = _row_chunks(rows, cols, INT4_CHUNK_WEIGHTS)
    firsts = None if idx is None else _chunk_firsts(idx, chunks, cols)
    for k, c in enumerate(chunks):  # groups are independent: any chunking gives the same
        wc = w2[c]
        if idx is not None:  # the corrected entries are left out of the scale search (as 0)
            wc = wc.copy()
            wc.reshape(-1)[idx[firsts[k]:firsts[k + 1]] - c.start * cols] = 0.0
        scales[c], q[c] = _int4_groups(wc, cols, colw)
    scales16 = _int4_stored(scales)
    qt = QuantTensor(quant, rows, cols, q, group_size=g, scales=scales16)
    if idx is not None:  # the corrected entries get their own nearest value too, the residual goes to E
        r, col = np.divmod(idx, cols)
        w_at, s_at = w2[r, col], scales[r, col // g]
        with np.errstate(divide="ignore", invalid="ignore"):
            qm = np.where(s_at != 0, np.rint(w_at / s_at), 0.0)
        q[r, col] = np.clip(qm, -8, 7)
        residual = w_at - scales16[r, col // g].astype(np.float32) * q[r, col].astype(np.float32)
        qt.oidx = idx.astype(np.uint32)
        qt.oval = np.clip(residual, -F16_MAX, F16_MAX).astype(np.float16)
    return qt


def _int4_stored(scales: np.ndarray) -> np.ndarray:
    """The int4 scales (float32) as the blob holds them: float16 if every one is a normal float16."""
    nonzero = np.abs(scales[scales != 0])  # a scale may be negative: q = -8 then serves the positive peak
    if nonzero.size == 0 or (nonzero.min() >= F16_MIN_NORMAL and nonzero.max() <= F16_MAX / 2):
        return scales.astype(np.float16)
    return scales


def _int4_plain(w2: np.ndarray, qt: QuantTensor, colw: np.ndarray | None = None) -> QuantTensor:
    """quantize(w2, "int4") from qt = quantize(w2, "int4c") (both with the column weights colw): a group
    without a correction is searched on the same weights in both, so only the groups holding one (a few
    percent) are searched again."""
    rows, cols = w2.shape
    g = INT4_GROUP
    assert qt.scales is not None
    scales, q = qt.scales.astype(np.float32), qt.data.copy()  # float16 -> float32 is exact
    if qt.n_outliers:
        n_groups = scales.shape[1]
        flat = qt.oidx.astype(np.int64)
        r, gc = np.divmod(np.unique(flat // cols * n_groups + flat % cols // g), n_groups)
        at = gc[:, None] * g + np.arange(g)  # the groups' columns; the last group's may pass the row's end
        inside = at < cols
        wg = np.zeros(at.shape, dtype=np.float32)  # zero-padded, as _padded_groups pads a row
        wg[inside] = w2[np.broadcast_to(r[:, None], at.shape)[inside], at[inside]]
        s_g, q_g = _int4_groups(wg, g, None if colw is None else _padded_columns(colw, g)[gc])
        scales[r, gc] = s_g[:, 0]
        q[np.broadcast_to(r[:, None], at.shape)[inside], at[inside]] = q_g[inside]
    return QuantTensor("int4", rows, cols, q, group_size=g, scales=_int4_stored(scales))


def _padded_columns(colw: np.ndarray, g: int) -> np.ndarray:
    """Column weights (cols,) as (n_groups, g), the last group padded with 0."""
    n_groups = -(-colw.size // g)
    return np.concatenate([colw, np.zeros(n_groups * g - colw.size)]).reshape(n_groups, g)


def _int4_groups(w: np.ndarray, cols: int, colw: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per group of INT4_GROUP: the scale (as stored: f16-rounded unless out of its range) and the
    values in [-8, 7] of least squared error over INT4_CANDIDATES (see the module docstring); with column
    weights colw ((cols,), or (rows, INT4_GROUP): each row's group's own) the least weighted squared error.

    The groups are laid out transposed, (INT4_GROUP, groups): every operation then runs along the groups,
    contiguous, instead of 32 entries at a time, and a group's sums are _group_sum's, numpy's own order."""
    groups = _padded_groups(w, INT4_GROUP, 0.0).astype(np.float32)  # (rows, n_groups, 32)
    rows, n_groups = groups.shape[:2]
    gt = np.ascontiguousarray(groups.reshape(-1, INT4_GROUP).T)  # (32, groups)
    n = gt.shape[1]
    if colw is not None:
        per = colw if colw.ndim == 2 else _padded_columns(colw, INT4_GROUP)  # (groups of a row, 32)
        wt = np.ascontiguousarray(np.tile(per.T, (1, n // per.shape[0])))  # (32, groups), gt's layout
        return _int4_weighted(gt, wt, rows, n_groups, cols)
    peak = gt[np.argmax(np.abs(gt), axis=0), np.arange(n)]  # the signed largest entry (the first of ties)
    best_err = np.full(n, np.inf, dtype=np.float64)
    best_s = np.zeros(n, dtype=np.float32)
    best_t = np.zeros(n, dtype=np.float64)  # the candidate that gave best_s: the values are recomputed from it
    # the float64 arithmetic of mixed float32/float64 operands, on operands widened once, in place
    g64 = gt.astype(np.float64)
    q, tmp = np.empty(gt.shape), np.empty(gt.shape)
    def values(t: np.ndarray | np.float64) -> np.ndarray:  # into q: rint(g * t / peak) in [-8, 7]
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(peak != 0, t / peak, 0.0)
        np.multiply(g64, inv, out=q)
        np.rint(q, out=q)
        return np.clip(q, -8, 7, out=q)

    for t in INT4_CANDIDATES:
        values(t)
        qq = np.sum(np.multiply(q, q, out=tmp), axis=0)  # small integers: exact in any order
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.where(qq > 0, _group_sum(np.multiply(g64, q, out=tmp)) / qq, 0.0).astype(np.float32)
        s = _as_stored(s)
        np.multiply(s, q, out=tmp)
        np.subtract(g64, tmp, out=tmp)
        err = _group_sum(np.square(tmp, out=tmp))
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_s = np.where(better, s, best_s)
        best_t = np.where(better, t, best_t)
    best_q = values(best_t).astype(np.int8)
    return best_s.reshape(rows, n_groups), best_q.T.reshape(rows, -1)[:, :cols]


def _int4_weighted(gt: np.ndarray, wt: np.ndarray, rows: int, n_groups: int, cols: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """_int4_groups with column weights wt (gt's layout): each candidate's scale by weighted least squares,
    s = sum(c w q) / sum(c q q), the candidate of least sum(c (w - s q)^2) kept."""
    n = gt.shape[1]
    peak = gt[np.argmax(np.abs(gt), axis=0), np.arange(n)]
    g64 = gt.astype(np.float64)
    best_err = np.full(n, np.inf)
    best_s = np.zeros(n, dtype=np.float32)
    best_q = np.zeros(gt.shape)
    for t in INT4_CANDIDATES:
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(peak != 0, t / peak, 0.0)
        q = np.clip(np.rint(g64 * inv), -8, 7)
        cq = wt * q
        qq = np.sum(cq * q, axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            s = _as_stored(np.where(qq > 0, np.sum(cq * g64, axis=0) / qq, 0.0).astype(np.float32))
        err = np.sum(wt * np.square(g64 - s * q), axis=0)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_s = np.where(better, s, best_s)
        best_q[:, better] = q[:, better]
    return best_s.reshape(rows, n_groups), best_q.astype(np.int8).T.reshape(rows, -1)[:, :cols]


def _group_sum(x: np.ndarray) -> np.ndarray:
    """Column sums of x (n, groups), float64, in numpy's own order for a row of n (np.sum(axis=-1) of the
    untransposed groups: its pairwise sum, 8 accumulators then a tree, for 8 <= n <= 128, n a multiple of 8),
    so that the scales and values are what a sum along each group gives, bit for bit."""
    n = x.shape[0]
    assert n % 8 == 0 and 8 <= n <= 128, n
    r = x[0:8] + x[8:16] if n > 8 else x[0:8].copy()
    for i in range(16, n, 8):
        r += x[i:i + 8]
    r = r[0::2] + r[1::2]  # (r0 + r1), (r2 + r3), (r4 + r5), (r6 + r7)
    r = r[0::2] + r[1::2]
    return 0.0 + (r[0] + r[1])  # from the identity, as numpy's reduction: -0.0 sums to 0.0


def _as_stored(s: np.ndarray) -> np.ndarray:
    """s as the blob will hold it: f16 where representable as a normal f16, else f32."""
    s16 = s.astype(np.float16).astype(np.float32)
    ok = (np.abs(s) >= F16_MIN_NORMAL) & (np.abs(s) <= F16_MAX / 2)
    return np.where(ok | (s == 0), s16, s).astype(np.float32)
