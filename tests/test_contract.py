"""The runtime's contract, proved by runtime_c/test/contract.c on real exports.

(1) it writes only inside the arena: the arena sits against PROT_NONE guard pages, flush with
each side in turn, and runs forward to max_seq; (2) it never writes the blob: mapped PROT_READ;
(3) two contexts on one blob in two threads give exactly the results of running them one after
the other, under ThreadSanitizer; (4) misuse returns an error code and leaves the context usable.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from cbuild import ASAN, NATIVE, RUNTIME_SRC, SAN_ENV, SEEDS, TEST_SRC, compile_c, sanitizer_report, seed_blobs

SOURCES = [TEST_SRC / "contract.c", *RUNTIME_SRC]
MODELS = sorted(SEEDS) + ["golden_gqa_top2"]


@pytest.fixture(scope="module")
def blobs(tmp_path_factory, golden_ckpts) -> dict:
    """The seed exports (max_seq 3..8, every dtype) and a golden model at its default max_seq 256."""
    from colibri.codegen.export import ExportOptions, export

    base = tmp_path_factory.mktemp("contract")
    out = {p.parent.name: p for p in seed_blobs(base / "seeds")}
    export(golden_ckpts["gqa_top2"], base / "golden", ExportOptions(predict=False))
    out["golden_gqa_top2"] = base / "golden" / "model.bin"
    return out


@pytest.fixture(scope="module")
def contract_asan(tmp_path_factory):
    return compile_c(tmp_path_factory.mktemp("contract-asan") / "contract", SOURCES, ASAN + NATIVE,
                     libs=("-lpthread",))


@pytest.fixture(scope="module")
def contract_tsan(tmp_path_factory):
    return compile_c(tmp_path_factory.mktemp("contract-tsan") / "contract", SOURCES, ["-fsanitize=thread", *NATIVE],
                     libs=("-lpthread",))


def run(exe, cmd: str, blob, aslr_retry: bool = False) -> str:
    argv = [str(exe), cmd, str(blob)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300, env={**os.environ, **SAN_ENV})
    if aslr_retry and "unexpected memory mapping" in res.stderr and shutil.which("setarch"):
        # older ThreadSanitizer runtimes cannot place their shadow under high ASLR entropy
        res = subprocess.run(["setarch", "-R", *argv], capture_output=True, text=True, timeout=300,
                             env={**os.environ, **SAN_ENV})
    assert res.returncode == 0, f"contract {cmd} exit {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    assert not sanitizer_report(res.stderr), res.stderr[-6000:]
    assert f"{cmd}: " in res.stdout and " checks passed" in res.stdout
    return res.stdout


@pytest.mark.parametrize("model", MODELS)
def test_arena_bounds_and_read_only_blob(model, blobs, contract_asan):
    out = run(contract_asan, "guard", blobs[model])
    assert "ok arena placed low" in out and "ok arena placed high" in out
    assert "the read-only blob mapping fault on a write" in out


@pytest.mark.parametrize("model", MODELS)
def test_misuse_returns_codes_and_context_stays_usable(model, blobs, contract_asan):
    out = run(contract_asan, "misuse", blobs[model])
    assert out.count("\nok ") + out.startswith("ok ") == 7, out


@pytest.mark.parametrize("model", ["int8c_gqa", "golden_gqa_top2"])
def test_two_threads_equal_sequential_under_tsan(model, blobs, contract_tsan):
    out = run(contract_tsan, "threads", blobs[model], aslr_retry=True)
    assert "bit-identical to running them in turn" in out
