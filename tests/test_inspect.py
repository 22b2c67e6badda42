"""`colibri inspect` on a checkpoint and on a blob, against counts taken from the files themselves."""

from __future__ import annotations

import json
import subprocess

import numpy as np
from safetensors.numpy import load_file

from conftest import BIN, synth

SHAPE = dict(layers=2, hidden=48, ffn=80, heads=4, kv_heads=2, experts=5, top_k=2, vocab=97, seed=8)


def inspect(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "colibri"), "inspect", *map(str, args), "--json"], capture_output=True,
                          text=True)


def test_checkpoint_parameter_counts(tmp_path):
    ckpt = synth(tmp_path / "m", **SHAPE)
    tensors = load_file(ckpt / "model.safetensors")
    total = sum(int(np.prod(t.shape)) for t in tensors.values())
    per_expert = sum(int(np.prod(t.shape)) for n, t in tensors.items() if ".experts.0." in n) // SHAPE["layers"]
    res = inspect(ckpt)
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["family"] == "mixtral" and info["params_total"] == total
    assert info["params_per_expert"] == per_expert
    inactive = SHAPE["layers"] * (SHAPE["experts"] - SHAPE["top_k"]) * per_expert
    assert info["params_active_per_token"] == total - inactive


def test_blob_crc_status(tmp_path):
    ckpt = synth(tmp_path / "m", **SHAPE)
    out = tmp_path / "gen"
    subprocess.run([str(BIN / "colibri"), "export", str(ckpt), "-o", str(out)], check=True, capture_output=True)
    info = json.loads(inspect(out / "model.bin").stdout)
    assert info["crc_ok"] and info["blob_bytes"] == (out / "model.bin").stat().st_size
    assert set(info["quantization"]) == {"int8c", "f32"}
    raw = bytearray((out / "model.bin").read_bytes())
    raw[-200] ^= 0x40
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(raw))
    res = inspect(bad)
    assert res.returncode == 1 and json.loads(res.stdout)["crc_ok"] is False
