"""Every SIMD kernel against its scalar twin, built for and run on its own target.

runtime_c/test/kernels_test.c is compiled with each Linux target's compiler and flags
(statically for the cross targets) and run natively or under the target's QEMU; the
riscv64-rvv build runs at three vector lengths, since RVV code must not assume one.
The program compares cb_matvec (the ISA path the target's flags select) with
cb_matvec_scalar on random matrices of every weight type and many shapes; see its header.
runtime_c/test/kernels_q8_test.c does the same for the integer matmuls (bit for bit, both layouts,
and against their definition).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from colibri.toolchain.cli import runner_argv
from colibri.toolchain.csources import FLOAT_CFLAGS, KERNEL_SRC, OPT_CFLAGS, WARN_CFLAGS, runtime_sources
from colibri.toolchain.targets import load_target

from targets_under_test import expected_kernel, names

ROOT = Path(__file__).resolve().parent.parent
KERNELS = runtime_sources(KERNEL_SRC)
PROGRAMS = {"kernels_test": ROOT / "runtime_c/test/kernels_test.c",
            "kernels_q8_test": ROOT / "runtime_c/test/kernels_q8_test.c"}
FLAGS = [*WARN_CFLAGS, *FLOAT_CFLAGS, OPT_CFLAGS["linux"], "-g"]
LINUX = names("linux")
# the ISA path each target's flags must select: its file's kernels.float and kernels.int8 (targets/SCHEMA.md)
RVV_VLEN = (128, 256, 512)


def _build(target: str, out: Path, *extra: str, program: str = "kernels_test") -> Path:
    t = load_target(target)
    missing = t.missing(run=True)
    if missing:
        pytest.skip(f"{target}: {', '.join(missing)} not installed ({t.install_hint()})")
    if t.cpu_missing():
        pytest.skip(f"{target}: this CPU lacks {', '.join(t.cpu_missing())}")
    exe = out / f"{program}-{target}"
    static = ["-static"] if t.runner else []
    src = [PROGRAMS[program], *KERNELS]
    subprocess.run([*t.cc_argv, *FLAGS, *t.cflags, *extra, *map(str, src), "-o", str(exe), *static, "-lm"],
                   check=True, capture_output=True, text=True)
    return exe


def _run(argv: list[str]) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{' '.join(argv)}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res.stdout.strip()


def _run_all_vlens(target: str, exe: Path) -> list[str]:
    argvs = [runner_argv(target, str(exe))]
    if target == "riscv64-rvv":  # the target's runner fixes vlen=128; RVV code must not assume it
        argvs = [[a if not a.startswith("rv64,") else f"rv64,v=true,vlen={v}" for a in argvs[0]] for v in RVV_VLEN]
    return [_run(argv) for argv in argvs]


@pytest.mark.parametrize("target", LINUX)
def test_simd_matches_scalar(target, tmp_path):
    for line in _run_all_vlens(target, _build(target, tmp_path)):
        isa = line.split()[1].rstrip(":")
        assert isa == expected_kernel(target, "float"), line
        assert "cases" in line


@pytest.mark.parametrize("target", LINUX)
def test_integer_kernels_match_scalar(target, tmp_path):
    for line in _run_all_vlens(target, _build(target, tmp_path, program="kernels_q8_test")):
        isa = line.split()[1].rstrip(":")
        assert line.startswith("kernels_q8_test ") and isa == expected_kernel(target, "int8"), line
        assert int(line.split()[2]) > 200, line


def test_forced_scalar_is_scalar(tmp_path):
    exe = _build("host", tmp_path, "-DCOLIBRI_SCALAR")
    assert _run([str(exe)]).startswith("kernels_test scalar:")
    exe = _build("host", tmp_path, "-DCOLIBRI_SCALAR", program="kernels_q8_test")
    assert _run([str(exe)]).startswith("kernels_q8_test scalar:")


def test_simd_reads_nothing_beyond_its_rows(tmp_path):
    """With ASan the matrices and vectors are exact-size heap blocks: an over-read traps."""
    for program in PROGRAMS:
        exe = _build("host", tmp_path, "-fsanitize=address,undefined", "-fno-sanitize-recover=all", program=program)
        _run([str(exe)])
