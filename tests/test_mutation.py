"""2,000 random mutations of valid blobs: each an error code or a successful init, never a crash.

Mutations are bit flips, truncations, extensions, garbage blocks, header / tensor-table / arena-plan
fields set to extremes and dense-layer map bits, over the seed exports of cbuild.SEEDS, from a fixed seed. The runner
(runtime_c/test/fuzz_blob.c with its own main, ASan + UBSan) tries each blob as it is and once
more with blob_bytes and the CRC-32 made to match, so the mutations reach the checks behind the
CRC; whatever init accepts then goes through forward, reset and the misuse checks.
"""

from __future__ import annotations

import collections
import struct
import zlib

import numpy as np
import pytest

from blobread import HEADER_FIELDS, entry_offset, header
from cbuild import ASAN, FUZZ_SRC, KNOWN, NATIVE, SCALAR, compile_c, run_files, seed_blobs

N_MUTATIONS = 2000
FMT_BITS = {"H": 16, "I": 32, "Q": 64}
ENTRY_FIELDS = [(0, "H"), (2, "H"), (4, "H"), (6, "B"), (7, "B"), (8, "I"), (12, "I"), (16, "I"), (20, "I"),
                (24, "I"), (28, "I"), (32, "Q"), (40, "Q"), (48, "Q"), (56, "Q")]
FLOAT_EXTREMES = [float("nan"), float("inf"), float("-inf"), -1.0, 0.0, 1e-45, 3.4028234663852886e38, -0.0]
BUFFER_OFFSETS = [(96 + 8 * i, "Q") for i in range(13)]  # 11 in format 1.0, 13 with 1.1 features
DENSE_MAP = 216  # format 1.1: 32 bytes, one bit per dense layer


S = {"OK": 0, "BAD_MAGIC": 2, "VERSION": 3, "TRUNCATED": 4, "CRC": 5, "BAD_HEADER": 6, "TENSOR_BOUNDS": 7,
     "BAD_TENSOR": 8, "LAYOUT": 9, "BAD_PLAN": 13, "DTYPE": 19}
_ANY = set(S.values())
# The statuses a blob may get once its length field and CRC are made to match again ("fixed-up"), by class
# of mutation: a longer blob is still valid; a table entry can only break its tensor; a plan field only the
# plan (or, past the 11 base buffers of a blob without format 1.1 features, those header words); the dense
# map only the header's layer structure (or the tensors it then asks for); a cut blob has tensors past its
# end (-1: too short to fix up).
EXPECTED = {
    "extend": {S["OK"]},
    "entry_field": {S["OK"], S["TENSOR_BOUNDS"], S["BAD_TENSOR"], S["DTYPE"]},
    "plan_field": {S["OK"], S["BAD_PLAN"], S["BAD_HEADER"]},
    "dense_map": {S["BAD_HEADER"], S["BAD_TENSOR"]},
    # a record of the parameters section (FORMAT.md "Parameters"): an unknown key is a newer feature, a broken
    # order, index, key/flag pairing or f32 the header's; a changed window resizes the KV cache (the plan's)
    "params_record": {S["OK"], S["VERSION"], S["BAD_HEADER"], S["BAD_PLAN"]},
    "truncate": {-1, S["OK"], S["TRUNCATED"], S["TENSOR_BOUNDS"]},
    "stale_crc": _ANY - {S["BAD_MAGIC"], S["VERSION"]},
    **dict.fromkeys(("bitflip", "bitflip_head", "garbage", "header_field", "two_fields"), _ANY),
}


def _extremes(bits: int, rng) -> list[int]:
    top = (1 << bits) - 1
    return [0, 1, 2, 63, 64, 65, top, top - 1, top >> 1, (top >> 1) + 1, 1 << (bits // 2),
            int(rng.integers(0, top, dtype=np.uint64, endpoint=True))]


def _set_field(b: bytearray, off: int, fmt: str, rng) -> None:
    if fmt == "f":
        struct.pack_into("<f", b, off, FLOAT_EXTREMES[rng.integers(len(FLOAT_EXTREMES))])
        return
    bits = 8 if fmt == "B" else FMT_BITS[fmt]
    values = _extremes(bits, rng)
    struct.pack_into("<" + fmt, b, off, values[rng.integers(len(values))])


def _params_bytes(blob: bytes) -> tuple[int, int] | None:
    """(data_off, bytes) of the PARAMS entry (FORMAT.md "Parameters"), None without the PARAMS flag."""
    h = header(blob)
    if not h["flags"] & 1 << 10:
        return None
    e = entry_offset(h["n_tensors"] - (2 if h["flags"] & 1 << 9 else 1))
    return struct.unpack_from("<Q", blob, e + 32)[0], struct.unpack_from("<I", blob, e + 8)[0]


def mutate(blob: bytes, rng) -> tuple[str, bytes]:
    """One random mutation of a valid blob: (kind, bytes)."""
    b = bytearray(blob)
    h = header(blob)
    table_end = entry_offset(h["n_tensors"])
    kinds = ["bitflip", "bitflip_head", "truncate", "extend", "garbage", "header_field", "entry_field",
             "plan_field", "two_fields", "dense_map", "stale_crc"]
    params = _params_bytes(blob)
    kind = (kinds + ["params_record"] * 2)[rng.integers(len(kinds) + 2)] if params else kinds[rng.integers(len(kinds))]
    if kind == "params_record":  # one record's key, index or value set to an extreme, the CRC kept matching
        start, n = params
        off, fmt = [(0, "H"), (2, "H"), (4, "I")][rng.integers(3)]
        _set_field(b, start + 8 * int(rng.integers(n // 8)) + off, fmt, rng)
        struct.pack_into("<I", b, 8, zlib.crc32(bytes(b[12:])))
        return kind, bytes(b)
    if kind == "stale_crc":  # flips in the tensor data, the CRC left as it was: only the CRC can tell
        for _ in range(int(rng.integers(1, 17))):
            bit = int(rng.integers(table_end * 8, len(b) * 8))
            b[bit // 8] ^= 1 << (bit % 8)
        return kind, bytes(b)
    if kind in ("bitflip", "bitflip_head"):
        end = len(b) if kind == "bitflip" else table_end
        for _ in range(int(rng.integers(1, 17))):
            bit = int(rng.integers(0, end * 8))
            b[bit // 8] ^= 1 << (bit % 8)
    elif kind == "truncate":
        special = [0, 1, 8, 11, 12, 23, 24, 255, 256, h["header_bytes"] - 1, h["header_bytes"], len(b) - 1,
                   len(b) - 64]
        n = special[rng.integers(len(special))] if rng.random() < 0.5 else int(rng.integers(0, len(b)))
        b = b[:n]
    elif kind == "extend":
        b += bytes(64) if rng.random() < 0.5 else rng.bytes(int(rng.integers(1, 200)))
    elif kind == "garbage":
        start = int(rng.integers(0, len(b)))
        size = min(len(b) - start, int(rng.integers(1, 129)))
        b[start:start + size] = rng.bytes(size)
    elif kind == "header_field":
        off, fmt, _ = HEADER_FIELDS[rng.integers(len(HEADER_FIELDS))]
        _set_field(b, off, fmt, rng)
    elif kind == "entry_field":
        off, fmt = ENTRY_FIELDS[rng.integers(len(ENTRY_FIELDS))]
        _set_field(b, entry_offset(int(rng.integers(h["n_tensors"]))) + off, fmt, rng)
    elif kind == "dense_map":
        b[DENSE_MAP + int(rng.integers(32))] = int(rng.choice([1, 2, 0x80, 0xFF, int(rng.integers(256))]))
        if rng.random() < 0.5:
            struct.pack_into("<I", b, 28, h["flags"] | 1 << 7)  # and claim dense layers
    elif kind == "plan_field":
        off, fmt = BUFFER_OFFSETS[rng.integers(len(BUFFER_OFFSETS))]
        _set_field(b, off, fmt, rng)
    else:  # two fields at once: a header dim and a tensor-table field
        off, fmt, _ = HEADER_FIELDS[rng.integers(len(HEADER_FIELDS))]
        _set_field(b, off, fmt, rng)
        off, fmt = ENTRY_FIELDS[rng.integers(len(ENTRY_FIELDS))]
        _set_field(b, entry_offset(int(rng.integers(h["n_tensors"]))) + off, fmt, rng)
    if len(b) >= 12 and rng.random() < 0.5:  # half keep a matching CRC, so the raw run goes deep too
        struct.pack_into("<I", b, 8, zlib.crc32(bytes(b[12:])))
    return kind, bytes(b)


@pytest.fixture(scope="module")
def mutations(tmp_path_factory) -> tuple[list, dict]:
    seeds = [p.read_bytes() for p in seed_blobs(tmp_path_factory.mktemp("mutation-seeds"))]
    rng = np.random.default_rng(20240611)
    work = tmp_path_factory.mktemp("mutations")
    files, kinds = [], {}
    for i in range(N_MUTATIONS):
        kind, data = mutate(seeds[i % len(seeds)], rng)
        path = work / f"{i:04d}-{kind}.bin"
        path.write_bytes(data)
        files.append(path)
        kinds[str(path)] = kind
    return files, kinds


@pytest.mark.parametrize("kernels", ["native", "scalar"])
def test_random_mutations_never_crash(kernels, tmp_path, mutations):
    runner = compile_c(tmp_path / "fuzz_run", FUZZ_SRC,
                       ASAN + ["-DCB_FUZZ_MAIN"] + (NATIVE if kernels == "native" else SCALAR))
    files, kinds = mutations
    rows = run_files(runner, files)
    by_status = collections.Counter()
    by_kind = collections.defaultdict(collections.Counter)
    for raw, fixed, path in rows:
        assert raw in KNOWN and fixed in KNOWN | {-1}, f"{path}: unknown status {raw} / {fixed}"
        by_status[raw] += 1
        by_status[fixed] += 1
        by_kind[kinds[path]][fixed] += 1
    summary = {"statuses (raw and fixed-up)": dict(sorted(by_status.items())),
               "fixed-up status by mutation": {k: dict(sorted(v.items())) for k, v in sorted(by_kind.items())}}
    print(f"\nmutation ({kernels} kernels): {summary}")
    # the mutations reach well past the CRC: most failure codes show up, and some blobs still load
    assert by_status[0] > 50, summary
    assert len(by_status) >= 9, summary
    # and each class of mutation gets the codes its check owns (FORMAT.md), nothing else
    for kind, statuses in by_kind.items():
        assert set(statuses) <= EXPECTED[kind], f"{kind}: {dict(statuses)} not within {sorted(EXPECTED[kind])}"
    stale = [raw for raw, _, path in rows if kinds[path] == "stale_crc"]
    assert stale and set(stale) == {S["CRC"]}, collections.Counter(stale)
