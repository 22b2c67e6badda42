"""The Linux demos decode from a copy of the weights in transparent huge pages (runtime_c/demo/demo_common.h,
demo_hugepage_copy): a model of 2 MiB or more is copied into a 2 MiB-aligned anonymous mapping advised
MADV_HUGEPAGE before its first touch and made read-only; --no-hugepages keeps the weights where they lie. Either
way the same ids and logits, bit for bit. The system calls are read with strace, which sees what the program
asks of the kernel whatever the kernel then grants."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import synth

HUGE = 2 << 20
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# over 2 MiB of int8c weights (an embedding and an lm_head of 4096 x 256 alone are 2 MiB)
SHAPE = dict(layers=2, hidden=256, ffn=256, heads=4, kv_heads=2, experts=4, top_k=2, vocab=4096, seed=5,
             dtype="f32")
ARGS = ["--tokens", "3,17,42,7", "--generate", "6", "--print-logits"]


@pytest.fixture(scope="module")
def big(tmp_path_factory, build_model) -> Path:
    out = build_model(synth(tmp_path_factory.mktemp("thp") / "thp_model", **SHAPE), "int8c",
                      only=("colibri_demo", "colibri_run", "model.bin"))
    assert (out / "model.bin").stat().st_size > HUGE
    return out


def _thp_on() -> bool:
    return THP.exists() and ("[always]" in THP.read_text() or "[madvise]" in THP.read_text())


def _run(argv: list[str]) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return "\n".join(ln for ln in res.stdout.splitlines() if "tok/s" not in ln)


def _programs(out: Path) -> dict[str, list[str]]:
    return {"colibri_demo": [str(out / "colibri_demo")],
            "colibri_run": [str(out / "colibri_run"), str(out / "model.bin")]}


@pytest.mark.parametrize("program", ["colibri_demo", "colibri_run"])
def test_same_bits_with_and_without_the_copy(big, program):
    argv = _programs(big)[program] + ARGS
    with_copy, without = _run(argv), _run(argv + ["--no-hugepages"])
    assert "logits: " in with_copy and with_copy == without


def _madvise_hugepage(argv: list[str], tmp_path: Path) -> list[tuple[int, int]]:
    """(address, length) of every madvise(MADV_HUGEPAGE) the program made."""
    log = tmp_path / "strace.log"
    res = subprocess.run(["strace", "-f", "-e", "trace=madvise,mprotect", "-o", str(log), *argv],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    text = log.read_text()
    return [(int(a, 16), int(n)) for a, n in re.findall(r"madvise\((0x[0-9a-f]+), (\d+), MADV_HUGEPAGE\)", text)]


@pytest.mark.parametrize("program", ["colibri_demo", "colibri_run"])
def test_the_weights_are_copied_into_huge_pages(big, program, tmp_path):
    if not shutil.which("strace"):
        pytest.fail("strace is not installed (toolchain/host-packages.txt)")
    argv = _programs(big)[program] + ARGS
    blob = (big / "model.bin").stat().st_size
    advised = _madvise_hugepage(argv, tmp_path)
    if not _thp_on():  # THP off or absent: no copy, the weights stay where they lie
        assert advised == []
        return
    assert len(advised) == 1, advised
    addr, length = advised[0]
    assert addr % HUGE == 0 and length % HUGE == 0 and blob <= length < blob + HUGE
    assert _madvise_hugepage(argv + ["--no-hugepages"], tmp_path) == []


def test_a_file_that_is_no_model_is_not_copied(big, tmp_path):
    """colibri_run checks the blob before it copies it: 3 MiB of zeros are refused (exit 3, colibri's bad-magic
    error) without a 3 MiB copy."""
    if not shutil.which("strace"):
        pytest.fail("strace is not installed (toolchain/host-packages.txt)")
    junk = tmp_path / "zeros.bin"
    junk.write_bytes(bytes(3 << 20))
    log = tmp_path / "strace.log"
    res = subprocess.run(["strace", "-f", "-e", "trace=madvise", "-o", str(log), str(big / "colibri_run"),
                          str(junk), *ARGS], capture_output=True, text=True, timeout=120)
    assert res.returncode == 3 and "magic" in res.stderr.lower() and "tokens:" not in res.stdout, res.stderr
    assert "MADV_HUGEPAGE" not in log.read_text()
