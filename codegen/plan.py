"""Static arena plan: where every runtime buffer lives, decided at export time.

The buffers and their lifetimes mirror runtime_c/FORMAT.md ("Arena"); the C
runtime re-checks every plan against its own copy of this table, so a plan
that would alias live data is refused rather than trusted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import format as fmt
from .layout import xq_row_bytes
from .spec import ModelSpec

CTX_BYTES = fmt.CTX_BYTES  # the runtime's context sits at arena offset 0
ALIGN = fmt.ALIGN
F32 = 4
# Tokens one prefill block holds: a prompt runs through the layers this many tokens at a time, each
# expert's weights read once per block. Recorded in the blob header (FORMAT.md); the runtime
# accepts 1..its CB_MAX_BLOCK: MAX_PREFILL_BLOCK, or less where the target declares less (max_prefill_block).
PREFILL_BLOCK = 128
MAX_PREFILL_BLOCK = fmt.MAX_PREFILL_BLOCK
UNBLOCKED = ("key_cache", "value_cache", "scores")  # buffers that do not grow with the block

# (name, first step, last step) in FORMAT.md order (codegen/format.py BUFFERS); steps are those of one
# layer, taken by all the tokens of a block before the next step
BUFFER_LIFETIMES: tuple[tuple[str, int, int], ...] = tuple((b.name, b.first, b.last) for b in fmt.BUFFERS)
N_BASE_BUFFERS = fmt.N_BASE_BUFFERS
# the int8 activations of the integer matmuls (codegen/layout.py), live through every step; its offset
# has its own header field, so it comes after the table's buffers
XQ_BUFFER = (fmt.XQ_BUFFER.name, fmt.XQ_BUFFER.first, fmt.XQ_BUFFER.last)
# Classes of data (format.CLASSES), each one range of the arena in format.ARENA_ORDER, so that each may
# live in a memory of its own (colibri_init_regions); the class of each buffer, xq's included.
CLASSES = fmt.CLASSES
BUFFER_CLASS = {b.name: b.cls for b in (*fmt.BUFFERS, fmt.XQ_BUFFER)}


def align_up(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


@dataclass(frozen=True)
class Buffer:
    name: str
    nbytes: int
    first: int
    last: int
    offset: int

    def live_with(self, other: Buffer) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class ArenaPlan:
    buffers: tuple[Buffer, ...]
    arena_bytes: int
    naive_bytes: int  # context + every buffer side by side, no reuse
    kv_cache_bytes: int
    prefill_block: int = 1  # tokens the per-token buffers hold
    kv: str = "f32"  # the KV cache precision (format.KV_DTYPES)
    # class -> (first arena offset, bytes): each class's range, its bytes rounded up to ALIGN (what a
    # region of colibri_init_regions must hold); the activations' range starts at 0, with the context
    classes: tuple[tuple[str, int, int], ...] = ()

    def class_bytes(self, cls: str) -> int:
        return next(n for c, _, n in self.classes if c == cls)

    def to_json(self) -> dict:
        return {
            "arena_bytes": self.arena_bytes,
            "naive_bytes": self.naive_bytes,
            "kv_cache_bytes": self.kv_cache_bytes,
            "kv_cache_dtype": self.kv,
            "context_bytes": CTX_BYTES,
            "prefill_block": self.prefill_block,
            "classes": {c: {"offset": off, "bytes": n} for c, off, n in self.classes},
            "buffers": [
                {"name": b.name, "offset": b.offset, "bytes": b.nbytes, "live_steps": [b.first, b.last],
                 "class": BUFFER_CLASS[b.name]}
                for b in self.buffers
            ],
        }


def prefill_block(spec: ModelSpec, max_seq: int, cap: int = PREFILL_BLOCK, kv: str = "f32") -> int:
    """The default block: as many tokens (up to cap and max_seq) as keep the per-token buffers
    within the KV cache's size, so blocking at most about doubles the arena of a small model (RAM
    is what a microcontroller runs out of) while large models get the full block."""
    per_token = sum(v for k, v in buffer_bytes(spec, max_seq, 1, kv).items() if k not in UNBLOCKED)
    one = buffer_bytes(spec, max_seq, 1, kv)
    kv_bytes = one["key_cache"] + one["value_cache"]
    return max(1, min(cap, max_seq, kv_bytes // per_token))


def buffer_bytes(spec: ModelSpec, max_seq: int, block: int = 1, kv: str = "f32") -> dict[str, int]:
    """Bytes of each table buffer (before alignment): the caches in the KV precision, the rest f32."""
    out = {k: v * F32 for k, v in buffer_elements(spec, max_seq, block, kv).items()}
    if not spec.mla:  # (MLA: an f32 latent cache)
        out["key_cache"] = out["value_cache"] = (
            kv_positions(spec, max_seq, block) * fmt.kv_row_bytes(kv, spec.n_kv_heads, spec.head_dim))
    return out


def kv_positions(spec: ModelSpec, max_seq: int, block: int = 1) -> int:
    """Rows of the key (or value) cache over all layers: max_seq each, a sliding-window layer's ring less."""
    windows = spec.sliding_window or (0,) * spec.n_layers
    return sum(fmt.kv_layer_rows(w, max_seq, block) for w in windows)


def mla_row_widths(spec: ModelSpec) -> tuple[int, int]:
    """f32 elements of one token's q row and att row in an MLA model (FORMAT.md "Arena"): q holds the
    queries, then each head's query in latent space; att first the q latent or kv_a's output (step 1),
    then each head's attention output and its attention-weighted latent (steps 3, 4)."""
    h, r = spec.n_heads, spec.kv_lora_rank
    q = h * spec.qk_head_dim + h * r
    att = max(h * (spec.v_head_dim + r), spec.q_lora_rank, r + spec.head_dim)
    return q, att


def buffer_elements(spec: ModelSpec, max_seq: int, block: int = 1, kv: str = "f32") -> dict[str, int]:
    """f32 elements of each buffer; all but the caches and the scores hold one row per token of a block (the
    scores one per attention lane: format.attn_lanes).
    The caches' entries count f32 elements of an f32 cache (buffer_bytes() has their bytes in any
    precision); with a 16- or 8-bit cache q also holds the block's new k and v rows in f32."""
    kv_elems = kv_positions(spec, max_seq, block) * spec.n_kv_heads * spec.head_dim
    qdim = spec.n_heads * spec.head_dim
    staged = 0 if kv == "f32" else 2 * spec.n_kv_heads * spec.head_dim
    q_row, att_row = mla_row_widths(spec) if spec.mla else (qdim + staged, qdim)
    return {  # MLA: the key cache holds the latents, the value cache the rope keys
        "key_cache": spec.n_layers * max_seq * spec.kv_lora_rank if spec.mla else kv_elems,
        "value_cache": spec.n_layers * max_seq * spec.head_dim if spec.mla else kv_elems,
        "x": block * spec.hidden,
        "xb": block * spec.hidden,
        "q": block * q_row,
        "att": block * att_row,
        "scores": fmt.attn_lanes(block) * (max_seq + (1 if spec.attn_sinks else 0)),  # a sink: one more
        "router": block * spec.n_experts,
        "gate": block * spec.ffn,
        "up": block * spec.ffn,
        "moe": block * spec.hidden,
        "xgate": block * max(spec.shared_ffn, spec.dense_ffn),
        "xup": block * max(spec.shared_ffn, spec.dense_ffn),
    }


def mla_cache_bytes(spec: ModelSpec, max_seq: int) -> tuple[int, int]:
    """An MLA model's f32 KV cache at max_seq: (the compressed cache, the latent and the rope key of
    kv_lora_rank + head_dim per position per layer; the plain one, every head's key of qk_head_dim and value
    of v_head_dim)."""
    positions = spec.n_layers * max_seq * F32
    return positions * spec.latent_kv_row(), positions * spec.n_heads * (spec.qk_head_dim + spec.v_head_dim)


def buffer_lifetimes(spec: ModelSpec) -> tuple[tuple[str, int, int], ...]:
    """The buffers a model needs: the base ones, plus xgate and xup for a shared expert or dense MLP."""
    extra = spec.shared_ffn or spec.dense_ffn
    return BUFFER_LIFETIMES if extra else BUFFER_LIFETIMES[:N_BASE_BUFFERS]


def plan_arena(spec: ModelSpec, max_seq: int, block: int | None = None, q8: bool = False,
               max_block: int = MAX_PREFILL_BLOCK, kv: str = "f32") -> ArenaPlan:
    """Each class of data (CLASSES) one range of the arena, in format.ARENA_ORDER, planned greedy by
    size within it (_greedy).
    block: tokens per prefill block (default: prefill_block(), at most max_block); q8: the model has
    integer matmuls, which need the xq buffer (last in `buffers`); kv: the KV cache precision."""
    if kv not in fmt.KV_DTYPES:
        raise ValueError(f"KV cache precision {kv!r} not one of {', '.join(fmt.KV_DTYPES)}")
    block = prefill_block(spec, max_seq, max_block, kv) if not block else block
    if not 1 <= block <= max_block:
        raise ValueError(f"prefill block {block} outside 1..{max_block}")
    nbytes = buffer_bytes(spec, max_seq, block, kv)
    lifetimes = buffer_lifetimes(spec) + ((XQ_BUFFER,) if q8 else ())
    sizes = {name: align_up(nbytes[name]) for name, _, _ in lifetimes if name != "xq"}
    if q8:
        sizes["xq"] = block * xq_row_bytes(spec)
    placed: dict[int, Buffer] = {}
    classes = []
    base = 0
    for cls in fmt.ARENA_ORDER:  # each class greedy in a range of its own, the next one after it
        members = [i for i, (name, _, _) in enumerate(lifetimes) if BUFFER_CLASS[name] == cls]
        start = CTX_BYTES if cls == "activations" else base
        placed.update(_greedy(lifetimes, sizes, members, start))
        end = align_up(max((placed[i].offset + placed[i].nbytes for i in members), default=start))
        classes.append((cls, base, end - base))
        base = end
    buffers = tuple(placed[i] for i in range(len(lifetimes)))
    arena = base  # the classes side by side: the regions of colibri_init_regions fill it exactly
    return ArenaPlan(
        buffers=buffers,
        arena_bytes=arena,
        naive_bytes=CTX_BYTES + sum(sizes.values()),
        kv_cache_bytes=sizes["key_cache"] + sizes["value_cache"],
        prefill_block=block,
        kv=kv,
        classes=tuple(sorted(classes, key=lambda c: CLASSES.index(c[0]))),
    )


def _greedy(lifetimes, sizes: dict[str, int], members: list[int], start: int) -> dict[int, Buffer]:
    """Greedy by size: each buffer takes the lowest offset from start free of every placed buffer whose
    lifetime overlaps its own (TFLite Micro's greedy planner)."""
    placed: dict[int, Buffer] = {}
    for i in sorted(members, key=lambda i: (-sizes[lifetimes[i][0]], i)):
        name, first, last = lifetimes[i]
        cand = Buffer(name, sizes[name], first, last, 0)
        busy = sorted((b.offset, b.offset + b.nbytes) for b in placed.values() if b.live_with(cand))
        offset = start
        for lo, hi in busy:
            if offset + cand.nbytes <= lo:
                break
            offset = max(offset, hi)
        placed[i] = Buffer(name, cand.nbytes, first, last, offset)
    return placed


def arena_fits(plan: ArenaPlan, rooms: Sequence[tuple[Sequence[str], int]]) -> bool:
    """Whether a plan fits memories given as (the arena classes one holds, its bytes): a memory holding
    every class takes the whole arena, one holding some of them their ranges (each rounded up to ALIGN)."""
    return all((plan.arena_bytes if set(classes) >= set(fmt.CLASSES)
                else sum(plan.class_bytes(c) for c in classes)) <= room for classes, room in rooms)


def largest_max_seq(spec: ModelSpec, rooms: Sequence[tuple[Sequence[str], int]], cap: int,
                    block: int | None = None, q8: bool = False, max_block: int = MAX_PREFILL_BLOCK,
                    kv: str = "f32") -> int:
    """The largest max_seq in 1..cap whose arena (as plan_arena() plans it) fits the memories `rooms`
    (arena_fits); 0 if none does. The arena grows with max_seq (the caches and the scores do; the default
    block too)."""
    def fits(n: int) -> bool:
        return arena_fits(plan_arena(spec, n, block, q8, max_block, kv), rooms)

    if block and block > 1:
        cap = max(cap, block)  # a block longer than max_seq is refused by the plan, not sized
        lo = block
    else:
        lo = 1
    if not fits(lo):
        return 0
    hi = cap
    while lo < hi:  # invariant: fits(lo)
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
