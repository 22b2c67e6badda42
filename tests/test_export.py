"""Exporter and build behaviour: determinism, clean failures, incremental builds."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import BIN, synth

SMALL = dict(layers=1, hidden=32, ffn=48, heads=4, kv_heads=2, experts=3, top_k=2, vocab=64, seed=3)


def colibri(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "colibri"), *map(str, args)], capture_output=True, text=True)


def test_export_twice_is_byte_identical(tmp_path):
    ckpt = synth(tmp_path / "m", **SMALL)
    for out in ("a", "b"):
        assert colibri("export", ckpt, "-o", tmp_path / out).returncode == 0
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == ["manifest.json", "model.bin", "model.c", "model.h", "model_blob.S"]
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


def test_export_reports_bits_and_errors(tmp_path):
    ckpt = synth(tmp_path / "m", **SMALL)
    res = colibri("export", ckpt, "-o", tmp_path / "out", "--quant", "int8c")
    assert res.returncode == 0, res.stderr
    assert "layers.0.moe.experts.2.down" in res.stdout and "b/w" in res.stdout
    assert "(int8 " in res.stdout  # int8 error printed beside int8c for comparison
    assert "planned" in res.stdout and "naive" in res.stdout
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    router = next(t for t in m["tensors"] if t["name"] == "layers.0.moe.router")
    assert router["quant"] == "f32" and "router" in m["higher_precision"]


def _rewrite(ckpt, fn):
    path = ckpt / "model.safetensors"
    tensors = load_file(path)
    fn(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _bad_missing(ckpt):
    _rewrite(ckpt, lambda t: t.pop("model.layers.0.self_attn.k_proj.weight"))
    return "model.layers.0.self_attn.k_proj.weight"


def _bad_extra(ckpt):
    _rewrite(ckpt, lambda t: t.__setitem__("model.layers.0.mystery.weight", np.zeros(3, np.float32)))
    return "model.layers.0.mystery.weight"


def _bad_shape(ckpt):
    _rewrite(ckpt, lambda t: t.__setitem__("model.norm.weight", np.ones(31, np.float32)))
    return "model.norm.weight"


def _bad_dtype(ckpt):
    _rewrite(ckpt, lambda t: t.__setitem__("model.norm.weight", np.ones(32, np.int32)))
    return "model.norm.weight"


def _bad_nan(ckpt):
    def poison(t):
        w = t["model.layers.0.block_sparse_moe.experts.1.w2.weight"].copy()
        w[3, 4] = np.nan
        t["model.layers.0.block_sparse_moe.experts.1.w2.weight"] = w
    _rewrite(ckpt, poison)
    return "model.layers.0.block_sparse_moe.experts.1.w2.weight"


def _bad_inf(ckpt):
    def poison(t):
        w = t["model.embed_tokens.weight"].copy()
        w[0, 0] = np.inf
        t["model.embed_tokens.weight"] = w
    _rewrite(ckpt, poison)
    return "model.embed_tokens.weight"


def _bad_arch(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["architectures"] = ["GPTBigCodeForCausalLM"]
    cfg["model_type"] = "gpt_bigcode"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    return "GPTBigCodeForCausalLM"


def _bad_truncated(ckpt):
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return "model.safetensors"


def _bad_garbage(ckpt):
    (ckpt / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"not json")
    return "model.safetensors"


BAD = {f.__name__[5:]: f for f in (_bad_missing, _bad_extra, _bad_shape, _bad_dtype, _bad_nan, _bad_inf,
                                   _bad_arch, _bad_truncated, _bad_garbage)}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoint_exits_2_and_writes_nothing(case, tmp_path):
    ckpt = synth(tmp_path / "m", **SMALL)
    needle = BAD[case](ckpt)
    out = tmp_path / "out"
    res = colibri("export", ckpt, "-o", out)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("colibri: error: "), res.stderr
    assert needle in lines[0]
    assert str(ckpt) in lines[0] or "model.safetensors" in lines[0] or "config.json" in lines[0]
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_failed_export_keeps_previous_output(tmp_path):
    ckpt = synth(tmp_path / "m", **SMALL)
    out = tmp_path / "out"
    assert colibri("export", ckpt, "-o", out).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _bad_nan(ckpt)
    assert colibri("export", ckpt, "-o", out).returncode == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_null_build_and_quant_change(tmp_path):
    from conftest import output_dirs, scons

    ckpt = synth(tmp_path / "nb", **SMALL)
    build = tmp_path / "build"
    scons(f"MODEL={ckpt}", build=build)
    # --question exits 0 only when every target is up to date
    assert scons(f"MODEL={ckpt}", "--question", build=build, check=False).returncode == 0
    assert scons(f"MODEL={ckpt}", "QUANT=f32", "--question", build=build, check=False).returncode != 0
    res = scons(f"MODEL={ckpt}", "QUANT=f32", build=build)
    # another quantization has outputs of its own (build/host/nb-f32/), beside the default one's
    assert output_dirs(res)["host"] == build / "host" / "nb-f32"
    assert "f32" in res.stdout and (build / "gen" / "nb-f32" / "f32" / "model.bin").exists()
    assert scons(f"MODEL={ckpt}", "--question", build=build, check=False).returncode == 0
    so = build / "host" / "nb-f32" / "libcolibri_nb-f32.so"
    out = subprocess.run([sys.executable, "-c", f"from colibri.runtime import load; print(load('{so}').vocab)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "64"


def test_checkpoint_colibri_json_sets_the_builtin_prompt(tmp_path):
    ckpt = synth(tmp_path / "m", **SMALL)
    (ckpt / "colibri.json").write_text(json.dumps({"prompt": [7, 8, 9, 10], "generate": 5}))
    assert colibri("export", ckpt, "-o", tmp_path / "out").returncode == 0
    model_h = (tmp_path / "out" / "model.h").read_text()
    assert "#define COLIBRI_DEFAULT_PROMPT { 7, 8, 9, 10 }" in model_h
    assert "#define COLIBRI_DEFAULT_GENERATE 5" in model_h
    (ckpt / "colibri.json").write_text('{"prompt": "not a list"}')
    res = colibri("export", ckpt, "-o", tmp_path / "out2")
    assert res.returncode == 2 and "colibri.json" in res.stderr


def test_layouts_and_their_prefill_blocks(tmp_path):
    """Linux kernels take 16-row tiles and blocks up to 128 tokens; the row layout (microcontrollers) up to 32,
    and asking it for more is refused before anything is written."""
    from blobread import header

    ckpt = synth(tmp_path / "m", **SMALL)
    for layout, block, code in (("tiled16", 128, 0), ("rows", 32, 0), ("rows", 33, 2), ("tiled16", 129, 2)):
        out = tmp_path / f"{layout}-{block}"
        res = colibri("export", ckpt, "-o", out, "--layout", layout, "--prefill-block", str(block), "--max-seq", "200")
        assert res.returncode == code, res.stderr
        if code:
            assert res.stderr.count("\n") == 1 and f"--prefill-block {block} outside" in res.stderr, res.stderr
            assert not out.exists()
            continue
        h = header((out / "model.bin").read_bytes())
        assert (h["version_minor"], h["layout"], h["prefill_block"]) == (4, {"tiled16": 2, "rows": 1}[layout], block)
        assert json.loads((out / "manifest.json").read_text())["arena"]["prefill_block"] == block
