"""The integer matmul kernels on the microcontrollers themselves: runtime_c/test/kernels_q8_test.c as a
bare-metal image, booted under each firmware target's QEMU.

The program (built with -DCB_TEST_BARE_METAL: a static pool instead of the heap, the semihosting
console instead of stdio, the row-major weights one byte off alignment) is compiled with the
target's compiler and flags as a firmware build compiles the runtime (-Os, the stack-usage call
graphs), together with kernels.c, kernels_q8.c and cbmath.c and the firmware examples' own startup
code (firmware_examples/common without main.c, plus the family's startup files). It is linked by
toolchain/firmware.py - the linker script from firmware_examples/firmware.ld.j2 for the target's
QEMU memory map, the link command and the stack bound of a model image - and booted the way
`colibri run` boots firmware (firmware.qemu_argv: -icount, semihosting). It must name the ISA path
the target's flags select (MVE on cortex-m55, the DSP extension on stm32h7, scalar on rv32imac),
check its > 200 cases (ISA path against the scalar kernel bit for bit, both layouts, the definition)
and exit 0.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from colibri.toolchain import firmware

from conftest import ROOT, require_target

SRC = ROOT / "runtime_c" / "src"
PROGRAM = ROOT / "runtime_c" / "test" / "kernels_q8_test.c"
KERNELS = [SRC / p for p in ("kernels.c", "kernels_q8.c", "cbmath.c")]
# A firmware build's compile flags (toolchain/sconsbuild.py COMMON_CFLAGS with -Os for -O2, plus the
# .su/.ci files firmware.stack_bound reads), then the target's own.
FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-ffp-contract=off", "-fno-math-errno", "-Os",
         "-g", "-ffunction-sections", "-fdata-sections", "-fstack-usage", "-fcallgraph-info=su"]
# the integer path each microcontroller's flags must select (kernels_q8.c's #include chain)
EXPECT_Q8 = {"cortex-m55": "mve", "stm32h7": "dsp", "rv32imac": "scalar"}
LINE = re.compile(r"kernels_q8_test (\S+): (\d+) cases, (\d+) outputs")


def _build(target: str, out: Path, *defines: str) -> Path:
    """kernels_q8_test-<target>.elf in out: the image for the target's QEMU memory map."""
    t = require_target(target)
    fw = firmware.firmware_spec(t)
    out.mkdir(parents=True, exist_ok=True)
    common = firmware.FW_DIR / "common"  # board.h
    app = [firmware.FW_DIR / s for s in firmware.COMMON_SRC if s != "common/main.c"]  # the test has the main
    board = [firmware.FW_DIR / s for s in firmware.FAMILIES[fw.family]["sources"]]
    objs = []
    for src in [PROGRAM, *KERNELS, *app, *board]:
        obj = out / f"{src.stem}.o"
        extra = [f"-I{common}"] + (["-DCB_TEST_BARE_METAL"] if src == PROGRAM else [])
        if src.suffix == ".S":
            argv = [*t.cc_argv, *t.cflags, "-g", "-c", str(src), "-o", str(obj)]
        else:
            argv = [*t.cc_argv, *FLAGS, *t.cflags, *extra, *defines, "-c", str(src), "-o", str(obj)]
        res = subprocess.run(argv, capture_output=True, text=True, cwd=out)
        assert res.returncode == 0, f"{' '.join(argv)}:\n{res.stdout}{res.stderr}"
        objs.append(obj)
    variant = fw.qemu_variant
    ld = out / "kernels_q8_test.ld"
    ld.write_text(firmware.render_linker_script(fw, variant))
    cfg = firmware.link_config(fw, "kernels_q8_test", variant)
    # A test image is booted, not shipped: link and bound its stack as a model image's QEMU variant,
    # without the budget audit of a model's part image (which wants the weights and the arena in it).
    cfg["variant"] = "qemu"
    elf = out / f"kernels_q8_test-{target}.elf"
    try:
        firmware.link_image(cfg, [elf, elf.with_suffix(".map")], objs + [ld])
    except firmware.FirmwareError as e:
        pytest.fail(f"{target}: kernels_q8_test {e}")
    return elf


def _boot(target: str, elf: Path) -> subprocess.CompletedProcess:
    argv = firmware.qemu_argv(require_target(target), str(elf))
    return subprocess.run(argv, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("target", list(EXPECT_Q8))
def test_integer_kernels_on_the_microcontroller(target, tmp_path):
    res = _boot(target, _build(target, tmp_path))
    assert res.returncode == 0, f"{target}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    lines = res.stdout.splitlines()
    assert len(lines) == 1, f"{target}: unexpected output\n{res.stdout}\n{res.stderr}"
    m = LINE.fullmatch(lines[0])
    assert m, lines[0]
    assert m.group(1) == EXPECT_Q8[target], lines[0]
    assert int(m.group(2)) > 200 and int(m.group(3)) > 0, lines[0]


def test_forced_scalar_on_the_microcontroller(tmp_path):
    """KERNELS=scalar (-DCOLIBRI_SCALAR) on an MVE part: the scalar kernel, same cases."""
    res = _boot("cortex-m55", _build("cortex-m55", tmp_path, "-DCOLIBRI_SCALAR"))
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    m = LINE.fullmatch(res.stdout.strip())
    assert m and m.group(1) == "scalar" and int(m.group(2)) > 200, res.stdout
