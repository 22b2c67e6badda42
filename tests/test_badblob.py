"""Malformed blobs and misuse: a specific error code, never a crash (ASan + UBSan build)."""

from __future__ import annotations

import ctypes
import json
import struct
import subprocess
import zlib

import numpy as np
import pytest

from colibri.runtime import ColibriError, load

from blobread import entry_offset, header
from conftest import GOLDEN

E = {"NULL": 1, "BAD_MAGIC": 2, "VERSION": 3, "TRUNCATED": 4, "CRC": 5, "BAD_HEADER": 6, "TENSOR_BOUNDS": 7,
     "BAD_TENSOR": 8, "LAYOUT": 9, "BLOB_ALIGN": 10, "ARENA_ALIGN": 11, "ARENA_SMALL": 12, "BAD_PLAN": 13,
     "NOT_INIT": 15, "TOKEN": 16, "SEQ_FULL": 17, "ARG": 18}


def _recrc(b: bytearray) -> bytearray:
    struct.pack_into("<I", b, 8, zlib.crc32(bytes(b[12:])))
    return b


def _put(b: bytearray, off: int, fmt: str, value) -> bytearray:
    struct.pack_into("<" + fmt, b, off, value)
    return _recrc(b)


def bad_magic(b):
    b[0] ^= 0xFF
    return b


def bad_version(b):
    return _put(b, 4, "H", 2)


def truncated(b):
    return b[: len(b) // 2]


def length_mismatch(b):
    return _put(b, 16, "Q", len(b) + 64)


def crc_mismatch(b):
    b[-100] ^= 0x01
    return b


def zero_dim(b):
    return _put(b, 64, "I", 0)  # n_experts


def top_k_above_experts(b):
    return _put(b, 68, "I", header(bytes(b))["n_experts"] + 1)


def unknown_layout(b):
    return _put(b, 32, "I", 7)


def tensor_past_end(b):
    return _put(b, entry_offset(5) + 32, "Q", len(b))  # data_off of tensor 5


def tensor_huge_offset(b):
    return _put(b, entry_offset(3) + 32, "Q", (1 << 64) - 64)


def tensor_misaligned(b):
    off = struct.unpack_from("<Q", b, entry_offset(4) + 32)[0]
    return _put(b, entry_offset(4) + 32, "Q", off + 1)


def tensor_wrong_kind(b):
    return _put(b, entry_offset(4), "H", 9)


def tensor_wrong_shape(b):
    rows = struct.unpack_from("<I", b, entry_offset(4) + 8)[0]
    return _put(b, entry_offset(4) + 8, "I", rows + 1)


def _first_outliers(b) -> tuple[int, int, int]:
    for i in range(header(bytes(b))["n_tensors"]):
        n, _, _, _, gap_off, _ = struct.unpack_from("<IIQQQQ", b, entry_offset(i) + 24)
        if n >= 2:
            return i, n, gap_off
    raise AssertionError("no tensor with outliers")


def outliers_repeated(b):
    _, _, gap_off = _first_outliers(b)
    return _put(b, gap_off + 2, "H", 0)  # second index equal to the first


def outliers_past_matrix(b):
    i, n, gap_off = _first_outliers(b)
    return _put(b, gap_off + 2 * (n - 1), "H", 0xFFFF)  # last index beyond rows*cols


def plan_overlap(b):
    offs = struct.unpack_from("<11Q", b, 96)
    return _put(b, 96 + 8 * 4, "Q", offs[2])  # q on top of x, both live in attention


def plan_lifetimes_touch(b):
    offs = struct.unpack_from("<11Q", b, 96)
    return _put(b, 96 + 8 * 5, "Q", offs[4])  # att (steps 3-4) on top of q (steps 1-3): both live at step 3


def plan_outside_arena(b):
    return _put(b, 96 + 8 * 6, "Q", header(bytes(b))["arena_bytes"])


# format 1.2 (integer matmuls): these mutate a blob with an xq buffer and tiled matrices
def tiled_without_xq(b):
    return _put(b, 248, "Q", 0)  # layout 2 needs the integer matmuls


def xq_in_a_1_1_blob(b):
    return _put(b, 6, "H", 1)


def xq_on_a_buffer(b):
    return _put(b, 248, "Q", struct.unpack_from("<Q", b, 96 + 8 * 2)[0])  # on top of x


def xq_outside_arena(b):
    return _put(b, 248, "Q", header(bytes(b))["arena_bytes"])


def xq_misaligned(b):
    return _put(b, 248, "Q", struct.unpack_from("<Q", b, 248)[0] + 4)


def tiled_with_row_padding(b):
    cols = struct.unpack_from("<I", b, entry_offset(3) + 12)[0]  # WQ of layer 0, a tiled matrix
    return _put(b, entry_offset(3) + 16, "I", cols + 16)


Q8_CASES = {f.__name__: (f, code) for f, code in [
    (tiled_without_xq, "LAYOUT"), (xq_in_a_1_1_blob, "BAD_HEADER"), (xq_on_a_buffer, "BAD_PLAN"),
    (xq_outside_arena, "BAD_PLAN"), (xq_misaligned, "BAD_PLAN"), (tiled_with_row_padding, "BAD_TENSOR"),
]}

CASES = {f.__name__: (f, code) for f, code in [
    (bad_magic, "BAD_MAGIC"), (bad_version, "VERSION"), (truncated, "TRUNCATED"),
    (length_mismatch, "TRUNCATED"), (crc_mismatch, "CRC"), (zero_dim, "BAD_HEADER"),
    (top_k_above_experts, "BAD_HEADER"), (unknown_layout, "LAYOUT"), (tensor_past_end, "TENSOR_BOUNDS"),
    (tensor_huge_offset, "TENSOR_BOUNDS"), (tensor_misaligned, "TENSOR_BOUNDS"),
    (tensor_wrong_kind, "BAD_TENSOR"), (tensor_wrong_shape, "BAD_TENSOR"),
    (outliers_repeated, "BAD_TENSOR"), (outliers_past_matrix, "BAD_TENSOR"), (plan_overlap, "BAD_PLAN"),
    (plan_lifetimes_touch, "BAD_PLAN"), (plan_outside_arena, "BAD_PLAN"),
]}


@pytest.fixture(scope="module")
def asan_build(golden_ckpts, build_model):
    return build_model(golden_ckpts[next(iter(sorted(GOLDEN)))], "int8c", "host", "SANITIZE=address,undefined")


def test_sanitized_build_runs_clean(asan_build):
    res = subprocess.run([asan_build / "colibri_run", asan_build / "model.bin", "--generate", "4"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("tokens: ")


@pytest.fixture(scope="module")
def asan_q8_build(golden_ckpts, build_model):
    """A model whose dims are multiples of 32 (integer matmuls, tiled), sanitized."""
    return build_model(golden_ckpts["mixtral_f16"], "int8c", "host", "SANITIZE=address,undefined")


def _expect_code(build, mutate, code, tmp_path):
    raw = bytearray((build / "model.bin").read_bytes())
    blob = tmp_path / "bad.bin"
    blob.write_bytes(bytes(mutate(raw)))
    res = subprocess.run([build / "colibri_run", blob, "--generate", "2"], capture_output=True, text=True)
    assert res.returncode == 3, f"exit {res.returncode}: {res.stderr}"
    assert f"(status {E[code]})" in res.stderr, res.stderr
    assert "Sanitizer" not in res.stderr and "runtime error" not in res.stderr


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_blob_returns_its_code(case, asan_build, tmp_path):
    _expect_code(asan_build, *CASES[case], tmp_path)


@pytest.mark.parametrize("case", sorted(Q8_CASES))
def test_bad_q8_blob_returns_its_code(case, asan_q8_build, tmp_path):
    h = header((asan_q8_build / "model.bin").read_bytes())
    minor = 4 if h["prefill_block"] > 1 else 2  # 1.4: attention lanes of a prefill block
    assert (h["version_minor"], h["layout"]) == (minor, 2) and h["xq_offset"], h  # the blob these cases mutate
    _expect_code(asan_q8_build, *Q8_CASES[case], tmp_path)


# FORMAT.md "Arena": live steps of the 11 base buffers, in table order
LIVE_STEPS = [(0, 11), (0, 11), (0, 11), (0, 11), (1, 3), (3, 4), (3, 3), (7, 8), (8, 8), (8, 8), (8, 9)]


def test_plan_may_share_between_disjoint_lifetimes(asan_build, tmp_path):
    """The plan check is exact, not merely strict: a buffer moved onto one of disjoint lifetime, clear of
    every buffer live with it, is a valid plan the runtime must run, with the
    same tokens as the exporter's own plan."""
    raw = bytearray((asan_build / "model.bin").read_bytes())
    offs = list(struct.unpack_from("<11Q", raw, 96))
    sizes = {b["name"]: b["bytes"] for b in json.loads((asan_build / "manifest.json").read_text())["arena"]["buffers"]}
    size = [sizes[n] for n in ("key_cache", "value_cache", "x", "xb", "q", "att", "scores", "router", "gate", "up",
                               "moe")]
    arena = header(bytes(raw))["arena_bytes"]

    def live_with(r: int) -> list[int]:
        return [i for i, (a, z) in enumerate(LIVE_STEPS) if i != r and a <= LIVE_STEPS[r][1] and LIVE_STEPS[r][0] <= z]

    moves = [(r, offs[i]) for r in range(11) for i in range(11)
             if i != r and i not in live_with(r) and offs[i] != offs[r] and offs[i] + size[r] <= arena
             and all(offs[i] + size[r] <= offs[j] or offs[j] + size[j] <= offs[i] for j in live_with(r))]
    assert moves, "no buffer of disjoint lifetime to share with"
    r, off = moves[0]
    blob = tmp_path / "shared.bin"
    blob.write_bytes(bytes(_put(raw, 96 + 8 * r, "Q", off)))
    run = [asan_build / "colibri_run", "--generate", "4"]
    want = subprocess.run([run[0], asan_build / "model.bin", *run[1:]], capture_output=True, text=True)
    got = subprocess.run([run[0], blob, *run[1:]], capture_output=True, text=True)
    assert want.returncode == 0 and got.returncode == 0, got.stderr
    assert got.stdout.splitlines()[0] == want.stdout.splitlines()[0]  # the tokens: line


def _lib_and_blob(out):
    m = load(out / "model.bin")
    lib = m._lib
    blob = np.fromfile(out / "model.bin", dtype=np.uint8)
    aligned = np.zeros(blob.size + 64, np.uint8)
    start = (-aligned.ctypes.data) % 64
    aligned[start:start + blob.size] = blob
    return m, lib, aligned, aligned.ctypes.data + start, blob.size


def test_arena_misaligned_too_small_and_blob_misaligned(golden_ckpts, build_model):
    m, lib, keep, blob_ptr, n = _lib_and_blob(build_model(golden_ckpts["gqa_top2"], "int8c"))
    need = m.arena_bytes
    arena = np.zeros(need + 128, np.uint8)
    base = arena.ctypes.data + (-arena.ctypes.data) % 64
    ctx = ctypes.c_void_p()
    assert lib.colibri_init(ctypes.byref(ctx), base + 8, need, blob_ptr, n) == E["ARENA_ALIGN"]
    assert lib.colibri_init(ctypes.byref(ctx), base, need - 1, blob_ptr, n) == E["ARENA_SMALL"]
    assert lib.colibri_init(ctypes.byref(ctx), base, 0, blob_ptr, n) == E["ARENA_SMALL"]
    assert lib.colibri_init(ctypes.byref(ctx), base, need, blob_ptr + 4, n - 4) == E["BLOB_ALIGN"]
    assert lib.colibri_init(None, base, need, blob_ptr, n) == E["NULL"]
    assert lib.colibri_init(ctypes.byref(ctx), base, need, blob_ptr, n) == 0
    size = ctypes.c_size_t()
    assert lib.colibri_arena_bytes(blob_ptr, n, ctypes.byref(size)) == 0 and size.value == need
    assert lib.colibri_strerror(9999)  # any value has a string


def test_forward_before_init_and_misuse_leave_context_usable(golden_ckpts, build_model):
    m, lib, keep, blob_ptr, n = _lib_and_blob(build_model(golden_ckpts["gqa_top2"], "int8c"))
    arena = np.zeros(m.arena_bytes + 64, np.uint8)
    base = arena.ctypes.data + (-arena.ctypes.data) % 64
    tok = (ctypes.c_int32 * 1)(1)
    logits = (ctypes.c_float * m.vocab)()
    assert lib.colibri_forward(base, tok, 1, logits, m.vocab) == E["NOT_INIT"]
    assert lib.colibri_reset(base) == E["NOT_INIT"]
    assert lib.colibri_forward(None, tok, 1, logits, m.vocab) == E["NULL"]

    first = m.forward([1, 2])
    m.reset()
    for bad, code in (([m.vocab], "TOKEN"), ([-1], "TOKEN"), ([1, m.vocab + 5], "TOKEN")):
        with pytest.raises(ColibriError) as err:
            m.forward(bad)
        assert err.value.status == E[code]
    assert m.n_past == 0
    assert lib.colibri_forward(m._ctx, tok, 0, logits, m.vocab) in (E["ARG"], E["NULL"])
    assert lib.colibri_forward(m._ctx, tok, 1, logits, m.vocab - 1) == E["ARG"]
    assert np.array_equal(m.forward([1, 2]), first)  # still usable, same answer
    m.reset()
    m.forward([1] * m.max_seq)
    with pytest.raises(ColibriError) as err:
        m.forward([1])
    assert err.value.status == E["SEQ_FULL"] and m.n_past == m.max_seq
    m.reset()
    assert np.array_equal(m.forward([1, 2]), first)
