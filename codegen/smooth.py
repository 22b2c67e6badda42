"""Scale migration (SmoothQuant) folded into the weights at export, chosen on a calibration set (--calib).

An RMSNorm's output x feeds a group of matrices (attn_norm: q, k, v or MLA's q_a, kv_a; ffn_norm: the
router, every expert's gate and up, the shared or dense MLP's; final_norm: an untied lm_head). Dividing the
norm's weight by s_j and multiplying column j of every consumer by s_j leaves the float model as it was,
and moves the range of input channel j from the activations, which the runtime rounds to int8 in blocks of
32 (one large channel coarsens its whole block), to the weights, where int8c's and int4c's corrections
can carry an enlarged column. s_j = max|x_j|^alpha / max|W_:,j|^(1 - alpha) (SmoothQuant), normalised to
a geometric mean of 1. Nothing changes in the blob's format or the runtime: the norms and matrices are
just other numbers.

Migration helps where activations have outlier channels and hurts where they do not (heavy-tailed weights
lose more to the enlarged columns than the activations gain), so each group's alpha is chosen from
SMOOTH_ALPHAS, "off" included, by the group's measured output error on the calibration inputs: its
integer-activation consumers quantized as the export will quantize them (the experts: the most routed
SMOOTH_EXPERTS of each layer), times the calibration tokens' inputs rounded as the runtime rounds them,
against the float product.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .calibrate import Calibration
from .quantize import QuantTensor
from .reference import quantize_q8
from .spec import ModelSpec, canonical_names

SMOOTH_ALPHAS = (0.0, 0.25, 0.5, 0.75)  # 0.0: off (s = 1); the others SmoothQuant's migration strength
SMOOTH_EXPERTS = 2  # experts of a layer whose error is measured for its choice: the most routed
SCALE_RANGE = 1e4  # s is kept within [1 / SCALE_RANGE, SCALE_RANGE]
_CONSUMERS = {"attn": ("q", "k", "v", "q_a", "kv_a"), "ffn": ("gate", "up", "router", "shared_gate")}


def norm_groups(spec: ModelSpec) -> dict[str, list[str]]:
    """Norm name -> the matrices its output feeds (an untied lm_head for final_norm)."""
    names = canonical_names(spec)
    out: dict[str, list[str]] = {}
    for layer in range(spec.n_layers):
        p = f"layers.{layer}."
        out[p + "attn_norm"] = [n for n in names if n.startswith(p + "attn.")
                                and n.split(".")[-1] in _CONSUMERS["attn"]]
        out[p + "ffn_norm"] = [n for n in names if n.startswith((p + "moe.", p + "mlp."))
                               and n.split(".")[-1] in _CONSUMERS["ffn"]]
    if not spec.tied:
        out["final_norm"] = ["lm_head"]
    return out


@dataclass(frozen=True)
class Smoothing:
    scales: dict[str, np.ndarray]  # norm name -> s (float32, one per channel), the groups migrated only
    alphas: dict[str, float]  # norm name -> the alpha chosen (0.0: off)
    consumers: dict[str, str]  # matrix name -> its norm, for the migrated groups

    def column_scale(self, name: str) -> np.ndarray | None:
        norm = self.consumers.get(name)
        return None if norm is None else self.scales[norm]

    def to_json(self) -> dict:
        return {"alphas": self.alphas, "migrated": sorted(self.scales)}


def migration_scales(xmax: np.ndarray, wmax: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's s for input channel maxima xmax and weight column maxima wmax, geometric mean 1."""
    x, w = xmax.astype(np.float64), wmax.astype(np.float64)
    ok = (x > 0) & (w > 0)
    s = np.ones_like(x)
    s[ok] = x[ok] ** alpha / w[ok] ** (1.0 - alpha)
    if ok.any():
        s[ok] /= np.exp(np.mean(np.log(s[ok])))
    return np.clip(s, 1.0 / SCALE_RANGE, SCALE_RANGE).astype(np.float32)


def _rounded(x: np.ndarray) -> np.ndarray:
    """The rows of x (tokens) as the runtime's integer matmuls see them, float64."""
    return np.stack([quantize_q8(t) for t in x]).astype(np.float64)


def _output_error(y: np.ndarray, qt: QuantTensor, x: np.ndarray, xq: np.ndarray | None) -> float:
    """||Y_q - Y||^2 / ||Y||^2 over the rows of x (float64): y the float product, Y_q as the runtime computes
    it, from xq (_rounded(x)) for integer activations (the corrections take x), from x when xq is None."""
    deq = qt.dequantize().astype(np.float64)
    if xq is None:
        yq = x @ deq.T
    else:
        yq = xq @ deq.T
        if qt.n_outliers:
            e = np.zeros(qt.rows * qt.cols)
            e[qt.oidx.astype(np.int64)] = qt.oval.astype(np.float64)
            yq += (x - xq) @ e.reshape(qt.rows, qt.cols).T
    norm = float(np.sum(y * y))
    return float(np.sum((yq - y) ** 2)) / norm if norm else 0.0


def plan_smoothing(spec: ModelSpec, source, calib: Calibration,
                   quantizer: Callable[[str, np.ndarray, np.ndarray | None], tuple[QuantTensor, bool]],
                   report: Callable[[str], None] = lambda line: None) -> Smoothing:
    """Each norm group's alpha (SMOOTH_ALPHAS) of least measured output error, and its scales.

    quantizer(name, w, importance) -> (the tensor as the export quantizes it, whether its matmul takes
    integer activations); groups with no such consumer, or no calibration inputs, stay off."""
    scales, alphas, consumers = {}, {}, {}
    for norm, group in norm_groups(spec).items():
        x = calib.inputs.get(norm)
        if x is None or not group:
            continue
        measured = set(_measured(group, calib))
        ws, wmax = {}, None  # the measured matrices, and every consumer's column maxima (read one at a time)
        for n in group:
            w = np.asarray(source.get(n), dtype=np.float32)
            m = np.max(np.abs(w), axis=0)
            wmax = m if wmax is None else np.maximum(wmax, m)
            if n in measured:
                ws[n] = w
        probe = {n: quantizer(n, ws[n], calib.importance(n)) for n in ws}
        probe = {n: v for n, v in probe.items() if v[0].dtype not in ("f32", "f16")}
        if not probe:
            continue
        xmax = calib.input_peak[norm]
        x64 = x.astype(np.float64)
        y = {n: x64 @ ws[n].astype(np.float64).T for n in probe}  # the float products, the same for every alpha
        xq = _rounded(x64)
        best, best_s = 0.0, None
        best_err = sum(_output_error(y[n], qt, x64, xq if ia else None) for n, (qt, ia) in probe.items())
        for alpha in SMOOTH_ALPHAS[1:]:
            s = migration_scales(xmax, wmax, alpha)
            xs = (x / s[None, :]).astype(np.float64)
            xsq = _rounded(xs)
            err = 0.0
            for n in probe:
                imp = calib.importance(n)
                qt, ia = quantizer(n, ws[n] * s[None, :], None if imp is None else imp / np.square(s, dtype=np.float64))
                err += _output_error(y[n], qt, xs, xsq if ia else None)
            if err < best_err:
                best, best_err, best_s = alpha, err, s
        alphas[norm] = best
        if best_s is not None:
            scales[norm] = best_s
            consumers.update(dict.fromkeys(group, norm))
    report(f"calibration: scale migration in {len(scales)} of {len(alphas)} norm groups "
           f"(alpha {', '.join(f'{a:g}' for a in SMOOTH_ALPHAS)}: "
           + ", ".join(str(sum(1 for v in alphas.values() if v == a)) for a in SMOOTH_ALPHAS) + ")")
    return Smoothing(scales, alphas, consumers)


def _measured(group: list[str], calib: Calibration) -> list[str]:
    """The group's matrices whose error decides its alpha: all but the experts, and of each layer's experts
    the SMOOTH_EXPERTS most routed (by calibration tokens)."""
    experts: dict[str, int] = {}
    out = []
    for n in group:
        parts = n.split(".")
        if len(parts) == 6 and parts[2:4] == ["moe", "experts"]:
            experts[".".join(parts[:5])] = calib.counts.get(n, 0)
        else:
            out.append(n)
    top = sorted(experts, key=lambda e: (-experts[e], e))[:SMOOTH_EXPERTS]
    return out + [n for n in group if ".".join(n.split(".")[:5]) in top and calib.counts.get(n, 0) > 0]


class SmoothedWeights:
    """A weight source with a Smoothing folded in: norms divided by s, their consumers' columns times s."""

    def __init__(self, source, smoothing: Smoothing) -> None:
        self.source = source
        self.smoothing = smoothing
        self.source_dtypes = getattr(source, "source_dtypes", {})
        self.spec = getattr(source, "spec", None)
        self.plan = getattr(source, "plan", None)

    def get(self, name: str) -> np.ndarray:
        w = self.source.get(name)
        s = self.smoothing.scales.get(name)
        if s is not None:
            return (np.asarray(w, dtype=np.float32) / s).astype(np.float32)
        s = self.smoothing.column_scale(name)
        if s is not None:
            return (np.asarray(w, dtype=np.float32) * s[None, :]).astype(np.float32)
        return w


def smoothed_calibration(calib: Calibration, smoothing: Smoothing) -> Calibration:
    """calib as the smoothed model's inputs see it: E[(x / s)^2] for the migrated groups' matrices."""
    ms = dict(calib.mean_square)
    for name, norm in smoothing.consumers.items():
        if name in ms:
            ms[name] = ms[name] / np.square(smoothing.scales[norm], dtype=np.float64)
    return replace(calib, mean_square=ms)
