"""bench/export.py's --work: a directory that does not exist yet is made (it failed with a traceback), one
that cannot be made is one line naming it and exit 2."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT, synth

EXPORT = ROOT / "bench" / "export.py"


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXPORT), *args], capture_output=True, text=True, timeout=300)


def test_missing_work_directory_is_made(tmp_path):
    ck = synth(tmp_path / "ck", layers=1, hidden=32, ffn=64, heads=2, kv_heads=1, experts=2, top_k=1, vocab=64,
               seed=3)
    work = tmp_path / "not" / "yet"
    res = _bench("--ckpt", str(ck), "--workers", "1", "--work", str(work))
    assert res.returncode == 0, res.stderr
    assert "1 worker" in res.stdout and "M weights/s" in res.stdout, res.stdout
    assert work.is_dir() and not any(work.iterdir())  # its temp directory removed afterwards


def test_work_directory_that_cannot_be_made_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = _bench("--work", str(blocker / "sub"))
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and str(blocker / "sub") in res.stderr, res.stderr
    assert res.stdout == ""
