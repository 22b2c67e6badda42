"""The sampler as colibri_sample.h's prose specifies it, in Python: the independent reference of the
sampling tests. Integer PRNG in Python ints mod 2^64; float arithmetic in numpy float32, one rounded
operation at a time, in the order the prose gives (cbmath.h's cb_expf transcribed the same way)."""

from __future__ import annotations

import numpy as np

M64 = (1 << 64) - 1
F = np.float32
FLT_MAX = F(np.finfo(np.float32).max)


def splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class Rng:
    def __init__(self, seed: int):
        self.s = splitmix64(seed) or 1

    def next(self) -> int:
        x = self.s
        x ^= x >> 12
        x = (x ^ (x << 25)) & M64
        x ^= x >> 27
        self.s = x
        return (x * 0x2545F4914F6CDD1D) & M64

    def uniform(self) -> np.float32:
        return F(self.next() >> 40) * F(2.0 ** -24)


def _pow2(n: int) -> np.float32:
    return F(2.0 ** n)


def expf(x: np.float32) -> np.float32:
    """cb_expf (Cephes expf) in float32 steps."""
    x = F(x)
    hi, lo = F(88.72283935546875), F(-103.972084045410156)
    if np.isnan(x):
        return x
    if x < lo:
        return F(0.0)
    if x > hi:
        return F(np.inf)
    fk = x * F(1.44269504088896341)
    k = int(fk - F(0.5)) if fk < 0 else int(fk + F(0.5))
    r = (x - F(k) * F(0.693359375)) - F(k) * F(-2.12194440e-4)
    p = F(1.9875691500e-4) * r + F(1.3981999507e-3)
    p = p * r + F(8.3334519073e-3)
    p = p * r + F(4.1665795894e-2)
    p = p * r + F(1.6666665459e-1)
    p = p * r + F(5.0000001201e-1)
    y = p * (r * r) + r + F(1.0)
    k1 = int(k / 2)  # C division truncates toward zero
    return y * _pow2(k1) * _pow2(k - k1)


def rank_order(w: np.ndarray) -> list[int]:
    """Ids by w descending, equal w by id ascending."""
    return sorted(range(len(w)), key=lambda i: (-float(w[i]), i))


def sample(logits, rng: Rng, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
           recent=()) -> int:
    logits = np.asarray(logits, dtype=np.float32)
    w = logits.copy()
    R = F(repeat_penalty)
    if R != F(1.0):
        with np.errstate(over="ignore"):
            for i in recent:
                x = logits[i]
                y = x / R if x > 0 else x * R
                w[i] = min(y, FLT_MAX)
    if F(temperature) == 0:
        return int(np.argmax(w))
    order = rank_order(w)
    n = len(order) if top_k == 0 or top_k >= len(order) else top_k
    order = order[:n]
    T = F(temperature)
    w0 = w[order[0]]
    with np.errstate(over="ignore"):
        e = [expf((w[i] - w0) / T) for i in order]
    s = F(0.0)
    for v in e:
        s = s + v
    p = [v / s for v in e]
    if F(top_p) < 1:
        c, keep = F(0.0), n
        for r in range(n):
            c = c + p[r]
            if c >= F(top_p):
                keep = r + 1
                break
        n = keep
    if F(min_p) > 0:
        floor = F(min_p) * p[0]
        keep = 1
        while keep < n and p[keep] >= floor:
            keep += 1
        n = keep
    total = F(0.0)
    for r in range(n):
        total = total + p[r]
    t = rng.uniform() * total
    c = F(0.0)
    for r in range(n):
        c = c + p[r]
        if t < c:
            return order[r]
    return order[n - 1]
