"""Reading tensors as private mappings of the safetensors file (codegen/safetensors_reader.py) and the
int8c outlier selection's definition (codegen/quantize.py), checked against independent references: the
safetensors library's own reader, the bytes written, and a direct computation of the scores."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.errors import ExportError
from colibri.codegen.quantize import LEAN_MIN_WEIGHTS, quantize
from colibri.codegen.safetensors_reader import SafetensorsFile
from colibri.codegen.spec import canonical_names

from conftest import synth


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_read_matches_the_library_is_writable_and_leaves_the_file_untouched(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((33, 17)).astype(np.float32),
               "b": rng.standard_normal((5, 7)).astype(np.float16),
               "c": rng.standard_normal((1, 4099)).astype(np.float32)}
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    before = _sha(path)
    want = load_file(str(path))
    f = SafetensorsFile(path)
    for name in tensors:
        for mapped in (False, True):
            got = f.read(name, mapped=mapped)
            assert got.dtype == np.float32 and got.shape == want[name].shape
            assert np.array_equal(got, want[name].astype(np.float32)), (name, mapped)
            got[...] = 7.0  # a new array as far as the caller can tell: writable, its writes its own
            assert np.array_equal(f.read(name, mapped=mapped), want[name].astype(np.float32)), (name, mapped)
    assert _sha(path) == before


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_held_tensors_hold_no_file_descriptor(tmp_path, dtype):
    """Checkpoint.get's arrays may be kept by the hundred (the reference keeps every tensor): they are
    copies, not mappings holding a descriptor each; get_mapped's (the exporter's, one at a time) give
    the same values and let theirs go with the array."""
    ckpt = open_checkpoint(synth(tmp_path / "c", layers=2, hidden=32, ffn=32, heads=2, kv_heads=1, experts=4,
                                 top_k=2, vocab=64, seed=3, dtype=dtype))
    names = canonical_names(ckpt.spec)
    before = _open_fds()
    held = [ckpt.get(n) for n in names]
    assert _open_fds() == before
    for name, w in zip(names, held, strict=True):
        m = ckpt.get_mapped(name)
        assert np.array_equal(m, w), name
        del m
    assert _open_fds() == before


def _unaligned_file(path: Path, arrays: dict[str, np.ndarray], dtype: str) -> None:
    """A safetensors file whose data section starts at an odd offset (space padding to 8k + 1 bytes)."""
    header, offset = {}, 0
    for name, a in arrays.items():
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * ((1 - len(text)) % 8)
    assert (8 + len(text)) % 2 == 1
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(a.tobytes() for a in arrays.values()))


@pytest.mark.parametrize("dtype,np_dtype", [("F32", "<f4"), ("F16", "<f2")])
def test_read_of_unaligned_data(tmp_path, dtype, np_dtype):
    rng = np.random.default_rng(1)
    arrays = {"x": rng.standard_normal((3, 5)).astype(np_dtype), "y": rng.standard_normal(9).astype(np_dtype)}
    path = tmp_path / "model.safetensors"
    _unaligned_file(path, arrays, dtype)
    f = SafetensorsFile(path)
    for name, a in arrays.items():
        assert np.array_equal(f.read(name), a.astype(np.float32)), name


@pytest.mark.parametrize("mapped", [False, True])
def test_read_of_a_file_truncated_after_it_was_opened(tmp_path, mapped):
    path = tmp_path / "model.safetensors"
    save_file({"w": np.ones((64, 64), dtype=np.float32)}, str(path))
    f = SafetensorsFile(path)
    os.truncate(path, path.stat().st_size - 100)
    with pytest.raises(ExportError) as info:
        f.read("w", mapped=mapped)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") and "tensor w: " in msg and "truncated" in msg and "\n" not in msg, msg


def _scores(w: np.ndarray, g: int) -> np.ndarray:
    """|w| / rms of its group of g inputs (the last group the remainder), float64, computed directly."""
    rows, cols = w.shape
    out = np.empty((rows, cols))
    w64 = np.abs(w.astype(np.float64))
    for start in range(0, cols, g):
        part = w64[:, start:start + g]
        rms = np.sqrt(np.mean(part * part, axis=1, keepdims=True))
        out[:, start:start + g] = part / np.where(rms > 0, rms, 1.0)
    return out.reshape(-1)


def _matrices():
    rng = np.random.default_rng(2)
    yield "normal", rng.standard_normal((96, 160)).astype(np.float32)
    yield "ties", rng.integers(-3, 4, (96, 160)).astype(np.float32)
    yield "heavy", rng.standard_t(2, (96, 160)).astype(np.float32)
    sparse = np.zeros((96, 160), dtype=np.float32)
    sparse.reshape(-1)[rng.choice(sparse.size, 40, replace=False)] = rng.integers(1, 3, 40)
    yield "sparse", sparse  # most scores 0: the sampled bound is 0
    lean = rng.integers(-2, 3, (LEAN_MIN_WEIGHTS // 64 + 1, 64)).astype(np.float32)
    yield "lean", lean


@pytest.mark.parametrize("group", [0, 32, 48])
def test_int8c_corrects_the_largest_scores(group):
    """The corrected entries are n_out of the largest scores: none left out scores above one taken; of
    those tied at the cut, a tensor of LEAN_MIN_WEIGHTS or more takes the first in memory order."""
    for label, w in _matrices():
        for frac in (0.005, 0.03):
            qt = quantize(w, "int8c", group_size=group, outlier_frac=frac)
            n_out = int(frac * w.size)
            g = w.shape[1] if group == 0 else group
            score = _scores(w, g)
            taken = np.zeros(w.size, dtype=bool)
            taken[qt.oidx] = True
            assert qt.n_outliers == n_out and taken.sum() == n_out, (label, frac)
            low, high = score[taken].min(), score[~taken].max()
            assert low >= high * (1 - 1e-12), (label, group, frac, low, high)
            if w.size >= LEAN_MIN_WEIGHTS:
                tied = np.flatnonzero(np.isclose(score, low, rtol=1e-12, atol=0))
                k = int(taken[tied].sum())
                assert taken[tied[:k]].all(), (label, group, frac, "ties not taken in memory order")
