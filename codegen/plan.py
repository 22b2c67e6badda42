"""Static arena plan: where every runtime buffer lives, decided at export time.

The buffers and their lifetimes mirror runtime_c/FORMAT.md ("Arena"); the C
runtime re-checks every plan against its own copy of this table, so a plan
that would alias live data is refused rather than trusted.
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec import ModelSpec

CTX_BYTES = 256  # the runtime's context sits at arena offset 0
ALIGN = 64
F32 = 4

# (name, first step, last step) in FORMAT.md order; steps are those of one layer
BUFFER_LIFETIMES: tuple[tuple[str, int, int], ...] = (
    ("key_cache", 0, 11),
    ("value_cache", 0, 11),
    ("x", 0, 11),
    ("xb", 0, 11),
    ("q", 1, 3),
    ("att", 3, 4),
    ("scores", 3, 3),
    ("router", 7, 8),
    ("gate", 8, 8),
    ("up", 8, 8),
    ("moe", 8, 9),
    # format 1.1, only in models with a shared expert or dense layers: their MLP's gate and up
    ("xgate", 8, 8),
    ("xup", 8, 8),
)
N_BASE_BUFFERS = 11


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

    def to_json(self) -> dict:
        return {
            "arena_bytes": self.arena_bytes,
            "naive_bytes": self.naive_bytes,
            "kv_cache_bytes": self.kv_cache_bytes,
            "context_bytes": CTX_BYTES,
            "buffers": [
                {"name": b.name, "offset": b.offset, "bytes": b.nbytes, "live_steps": [b.first, b.last]}
                for b in self.buffers
            ],
        }


def buffer_elements(spec: ModelSpec, max_seq: int) -> dict[str, int]:
    kv = spec.n_layers * max_seq * spec.n_kv_heads * spec.head_dim
    qdim = spec.n_heads * spec.head_dim
    return {
        "key_cache": kv,
        "value_cache": kv,
        "x": spec.hidden,
        "xb": spec.hidden,
        "q": qdim,
        "att": qdim,
        "scores": max_seq,
        "router": spec.n_experts,
        "gate": spec.ffn,
        "up": spec.ffn,
        "moe": spec.hidden,
        "xgate": max(spec.shared_ffn, spec.dense_ffn),
        "xup": max(spec.shared_ffn, spec.dense_ffn),
    }


def buffer_lifetimes(spec: ModelSpec) -> tuple[tuple[str, int, int], ...]:
    """The buffers a model needs: the 11 of format 1.0, plus xgate and xup for a shared expert or dense MLP."""
    extra = spec.shared_ffn or spec.dense_ffn
    return BUFFER_LIFETIMES if extra else BUFFER_LIFETIMES[:N_BASE_BUFFERS]


def plan_arena(spec: ModelSpec, max_seq: int) -> ArenaPlan:
    """Greedy by size: each buffer takes the lowest offset free of every placed
    buffer whose lifetime overlaps its own (TFLite Micro's greedy planner)."""
    elems = buffer_elements(spec, max_seq)
    lifetimes = buffer_lifetimes(spec)
    sizes = {name: align_up(elems[name] * F32) for name, _, _ in lifetimes}
    order = sorted(range(len(lifetimes)), key=lambda i: (-sizes[lifetimes[i][0]], i))
    placed: dict[int, Buffer] = {}
    for i in order:
        name, first, last = lifetimes[i]
        cand = Buffer(name, sizes[name], first, last, 0)
        busy = sorted((b.offset, b.offset + b.nbytes) for b in placed.values() if b.live_with(cand))
        offset = CTX_BYTES
        for lo, hi in busy:
            if offset + cand.nbytes <= lo:
                break
            offset = max(offset, hi)
        placed[i] = Buffer(name, cand.nbytes, first, last, offset)
    buffers = tuple(placed[i] for i in range(len(lifetimes)))
    arena = max(b.offset + b.nbytes for b in buffers)
    return ArenaPlan(
        buffers=buffers,
        arena_bytes=arena,
        naive_bytes=CTX_BYTES + sum(sizes.values()),
        kv_cache_bytes=sizes["key_cache"] + sizes["value_cache"],
    )
