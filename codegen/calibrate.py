"""Activation statistics of a calibration set, for `--calib`: which inputs of each matrix matter.

The reference (float32, the source weights) runs every calibration sequence (layer by layer: calibrate) and sums,
for every matrix it multiplies, the square of each input entry over the tokens that reached it (an expert
only sees the tokens routed to it). The mean, E[x_j^2] per input column j, weighs that column's error:
a weight error dw_ij adds dw_ij * x_j to output i, so the expected squared error of a row is
sum_j dw_ij^2 E[x_j^2] (quantize.column_weights). int4 and int4c (stream.CALIBRATED) then search their
scales by the weighted squared error and rank int4c's corrections by |w_ij| sqrt(E[x_j^2]).

It also keeps each norm's output (the first CALIB_KEEP tokens, and every channel's peak), from which
codegen/smooth.py chooses the scale migration folded into the weights.

A matrix no calibration token reached (an expert never routed to; the embedding, which is looked up,
not multiplied, unless it is tied to the output) gets no statistics and is quantized as without --calib.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .reference import Reference, WeightSource, rms_norm
from .spec import ModelSpec

CALIB_CACHE_BYTES = 2 << 30  # source weights the calibration run keeps as float32 at a time
CALIB_KEEP = 256  # tokens whose norm outputs are kept, for measuring a quantization's output error
# hidden states of the tokens that go through the layers together (calibrate; their experts' outputs take top_k
# times as much)
CALIB_HIDDEN_BYTES = 32 << 20


@dataclass(frozen=True)
class Calibration:
    file: str
    sequences: int
    tokens: int
    mean_square: dict[str, np.ndarray]  # matrix name -> E[x^2] of each input column (float64)
    counts: dict[str, int]  # matrix name -> tokens that reached it
    inputs: dict[str, np.ndarray]  # norm name -> its output at the first CALIB_KEEP tokens (float32, (T, h))
    input_peak: dict[str, np.ndarray]  # norm name -> max |x| of each channel of its output, every token

    def importance(self, name: str) -> np.ndarray | None:
        return self.mean_square.get(name)

    def to_json(self) -> dict:
        return {"file": self.file, "sequences": self.sequences, "tokens": self.tokens,
                "matrices": len(self.mean_square)}


class _Recorder(Reference):
    """The reference, summing x^2 of every matrix's input as it multiplies."""

    def __init__(self, *args, **kwargs) -> None:
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, int] = {}
        self.inputs: dict[str, list[np.ndarray]] = {}
        self.input_peak: dict[str, np.ndarray] = {}
        super().__init__(*args, **kwargs)

    def _norm_output(self, norm: str, x: np.ndarray) -> None:
        kept = self.inputs.setdefault(norm, [])
        if len(kept) < CALIB_KEEP:
            kept.append(x.copy())
        p = self.input_peak.get(norm)
        self.input_peak[norm] = np.abs(x) if p is None else np.maximum(p, np.abs(x))

    def _attention(self, layer: int, x: np.ndarray) -> np.ndarray:
        self._norm_output(f"layers.{layer}.attn_norm", x)
        return super()._attention(layer, x)

    def _moe(self, layer: int, x: np.ndarray) -> np.ndarray:
        self._norm_output(f"layers.{layer}.ffn_norm", x)
        return super()._moe(layer, x)

    def _mm(self, name: str, x: np.ndarray) -> np.ndarray:
        if name == "lm_head":
            self._norm_output("final_norm", x)
        s = self.sums.get(name)
        if s is None:
            s = self.sums[name] = np.zeros(x.size, dtype=np.float64)
        s += np.square(x, dtype=np.float64)
        self.counts[name] = self.counts.get(name, 0) + 1
        return super()._mm(name, x)


def _layer(ref: _Recorder, layer: int, hidden: list[list[np.ndarray]]) -> None:
    """One layer over a chunk's sequences, in place: attention token by token (each sequence's positions in
    order, attending to its own earlier ones); then a dense MLP token by token, or an MoE routed token by
    token, each chosen expert run over its tokens (one expert's weights at a time) and the outputs combined
    per token in its routing order. Each matrix gets its tokens in the token-by-token run's order."""
    s, p = ref.spec, f"layers.{layer}."
    flat = []
    for h in hidden:
        for pos in range(len(h)):
            ref.pos = pos
            h[pos] = h[pos] + ref._attention(layer, rms_norm(h[pos], ref.w[p + "attn_norm"], s.rms_eps))
            flat.append((h, pos))
    if s.is_dense(layer):
        for h, pos in flat:
            h[pos] = h[pos] + ref._moe(layer, rms_norm(h[pos], ref.w[p + "ffn_norm"], s.rms_eps))
        return
    xs = [rms_norm(h[pos], ref.w[p + "ffn_norm"], s.rms_eps) for h, pos in flat]
    for x in xs:
        ref._norm_output(p + "ffn_norm", x)  # as _Recorder._moe records it
    ref.routing = []
    routes = [ref.moe_route(layer, x) for x in xs]
    outs: list[dict[int, np.ndarray]] = [{} for _ in xs]
    for e in sorted({int(e) for experts, _ in routes for e in experts}):
        for i, (experts, _) in enumerate(routes):
            if e in experts:
                outs[i][e] = ref.moe_expert(layer, e, xs[i])
    for (h, pos), x, out, (experts, weights) in zip(flat, xs, outs, routes, strict=True):
        h[pos] = h[pos] + ref.moe_combine(layer, x, [out[int(e)] for e in experts], weights)


def calibrate(spec: ModelSpec, weights: WeightSource, seqs: list[list[int]], max_seq: int,
              file: str | Path) -> Calibration:
    """Run `seqs` (each cut to max_seq tokens) through the float32 reference; E[x^2] of every input.

    Layer by layer (_layer): the tokens of as many whole sequences as CALIB_HIDDEN_BYTES of hidden states
    hold go through layer 0, then all of them through layer 1, and so on, expert by expert in an MoE layer,
    so each matrix is read once per such chunk rather than once per token (a model larger than
    CALIB_CACHE_BYTES would otherwise be read from its files for every token). Every matrix still sees the
    tokens in the order a token-by-token run feeds them, so the statistics are that run's, bit for bit."""
    ref = _Recorder(spec, weights, max_seq=max_seq, cache_bytes=CALIB_CACHE_BYTES)
    seqs = [[int(t) for t in seq[:max_seq]] for seq in seqs]
    per_token = 4 * spec.hidden
    tokens = start = 0
    while start < len(seqs):
        end, held = start, 0
        while end < len(seqs) and (end == start or held + len(seqs[end]) * per_token <= CALIB_HIDDEN_BYTES):
            held += len(seqs[end]) * per_token
            end += 1
        hidden = [[ref.embed(t) for t in seq] for seq in seqs[start:end]]
        for layer in range(spec.n_layers):
            _layer(ref, layer, hidden)
        for h in hidden:
            for x in h:
                ref.logits(x)
                tokens += 1
        start = end
    mean_square = {name: s / ref.counts[name] for name, s in ref.sums.items()}
    inputs = {norm: np.stack(xs) for norm, xs in ref.inputs.items()}
    return Calibration(str(file), len(seqs), tokens, mean_square, dict(ref.counts), inputs, dict(ref.input_peak))
