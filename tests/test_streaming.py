"""Streaming export: bounded memory on a ~300 MB checkpoint, pooled output identical to serial, progress."""

from __future__ import annotations

import io
import json
import subprocess
import sys

from colibri.codegen.export import ExportOptions, export

from conftest import synth

# ~340 MB of bf16: 4 layers of 8 experts (1536 x 1024), an 8000-word embedding and lm_head
BIG = dict(layers=4, hidden=1024, ffn=1536, heads=16, kv_heads=4, experts=8, top_k=2, vocab=8000, seed=1,
           dtype="bf16")
MID = dict(layers=2, hidden=128, ffn=192, heads=4, kv_heads=2, experts=4, top_k=2, vocab=500, seed=4,
           dtype="bf16", heavy_tail=True)
# VmHWM, the process's own peak resident set (ru_maxrss would carry over the forking test process's
# across the exec); the quantizing workers are threads of this process
MEASURE = """
import json, sys
from colibri.codegen.export import ExportOptions, export

def hwm():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

base = hwm()
export(sys.argv[1], sys.argv[2], ExportOptions(workers=int(sys.argv[3])))
print(json.dumps({"base": base, "peak": hwm()}))
"""
LIMIT_KB = 200 * 1024


def test_300mb_export_stays_under_200mb_above_baseline(tmp_path):
    """Two quantizing threads on a ~340 MB checkpoint: the exporter's peak resident set grows by less than
    200 MB over what it held after its imports."""
    ckpt = synth(tmp_path / "big", **BIG)
    size = sum(p.stat().st_size for p in ckpt.iterdir())
    assert 250e6 < size < 400e6, size
    res = subprocess.run([sys.executable, "-c", MEASURE, str(ckpt), str(tmp_path / "out"), "2"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    rss = json.loads(res.stdout.strip().splitlines()[-1])  # kB
    assert 0 < rss["base"] < rss["peak"] and rss["peak"] - rss["base"] < LIMIT_KB, rss
    assert (tmp_path / "out" / "model.bin").stat().st_size > 100e6


def test_pooled_export_is_byte_identical_to_serial(tmp_path):
    ckpt = synth(tmp_path / "mid", **MID)
    for quant, group in (("int8c", 0), ("int8", 64), ("f16", 0)):
        outs = []
        for workers in (1, 2):
            out = tmp_path / f"{quant}-{workers}"
            export(ckpt, out, ExportOptions(quant=quant, group_size=group, workers=workers))
            outs.append(out)
        for f in ("model.bin", "manifest.json", "model.h", "model.c", "model_blob.S"):
            assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes(), (quant, f)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal_lines_otherwise(tmp_path):
    ckpt = synth(tmp_path / "mid", **MID)
    lines: list[str] = []
    export(ckpt, tmp_path / "a", report=lines.append, terminal=io.StringIO())
    assert any("layers.1.moe.experts.3.gate" in ln and "b/w" in ln for ln in lines)
    term, lines = _Terminal(), []
    export(ckpt, tmp_path / "b", report=lines.append, terminal=term)
    assert not any("b/w" in ln for ln in lines) and any("blob" in ln for ln in lines)
    drawn = term.getvalue()
    n = len(json.loads((tmp_path / "b" / "manifest.json").read_text())["tensors"])
    assert drawn.startswith("\r") and drawn.endswith("\n") and "\n" not in drawn[:-1]
    last = drawn.rstrip("\n").split("\r")[-1]
    assert f"{n}/{n} tensors" in last and "MB/s" in last and "ETA" in last
