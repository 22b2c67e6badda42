"""Every SIMD kernel against its scalar twin, built for and run on its own target.

runtime_c/test/kernels_test.c is compiled with each Linux target's compiler and flags
(statically for the cross targets) and run natively or under the target's QEMU; the
riscv64-rvv build runs at three vector lengths, since RVV code must not assume one (kernels_test's
case list in full at the first, its `quick` subset at the others).
The program compares cb_matvec (the ISA path the target's flags select) with
cb_matvec_scalar on random matrices of every weight type and many shapes; see its header.
runtime_c/test/kernels_q8_test.c does the same for the integer matmuls (bit for bit, both layouts,
and against their definition); runtime_c/test/kernels_q4_test.c for the int4 matmuls (bit for bit against
cb_matmul_q4_scalar, widths that are and are not multiples of the block, 1..7 tokens, the definition);
runtime_c/test/kernels_q16_test.c for the int16 matmuls (bit for bit against cb_matmul_q16_scalar, sums at the
int32 limit the format allows, 1..7 tokens, split rows, the definition within rounding, the row lookup);
runtime_c/test/crc_test.c for cb_crc32, the blob's check at load (Arm's CRC32 instructions where the target
has them, else tables), against zlib.crc32.
"""

from __future__ import annotations

import subprocess
import zlib
from pathlib import Path

import pytest

from colibri.toolchain.cli import runner_argv
from colibri.toolchain.csources import FLOAT_CFLAGS, KERNEL_SRC, OPT_CFLAGS, WARN_CFLAGS, runtime_sources
from colibri.toolchain.targets import load_target

from cbuild import ASAN, sanitizer_report
from targets_under_test import expected_kernel, names

ROOT = Path(__file__).resolve().parent.parent
KERNELS = runtime_sources(KERNEL_SRC)
PROGRAMS = {"kernels_test": ROOT / "runtime_c/test/kernels_test.c",
            "kernels_q8_test": ROOT / "runtime_c/test/kernels_q8_test.c",
            "kernels_q4_test": ROOT / "runtime_c/test/kernels_q4_test.c",
            "kernels_q16_test": ROOT / "runtime_c/test/kernels_q16_test.c",
            "crc_test": ROOT / "runtime_c/test/crc_test.c"}
FLAGS = [*WARN_CFLAGS, *FLOAT_CFLAGS, OPT_CFLAGS["linux"], "-g"]
LINUX = names("linux")
# the ISA path each target's flags must select: its file's kernels.float and kernels.int8 (targets/SCHEMA.md)
RVV_VLEN = (128, 256, 512)
# the int4 block dot each integer path comes with (arch/select.h CB_ISA_Q4_NAME): VPDPBUSD on an AVX-512 VNNI
# build (host, only where this CPU has it), PMADDUBSW on every other x86 build with AVX2, SDOT on Armv8.6
INT4_OF_INT8 = {"avx512vnni": "avx512vnni", "avx2": "avx2", "neon-i8mm": "neon-dotprod", "neon-dotprod": "neon-dotprod",
                "neon": "neon", "rvv": "rvv", "mve": "mve", "dsp": "dsp", "scalar": "scalar"}
# the int16 block dots (arch/select.h CB_ISA_Q16_NAME): PMADDWD wherever AVX2 is, SMLAL on every NEON build, else
# the scalar ones
INT16_OF_INT8 = {"avx512vnni": "avx2", "avx2": "avx2", "neon-i8mm": "neon", "neon-dotprod": "neon", "neon": "neon",
                 "rvv": "scalar", "mve": "scalar", "dsp": "scalar", "scalar": "scalar"}


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


def _run_all_vlens(target: str, exe: Path, quick: tuple[str, ...] = ()) -> list[str]:
    """The program's lines: one run, or on riscv64-rvv one per vector length, the later ones with the
    arguments `quick` (kernels_test: the column counts, groups and weight types in full, fewer row counts;
    the rows are blocked in the shared C code, the columns split into vectors by VLEN)."""
    argvs = [runner_argv(target, str(exe))]
    if target == "riscv64-rvv":  # the target's runner fixes vlen=128; RVV code must not assume it
        argvs = [[a if not a.startswith("rv64,") else f"rv64,v=true,vlen={v}" for a in argvs[0]]
                 + (list(quick) if i else []) for i, v in enumerate(RVV_VLEN)]
    return [_run(argv) for argv in argvs]


@pytest.mark.parametrize("target", LINUX)
def test_simd_matches_scalar(target, tmp_path):
    for line in _run_all_vlens(target, _build(target, tmp_path), quick=("quick",)):
        isa = line.split()[1].rstrip(":")
        assert isa == expected_kernel(target, "float"), line
        assert int(line.split()[2]) > 1000, line


def _sw_prefetch(isa: str) -> str:
    """How far ahead the int8 tiles must prefetch in software here (arch/x86/q8.h cb_q8_sw_prefetch_isa), read
    from /proc/cpuinfo rather than CPUID: only the x86 tile kernels prefetch; on an AMD family 19h core not at all
    on a Zen 4 (models 10h-1Fh, 60h-7Fh, A0h-AFh) and 1 KiB ahead on the others (Zen 3); elsewhere 8 KiB."""
    if isa not in ("avx2", "avx512vnni"):
        return "off"
    first_cpu = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    info = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first_cpu.splitlines())}
    if info.get("vendor_id") != "AuthenticAMD" or info.get("cpu family") != "25":
        return "8 KiB"
    model = int(info["model"])
    zen4 = 0x10 <= model <= 0x1F or 0x60 <= model <= 0x7F or 0xA0 <= model <= 0xAF
    return "off" if zen4 else "1 KiB"


@pytest.mark.parametrize("target", LINUX)
def test_integer_kernels_match_scalar(target, tmp_path):
    for line in _run_all_vlens(target, _build(target, tmp_path, program="kernels_q8_test")):
        isa = line.split()[1].rstrip(":")
        assert line.startswith("kernels_q8_test ") and isa == expected_kernel(target, "int8"), line
        assert int(line.split()[2]) > 200, line
        assert line.endswith(f"software prefetch {_sw_prefetch(isa)}"), line


@pytest.mark.parametrize("target", LINUX)
def test_int4_kernels_match_scalar(target, tmp_path):
    for line in _run_all_vlens(target, _build(target, tmp_path, program="kernels_q4_test")):
        isa = line.split()[1].rstrip(":")
        assert line.startswith("kernels_q4_test ") and isa == INT4_OF_INT8[expected_kernel(target, "int8")], line
        assert int(line.split()[2]) >= 160 and int(line.split()[4]) > 10000, line


@pytest.mark.parametrize("target", LINUX)
def test_int16_kernels_match_scalar(target, tmp_path):
    for line in _run_all_vlens(target, _build(target, tmp_path, program="kernels_q16_test")):
        isa = line.split()[1].rstrip(":")
        assert line.startswith("kernels_q16_test ") and isa == INT16_OF_INT8[expected_kernel(target, "int8")], line
        assert int(line.split()[2]) == 64 and int(line.split()[4]) > 10000, line


@pytest.mark.parametrize("target", ["host", "x86_64-v3"])
@pytest.mark.parametrize("program", ["kernels_q8_test", "kernels_q4_test"])
def test_integer_kernels_under_asan(target, program, tmp_path):
    """Each matrix its own exact-size heap block: an ISA path reading or writing past its rows (a decode
    buffer's last group, a tile's padding) is a sanitizer report, not a silent over-read."""
    exe = _build(target, tmp_path, *ASAN, program=program)
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and not sanitizer_report(res.stderr), f"{res.stdout}\n{res.stderr[-3000:]}"
    assert res.stdout.startswith(f"{program} avx"), res.stdout


def test_forced_scalar_is_scalar(tmp_path):
    exe = _build("host", tmp_path, "-DCOLIBRI_SCALAR")  # the ISA's name is the point: scalar against itself
    assert _run([str(exe), "quick"]).startswith("kernels_test scalar:")
    exe = _build("host", tmp_path, "-DCOLIBRI_SCALAR", program="kernels_q8_test")
    assert _run([str(exe)]).startswith("kernels_q8_test scalar:")
    exe = _build("host", tmp_path, "-DCOLIBRI_SCALAR", program="kernels_q4_test")
    assert _run([str(exe)]).startswith("kernels_q4_test scalar:")
    exe = _build("host", tmp_path, "-DCOLIBRI_SCALAR", program="kernels_q16_test")
    assert _run([str(exe)]).startswith("kernels_q16_test scalar:")


def test_simd_reads_nothing_beyond_its_rows(tmp_path):
    """With ASan the matrices and vectors are exact-size heap blocks: an over-read traps."""
    for program in PROGRAMS:
        exe = _build("host", tmp_path, "-fsanitize=address,undefined", "-fno-sanitize-recover=all", program=program)
        _run([str(exe)])


def _xorshift_bytes(n: int) -> bytes:
    """crc_test.c's buffer: xorshift32 from 2463534242, each step's low byte."""
    x, out = 2463534242, bytearray(n)
    for i in range(n):
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        out[i] = x & 0xFF
    return bytes(out)


@pytest.mark.parametrize("target", LINUX)
def test_crc32_matches_zlib(target, tmp_path):
    lines = _run(runner_argv(target, str(_build(target, tmp_path, program="crc_test")))).splitlines()
    buf = _xorshift_bytes((1 << 20) + 8)
    assert len(lines) == 8 * 81 + 5 * 3 + 1
    for line in lines:
        if line.startswith("chain "):
            _, split, got = line.split()
            assert int(got, 16) == zlib.crc32(buf[: 1 << 20]), (target, line)
            continue
        off, length, got = line.split()
        want = zlib.crc32(buf[int(off): int(off) + int(length)])
        assert int(got, 16) == want, (target, line, f"{want:08x}")
