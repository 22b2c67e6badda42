"""How close the numpy reference's integer activations came to a rounding tie.

The runtime rounds each activation to int8 as round-half-away(x * 127 / max|x|), and so does the
reference (reference.quantize_q8) in the same float32 steps; but x itself comes out of sums taken in
another order (an RMS norm, a matmul), so the two may differ in the last bit. Where x * 127 / max|x| lies
within a few ulps of k + 0.5, that bit decides between k and k + 1, and the two logits part by far more than
rounding (one activation a whole step off). A comparison of logits to a float bound holds only on a forward
pass that met no such value: TieWatch, given to the reference as its activation quantizer, records the
closest one.
"""

from __future__ import annotations

import numpy as np

from colibri.codegen.reference import quantize_q8

F32 = np.float32
# a relative distance to the tie below this may be crossed by the two sides' difference in x: an ulp of
# float32 is 6e-8-1.2e-7 relative, and x at a layer's input carries the differently ordered sums of every
# layer before it, a few ulps to ~1e-6 (the tests' logits agree to 1e-4 wherever no value came closer)
NEAR_TIE = 1e-6


class TieWatch:
    """reference.quantize_q8, recording the least relative distance |f - (k + 0.5)| / |f| met since reset()."""

    def __init__(self) -> None:
        self.closest = np.inf

    def reset(self) -> None:
        self.closest = np.inf

    @property
    def near_tie(self) -> bool:
        return self.closest < NEAR_TIE

    def __call__(self, x: np.ndarray, block: int = 32) -> np.ndarray:
        b = np.asarray(x, dtype=F32).reshape(-1)
        b = np.concatenate([b, np.zeros((-b.size) % block, dtype=F32)]).reshape(-1, block)
        amax = np.max(np.abs(b), axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(amax > 0, F32(127.0) / amax, F32(0.0)).astype(F32)
        f = np.abs(b * inv[:, None]).astype(np.float64)
        live = f > 0
        if live.any():
            d = np.abs(f[live] - np.floor(f[live]) - 0.5) / f[live]
            self.closest = min(self.closest, float(d.min()))
        return quantize_q8(x, block)
