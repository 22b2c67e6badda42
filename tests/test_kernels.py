"""Every SIMD kernel against its scalar twin, built for and run on its own target.

runtime_c/test/kernels_test.c is compiled with each Linux target's compiler and flags
(statically for the cross targets) and run natively or under the target's QEMU; the
riscv64-rvv build runs at three vector lengths, since RVV code must not assume one.
The program compares cb_matvec (the ISA path the target's flags select) with
cb_matvec_scalar on random matrices of every weight type and many shapes; see its header.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from colibri.toolchain.cli import runner_argv
from colibri.toolchain.targets import all_targets, load_target

ROOT = Path(__file__).resolve().parent.parent
SRC = [ROOT / "runtime_c" / p for p in ("test/kernels_test.c", "src/kernels.c", "src/cbmath.c")]
FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-ffp-contract=off", "-fno-math-errno", "-O2", "-g"]
LINUX = [t.name for t in all_targets() if t.kind == "linux"]
# the ISA path each target's flags must select ("avx512" or "avx2" for host, by this CPU)
EXPECT = {"x86_64-v3": "avx2", "x86_64": "scalar", "rpi4": "neon", "rpi5": "neon", "rpi-armv7": "neon",
          "riscv64-rvv": "rvv", "riscv64": "scalar"}
RVV_VLEN = (128, 256, 512)


def _build(target: str, out: Path, *extra: str) -> Path:
    t = load_target(target)
    missing = t.missing(run=True)
    if missing:
        pytest.skip(f"{target}: {', '.join(missing)} not installed ({t.install_hint()})")
    if t.cpu_missing():
        pytest.skip(f"{target}: this CPU lacks {', '.join(t.cpu_missing())}")
    exe = out / f"kernels_test-{target}"
    static = ["-static"] if t.runner else []
    subprocess.run([*t.cc_argv, *FLAGS, *t.cflags, *extra, *map(str, SRC), "-o", str(exe), *static, "-lm"],
                   check=True, capture_output=True, text=True)
    return exe


def _run(argv: list[str]) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{' '.join(argv)}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res.stdout.strip()


@pytest.mark.parametrize("target", LINUX)
def test_simd_matches_scalar(target, tmp_path):
    exe = _build(target, tmp_path)
    argvs = [runner_argv(target, str(exe))]
    if target == "riscv64-rvv":  # the target's runner fixes vlen=128; RVV code must not assume it
        argvs = [[a if not a.startswith("rv64,") else f"rv64,v=true,vlen={v}" for a in argvs[0]] for v in RVV_VLEN]
    for argv in argvs:
        line = _run(argv)
        isa = line.split()[1].rstrip(":")
        assert isa == EXPECT.get(target, isa) and (target != "host" or isa != "scalar"), line
        assert "cases" in line


def test_forced_scalar_is_scalar(tmp_path):
    exe = _build("host", tmp_path, "-DCOLIBRI_SCALAR")
    assert _run([str(exe)]).startswith("kernels_test scalar:")


def test_simd_reads_nothing_beyond_its_rows(tmp_path):
    """With ASan the matrices and vectors are exact-size heap blocks: an over-read traps."""
    exe = _build("host", tmp_path, "-fsanitize=address,undefined", "-fno-sanitize-recover=all")
    _run([str(exe)])
