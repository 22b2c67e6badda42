"""Quantization of a checkpoint's tensors, one at a time, serially or by a pool of threads.

Each worker reads its tensor itself from the checkpoint and returns the quantized tensor with its error
statistics; results come back in canonical order, with a bounded number of tensors in flight, so the
blob is written in the same order, byte for byte, as by a serial export, and memory stays bounded.

Threads, not processes: numpy releases the GIL for the whole-chunk operations that make up almost all
of a tensor's time, and threads share the source's mapping and the results without a copy, a pickle or
a fork's copy-on-write faults (on the 288M shape of bench/export.py, 2 threads took 10-20% less wall
time and CPU than 2 forked processes).
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .calibrate import Calibration
from .quantize import (
    INT4_QUANTS,
    K_OUTLIER_SCALE,
    MAX_OUTLIER_FRAC,
    PLAIN,
    QUANTS,
    V_QUANT,
    QuantTensor,
    error_from_squared,
    quantize_measured,
    quantize_report,
)
from .spec import canonical_shape

POOL_MIN_PARAMS = 16_000_000  # below this a pool's start-up costs more than it saves
INFLIGHT_PER_WORKER = 2
# More tensors go out while those in flight behind the oldest hold fewer weights than it and than this: a
# large tensor (an embedding) at the head keeps the other workers busy instead of idle behind it.
INFLIGHT_WEIGHTS = 48_000_000
EARLY_LAST_WEIGHTS = 4_000_000  # a last tensor of this many weights is submitted second (quantize_all)


@dataclass(frozen=True)
class Quantized:
    name: str
    qt: QuantTensor
    row: dict  # the manifest's entry for the tensor, without its place in the blob
    norm2: float  # sum of the squared source weights (float64), for the model's total error


# The matrices --attn-quant applies to: the token embedding and the attention projections. Every token
# goes through all of them (an expert only sees the tokens routed to it), so their error weighs most per
# weight; in an MoE they are a few percent of the weights (bench/quant_table.py measures what they cost).
ATTN_TENSORS = ("embed", "attn.q", "attn.k", "attn.v", "attn.o", "attn.q_a", "attn.q_b", "attn.kv_a")


# The projections whose output the KV cache holds (MLA's kv_a: the cached latent and rope key). Every later
# position reads what they wrote, so their error reaches every token after it; with grouped-query heads
# they are a small share of the weights. A 4-bit export keeps V_TENSORS at 8 bits (quantize.V_QUANT); K,
# whose error reaches the outputs through the softmax's scores only, stays 4-bit, with more corrections in
# int4c (quantize.K_OUTLIER_SCALE).
V_TENSORS = ("attn.v", "attn.kv_a")
K_TENSOR = "attn.k"


def _kind(name: str) -> str:
    return ".".join(name.split(".")[-2:])


def is_attn_tensor(name: str) -> bool:
    return name == "embed" or _kind(name) in ATTN_TENSORS


def attn_scope(attn_quant: str | None) -> tuple[str | None, int | None]:
    """--attn-quant QUANT[:LAYERS] as (QUANT, LAYERS): QUANT for the embedding and the attention matrices of
    the first LAYERS layers (None: of every layer). The value is one parse_attn_quant accepted."""
    if attn_quant is None:
        return None, None
    quant, sep, layers = attn_quant.partition(":")
    return quant, int(layers) if sep else None


def parse_attn_quant(arg: str) -> str:
    """--attn-quant's value, checked: a quantization, optionally `:LAYERS` (a positive number of layers).
    ValueError names what is wrong."""
    quant, sep, layers = arg.partition(":")
    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant[:40]!r} (use {', '.join(QUANTS)}, optionally :LAYERS)")
    if sep and not (layers.isascii() and layers.isdigit() and len(layers) <= 5 and int(layers) > 0):
        raise ValueError(f"{arg[:40]!r}: LAYERS after ':' must be a positive number of layers")
    return arg


def _in_attn_scope(name: str, layers: int | None) -> bool:
    if not is_attn_tensor(name):
        return False
    return layers is None or name == "embed" or int(name.split(".")[1]) < layers


def tensor_quant(name: str, quant: str, attn_quant: str | None = None) -> str:
    """The quantization a tensor gets: norms, biases, router and shared gate stay float32, and so does
    MLA's kv_b, which the runtime reads per head in both directions (absorbed into q and out of att);
    with `attn_quant`, the ATTN_TENSORS get that one (QUANT:LAYERS: the embedding and those of the first
    LAYERS layers, attn_scope); a 4-bit `quant` gives the V_TENSORS its 8-bit flavour (V_QUANT)."""
    if name.endswith(("norm", "_bias", "moe.router", "moe.shared_gate", "attn.kv_b", "attn.sinks")):
        return "f32"
    scoped, layers = attn_scope(attn_quant)
    if scoped is not None and _in_attn_scope(name, layers):
        return scoped
    if quant in V_QUANT and _kind(name) in V_TENSORS:
        return V_QUANT[quant]
    return quant


# int8c's own default for the ATTN_TENSORS, with the default per-row scales: every token passes through them
# (an expert sees a share of the tokens), so they get scales per ATTN_GROUP inputs. On bench/hf_checkpoints.py's
# checkpoints (seed 1, bench/quant_table.py) that takes int8c's mean KL from 1.19x/1.18x/0.90x llama.cpp
# Q8_0's to 1.13x/0.69x/0.72x (plain, heavy-tailed, outlier channels) for 0.03 bits a weight. Four times the
# corrections there as well gave 1.09x/0.66x/0.57x, but cost 12% of the 288M shape's decode (twice the
# corrections a token): not kept. With --attn-quant QUANT:LAYERS the attention it leaves to --quant takes
# per-row scales: on those checkpoints f16:1 is then at 8.488 bits a weight (8.506 with these scales kept).
ATTN_GROUP = 32


def tensor_scheme(name: str, quant: str, group_size: int, outlier_frac: float,
                  attn_quant: str | None = None) -> tuple[str, int, float | None]:
    """(quantization, group size, outlier fraction) of one tensor; None: that quantization's default."""
    tq = tensor_quant(name, quant, attn_quant)
    if tq != quant:  # another quantization than --quant: its own default corrections
        return tq, group_size, None
    if quant == "int8c" and group_size == 0 and is_attn_tensor(name) and attn_scope(attn_quant)[1] is None:
        return tq, ATTN_GROUP, outlier_frac
    if quant == "int4c" and _kind(name) == K_TENSOR:
        return tq, group_size, min(outlier_frac * K_OUTLIER_SCALE, MAX_OUTLIER_FRAC)
    return tq, group_size, outlier_frac


def matrix_quants(quant: str, attn_quant: str | None) -> set[str]:
    """The quantizations an export's matrices may get: --quant's, its V_QUANT, and --attn-quant's."""
    scoped = attn_scope(attn_quant)[0]
    return {quant} | ({V_QUANT[quant]} if quant in V_QUANT else set()) | ({scoped} if scoped else set())


def has_int16(quant: str, attn_quant: str | None) -> bool:
    """Whether an export's blob has int16 matrices (model.h COLIBRI_INT16: a runtime compiled for it links the
    int16 kernels only then)."""
    return "int16" in matrix_quants(quant, attn_quant)


def has_int4(quant: str, attn_quant: str | None) -> bool:
    """Whether an export's blob has int4/int4c matrices (model.h COLIBRI_INT4: a runtime compiled for it
    links the int4 kernels only then)."""
    return bool(matrix_quants(quant, attn_quant) & set(INT4_QUANTS))


def quantize_tensor(source: Any, name: str, quant: str, group_size: int, outlier_frac: float,
                    attn_quant: str | None = None, calib: Calibration | None = None) -> Quantized:
    """Read one tensor from `source` (anything with get(name); get_mapped(name) is used if it has one),
    quantize it and measure its error; with `calib`, weighing each input column by its statistics."""
    w = getattr(source, "get_mapped", source.get)(name)
    tq, group_size, frac = tensor_scheme(name, quant, group_size, outlier_frac, attn_quant)
    # the other flavour of the same bits, for comparison: a compensated one's plain one and the reverse
    other = PLAIN.get(tq) or next((c for c, p in PLAIN.items() if p == tq), None)
    imp = calib.importance(name) if calib is not None and tq in CALIBRATED else None
    m = quantize_report(w, tq, group_size=group_size, outlier_frac=frac, plain=tq in PLAIN, importance=imp)
    qt, norm2 = m.qt, m.norm2
    row = {
        "name": name, "quant": tq, "shape": list(w.shape),
        "bits_per_weight": round(qt.bits_per_weight(), 4),
        "rel_error": error_from_squared(m.sq_err, norm2), "n_outliers": qt.n_outliers,
    }
    if other is not None:
        alt_err = m.plain_sq_err if m.plain_sq_err is not None else \
            quantize_measured(w, other, group_size=group_size, outlier_frac=frac, importance=imp)[1]
        row[f"rel_error_{other}"] = error_from_squared(alt_err, norm2)
    if imp is not None:
        row["calibrated"] = True
    return Quantized(name, qt, row, norm2)


# The quantizations whose search a calibration set's E[x^2] weighs: int4's scales and int4c's corrections
# (on bench/quant_table.py's checkpoints and a copy with activation outlier channels, int4c's mean KL moved by
# -3% to +1%). int8c's corrections stay chosen by weight alone: weighing them moved its mean KL by -6% to +2%
# beside the scale migration, and by +15% without it on the activation-outlier copy.
CALIBRATED = ("int4", "int4c")


def pool_workers(n_params: int, requested: int = 0) -> int:
    """Worker threads for a model: `requested` if given, else none below POOL_MIN_PARAMS, else one a core."""
    if requested > 0:
        return requested
    return 1 if n_params < POOL_MIN_PARAMS else os.cpu_count() or 1


def quantize_all(source: Any, names: list[str], quant: str, group_size: int, outlier_frac: float,
                 workers: int = 1, attn_quant: str | None = None, calib: Calibration | None = None
                 ) -> Iterator[Quantized]:
    """Quantized tensors in the order of `names`; with workers > 1 computed by that many threads,
    at most INFLIGHT_PER_WORKER * workers tensors at a time."""
    if workers <= 1:
        for name in names:
            yield quantize_tensor(source, name, quant, group_size, outlier_frac, attn_quant, calib)
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="colibri-quantize")
    size = _weights_of(source)

    def submit(name: str) -> Future[Quantized]:
        return pool.submit(quantize_tensor, source, name, quant, group_size, outlier_frac, attn_quant, calib)

    try:
        todo = deque(names)
        pending: deque[tuple[int, Future[Quantized]]] = deque()
        # a large last tensor (an untied lm_head) goes out once the first tensor (the embedding, as large)
        # is done, not alone at the end with the other workers idle; its result waits for its turn (about
        # a byte a weight)
        last = todo.pop() if len(todo) > 2 and size(todo[-1]) >= EARLY_LAST_WEIGHTS else None
        early: Future[Quantized] | None = None

        def room() -> bool:
            if len(pending) < INFLIGHT_PER_WORKER * workers:
                return True
            behind = sum(n for n, _ in pending) - pending[0][0]
            return behind + size(todo[0]) <= min(pending[0][0], INFLIGHT_WEIGHTS)

        while todo or pending:
            while todo and room():
                name = todo.popleft()
                pending.append((size(name), submit(name)))
            yield pending.popleft()[1].result()
            if last is not None and early is None:
                early = submit(last)
        if early is not None:
            yield early.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _weights_of(source: Any) -> Callable[[str], int]:
    """Weights of a tensor of `source` by its model's spec; without a spec, every tensor counts 0."""
    spec = getattr(source, "spec", None) or getattr(getattr(source, "plan", None), "spec", None)
    if spec is None:
        return lambda name: 0

    def size(name: str) -> int:
        try:
            return math.prod(canonical_shape(spec, name))
        except (KeyError, ValueError):
            return 0

    return size
