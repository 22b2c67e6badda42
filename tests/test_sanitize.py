"""The golden models through the ASan + UBSan build, and the demos under valgrind.

`SANITIZE=address,undefined` builds build/host-address-undefined/<model>/ (the bad-blob tests
in test_badblob.py run against it too). Its generic colibri_run runs every golden model.bin and
its colibri_demo the model linked into it: same tokens and logits, to the bit, as the normal
build, and the same tokens as the numpy reference on the blob's weights.

valgrind runs over the x86_64 (x86-64-v2) build's colibri_demo, colibri_run and colibri_demo_dl:
the host build is -march=native, and valgrind knows no AVX-512.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess

import pytest

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.reference import Reference

from blobread import weights as blob_weights
from cbuild import SAN_ENV, TEST_SRC, sanitizer_report
from conftest import GOLDEN

PROMPT = [3, 17, 42, 5]
N_GEN = 24
ASAN_OF = "gqa_top2"  # the model whose ASan build test_badblob.py uses as well


def _args(vocab: int) -> list[str]:
    return ["--tokens", ",".join(str(t % vocab) for t in PROMPT), "--generate", str(N_GEN), "--print-logits"]


def _run(argv, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(list(map(str, argv)), capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def _outputs(stdout: str) -> tuple[str, str]:
    lines = stdout.splitlines()
    return tuple(next(ln for ln in lines if ln.startswith(key)) for key in ("tokens: ", "logits: "))


@pytest.fixture(scope="module")
def asan_out(golden_ckpts, build_model):
    return build_model(golden_ckpts[ASAN_OF], "int8c", "host", "SANITIZE=address,undefined")


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_golden_under_asan_ubsan(case, golden_ckpts, build_model, asan_out):
    ckpt = golden_ckpts[case]
    normal = build_model(ckpt, "int8c")
    spec = open_checkpoint(ckpt).spec
    args = _args(spec.vocab)
    want = _run([normal / "colibri_run", normal / "model.bin", *args])
    assert want.returncode == 0, want.stderr
    runs = {"colibri_run": [asan_out / "colibri_run", normal / "model.bin", *args]}
    if case == ASAN_OF:
        runs["colibri_demo"] = [asan_out / "colibri_demo", *args]
    for how, argv in runs.items():
        got = _run(argv, SAN_ENV)
        assert got.returncode == 0 and not sanitizer_report(got.stderr), f"{how}: exit {got.returncode}\n{got.stderr}"
        assert _outputs(got.stdout) == _outputs(want.stdout), f"{case} {how}: the ASan build computes other bits"
    deq = blob_weights(normal / "model.bin")
    tokens = Reference(spec, deq, max_seq=256).generate([t % spec.vocab for t in PROMPT], N_GEN)
    assert _outputs(want.stdout)[0] == "tokens: " + ",".join(map(str, tokens))


def _valgrind(argv) -> subprocess.CompletedProcess:
    res = _run(["valgrind", "-q", "--error-exitcode=1", "--leak-check=full", "--errors-for-leak-kinds=definite",
                f"--suppressions={TEST_SRC / 'valgrind.supp'}", *argv])
    assert res.returncode == 0, f"valgrind {argv[0]}: exit {res.returncode}\n{res.stderr[-6000:]}"
    assert "==" not in res.stderr, res.stderr[-6000:]  # -q: any line from valgrind is a report
    return res


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed (apt-get install valgrind)")
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the valgrind build is the x86_64 target")
def test_demos_under_valgrind(golden_ckpts, build_model):
    out = build_model(golden_ckpts[ASAN_OF], "int8c", "x86_64")
    args = _args(GOLDEN[ASAN_OF]["vocab"])
    results = [
        _valgrind([out / "colibri_demo", *args]),
        _valgrind([out / "colibri_run", out / "model.bin", *args]),
        _valgrind([out / "colibri_demo_dl", out / f"libcolibri_{out.name}.so", *args]),
    ]
    assert len({_outputs(r.stdout) for r in results}) == 1
    # a refused blob takes the error paths: still nothing for valgrind to report
    bad = out.parent / "truncated.bin"
    bad.write_bytes((out / "model.bin").read_bytes()[:1000])
    res = _run(["valgrind", "-q", f"--suppressions={TEST_SRC / 'valgrind.supp'}", out / "colibri_run", bad])
    assert res.returncode == 3 and "(status 4)" in res.stderr and "==" not in res.stderr, res.stderr
