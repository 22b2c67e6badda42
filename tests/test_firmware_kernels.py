"""The matmul kernels on the microcontrollers themselves: runtime_c/test/kernels_q8_test.c (integer
matmuls) and runtime_c/test/kernels_test.c (float activations: f32, f16, int8, int8c weights) as
bare-metal images, booted under each firmware target's QEMU.

Each program (built with -DCB_TEST_BARE_METAL: a static pool instead of the heap, the semihosting
console instead of stdio, the weights only as aligned as their type requires) is compiled with the
target's compiler and flags as a firmware build compiles the runtime (-Os, the stack-usage call
graphs), together with kernels.c, kernels_q8.c and cbmath.c and the firmware examples' own startup
code (firmware_examples/common without main.c, plus the family's startup files). It is linked by
toolchain/firmware.py - the linker script from firmware_examples/firmware.ld.j2 for the target's
QEMU memory map, the link command and the stack bound of a model image - and booted the way
`colibri run` boots firmware (firmware.qemu_argv: -icount, semihosting). It must name the ISA path
the target's flags select (its file's `kernels`: targets/SCHEMA.md) and exit 0 after its cases:
  - kernels_q8_test (kernels.int8: e.g. MVE on cortex-m55, the DSP extension on stm32h7 and cortex-m4,
    scalar on rv32imac); > 200 cases (ISA path against the scalar kernel bit for bit, both layouts, the
    definition);
  - kernels_test (kernels.float: MVE on cortex-m55, scalar where the part has no float SIMD);
    > 6000 cases (every weight kind, sizes that are and are not multiples of the vector width:
    within the tolerance of the scalar kernel, bit-equal for one-hot x, cb_matmul over several
    tokens and a split row range bit-equal to cb_matvec per token); where the path is scalar both
    sides are the same code, so its max rel err must be 0.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from colibri.toolchain import firmware
from colibri.toolchain.csources import FLOAT_CFLAGS, KERNEL_SRC, OPT_CFLAGS, WARN_CFLAGS, runtime_sources

from conftest import ROOT, require_target
from targets_under_test import expected_kernel
from targets_under_test import firmware as firmware_targets

SRC = ROOT / "runtime_c" / "src"
PROGRAMS = {p: ROOT / "runtime_c" / "test" / f"{p}.c" for p in ("kernels_q8_test", "kernels_test", "kernels_q4_test")}
KERNELS = runtime_sources(KERNEL_SRC)
# A firmware build's compile flags (toolchain/csources.py's, with -Os for -O2, plus the
# .su/.ci files firmware.stack_bound reads), then the target's own.
FLAGS = [*WARN_CFLAGS, *FLOAT_CFLAGS, OPT_CFLAGS["firmware"], "-g", "-ffunction-sections", "-fdata-sections",
         "-fstack-usage", "-fcallgraph-info=su"]
# the paths each microcontroller's flags must select: its file's kernels.int8 (kernels_q8.c's #include
# chain) and kernels.float (kernels.c's), targets/SCHEMA.md
FW_TARGETS = firmware_targets()
LINE = re.compile(r"kernels_q8_test (\S+): (\d+) cases, (\d+) outputs, software prefetch off")  # no tiles: none
LINE_Q4 = re.compile(r"kernels_q4_test (\S+): (\d+) cases, (\d+) outputs")
LINE_F = re.compile(r"kernels_test (\S+): (\d+) cases, (\d+) outputs, max rel err (\d+)e-9")
MIN_CASES_F = 6000  # the bare-metal case list: 6034 (all five weight kinds, 7 row and 22 column counts, 9 groups)


def _build(target: str, out: Path, *defines: str, program: str = "kernels_q8_test") -> Path:
    """<program>-<target>.elf in out: the image for the target's QEMU memory map."""
    t = require_target(target)
    fw = firmware.firmware_spec(t)
    out.mkdir(parents=True, exist_ok=True)
    common = firmware.FW_DIR / "common"  # board.h
    app = [firmware.FW_DIR / s for s in firmware.COMMON_SRC if s != "common/main.c"]  # the test has the main
    board = [firmware.FW_DIR / s for s in firmware.FAMILIES[fw.family]["sources"]]
    objs = []
    main = PROGRAMS[program]
    for src in [main, *KERNELS, *app, *board]:
        obj = out / f"{src.stem}.o"
        extra = [f"-I{common}"] + (["-DCB_TEST_BARE_METAL"] if src == main else [])
        if src.suffix == ".S":
            argv = [*t.cc_argv, *t.cflags, "-g", "-c", str(src), "-o", str(obj)]
        else:
            argv = [*t.cc_argv, *FLAGS, *t.cflags, *t.cpp_defines(), *extra, *defines, "-c", str(src), "-o", str(obj)]
        res = subprocess.run(argv, capture_output=True, text=True, cwd=out)
        assert res.returncode == 0, f"{' '.join(argv)}:\n{res.stdout}{res.stderr}"
        objs.append(obj)
    variant = fw.qemu_variant
    ld = out / f"{program}.ld"
    ld.write_text(firmware.render_linker_script(fw, variant))
    cfg = firmware.link_config(fw, program, variant)
    # A test image is booted, not shipped: link and bound its stack as a model image's QEMU variant,
    # without the budget audit of a model's part image (which wants the weights and the arena in it).
    cfg["variant"] = "qemu"
    elf = out / f"{program}-{target}.elf"
    try:
        firmware.link_image(cfg, [elf, elf.with_suffix(".map")], objs + [ld])
    except firmware.FirmwareError as e:
        pytest.fail(f"{target}: {program} {e}")
    return elf


def _boot(target: str, elf: Path) -> subprocess.CompletedProcess:
    argv = firmware.qemu_argv(require_target(target), str(elf))
    return subprocess.run(argv, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("target", FW_TARGETS)
def test_integer_kernels_on_the_microcontroller(target, tmp_path):
    res = _boot(target, _build(target, tmp_path))
    assert res.returncode == 0, f"{target}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    lines = res.stdout.splitlines()
    assert len(lines) == 1, f"{target}: unexpected output\n{res.stdout}\n{res.stderr}"
    m = LINE.fullmatch(lines[0])
    assert m, lines[0]
    assert m.group(1) == expected_kernel(target, "int8"), lines[0]
    assert int(m.group(2)) > 200 and int(m.group(3)) > 0, lines[0]


@pytest.mark.parametrize("target", FW_TARGETS)
def test_int4_kernels_on_the_microcontroller(target, tmp_path):
    """runtime_c/test/kernels_q4_test.c: the int4 block dot of MVE (M55) and the DSP extension (M7), and
    the scalar one on RV32IMAC, against cb_matmul_q4_scalar bit for bit and the definition; each comes
    with the target's integer path (kernels.int8)."""
    res = _boot(target, _build(target, tmp_path, program="kernels_q4_test"))
    assert res.returncode == 0, f"{target}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    m = LINE_Q4.fullmatch(res.stdout.strip())
    assert m, res.stdout
    assert m.group(1) == expected_kernel(target, "int8"), m.group(0)
    assert int(m.group(2)) >= 160 and int(m.group(3)) > 10000, m.group(0)


def test_forced_scalar_on_the_microcontroller(tmp_path):
    """KERNELS=scalar (-DCOLIBRI_SCALAR) on an MVE part: the scalar kernel, same cases."""
    res = _boot("cortex-m55", _build("cortex-m55", tmp_path, "-DCOLIBRI_SCALAR"))
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    m = LINE.fullmatch(res.stdout.strip())
    assert m and m.group(1) == "scalar" and int(m.group(2)) > 200, res.stdout


def _float_line(res: subprocess.CompletedProcess, what: str) -> re.Match:
    assert res.returncode == 0, f"{what}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    m = LINE_F.fullmatch(res.stdout.strip())
    assert m, f"{what}: unexpected output\n{res.stdout}\n{res.stderr}"
    assert int(m.group(2)) > MIN_CASES_F and int(m.group(3)) > 0, m.group(0)
    return m


@pytest.mark.parametrize("target", FW_TARGETS)
def test_float_kernels_on_the_microcontroller(target, tmp_path):
    """cb_matvec/cb_matmul with float activations: MVE on the M55 against the scalar kernel; the scalar
    kernel on the M7 and RV32IMAC (both sides the same code: the bare-metal build and its checks)."""
    m = _float_line(_boot(target, _build(target, tmp_path, program="kernels_test")), target)
    assert m.group(1) == expected_kernel(target, "float"), m.group(0)
    assert m.group(1) != "scalar" or m.group(4) == "0", m.group(0)


def test_float_forced_scalar_on_the_microcontroller(tmp_path):
    """KERNELS=scalar (-DCOLIBRI_SCALAR) on an MVE part: the scalar float kernel, same cases."""
    m = _float_line(_boot("cortex-m55", _build("cortex-m55", tmp_path, "-DCOLIBRI_SCALAR", program="kernels_test")),
                    "cortex-m55 scalar")
    assert m.group(1) == "scalar" and m.group(4) == "0", m.group(0)  # both sides are the scalar code
