"""A fixed seed gives the same ids on every target, bit for bit: runtime_c/test/sample_test.c (the
sampler on fixed logits, ten configurations: greedy, temperature, top-k, top-p, min-p, repetition
penalty, several seeds) built for the host, rpi4 and riscv64 (run under qemu-user) and as a
bare-metal image for stm32h7 (booted under QEMU like the firmware kernel tests). Every target's
output must equal the one the Python transcription of colibri_sample.h's prose computes
(tests/sample_spec.py), so the targets agree with each other and with the documented sequence."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import sample_spec

from colibri.toolchain import firmware
from colibri.toolchain.cli import runner_argv

from conftest import ROOT, require_target

SRC = ROOT / "runtime_c" / "src"
PROGRAM = ROOT / "runtime_c" / "test" / "sample_test.c"
SOURCES = [PROGRAM, SRC / "sample.c", SRC / "cbmath.c"]
FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-ffp-contract=off", "-fno-math-errno", "-O2", "-g",
         f"-I{ROOT / 'runtime_c' / 'include'}", f"-I{SRC}"]
# the program's configurations: temperature, top_k, top_p, min_p, repeat_penalty, seed
CONFIGS = [(0.0, 0, 1.0, 0.0, 1.0, 0), (0.0, 0, 1.0, 0.0, 1.5, 0), (1.0, 0, 1.0, 0.0, 1.0, 0),
           (1.0, 0, 1.0, 0.0, 1.0, 7), (0.8, 40, 1.0, 0.0, 1.0, 7), (1.0, 0, 0.9, 0.0, 1.0, 123456789),
           (0.7, 0, 1.0, 0.05, 1.0, 42), (1.3, 50, 0.95, 0.02, 1.3, 7), (2.5, 3, 1.0, 0.0, 0.8, 99),
           (0.05, 0, 0.5, 0.5, 1.1, 2026)]
V, STEPS, WINDOW = 1000, 48, 16


def _expected() -> str:
    h, base = 12345, np.zeros(V, dtype=np.float32)
    for i in range(V):
        h = (h * 1664525 + 1013904223) & 0xFFFFFFFF
        base[i] = np.float32(((h >> 8) % 4001) - 2000) / np.float32(256.0)
    base[::97] = -np.inf
    lines = []
    for c, (t, k, p, m, r, seed) in enumerate(CONFIGS):
        rng, drawn = sample_spec.Rng(seed), []
        for i in range(STEPS):
            logits = base[(np.arange(V) + 31 * i) % V]
            drawn.append(sample_spec.sample(logits, rng, t, k, p, m, r, drawn[-WINDOW:] if i else []))
        lines.append(f"config {c}: " + ",".join(map(str, drawn)))
    rng = sample_spec.Rng(7)
    lines.append("rand 7: " + " ".join(f"{rng.next():016x}" for _ in range(4)))
    return "\n".join(lines)


@pytest.fixture(scope="module")
def expected() -> str:
    return _expected()


@pytest.mark.parametrize("target", ["host", "rpi4", "riscv64"])
def test_linux_targets_draw_the_specified_ids(target, expected, tmp_path):
    t = require_target(target)
    exe = tmp_path / f"sample_test-{target}"
    static = ["-static"] if t.runner else []
    subprocess.run([*t.cc_argv, *FLAGS, *t.cflags, *map(str, SOURCES), "-o", str(exe), *static, "-lm"],
                   check=True, capture_output=True, text=True)
    res = subprocess.run(runner_argv(target, str(exe)), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == expected


def _firmware_image(target: str, out: Path) -> Path:
    t = require_target(target)
    fw = firmware.firmware_spec(t)
    common = firmware.FW_DIR / "common"
    app = [firmware.FW_DIR / s for s in firmware.COMMON_SRC if s != "common/main.c"]
    board = [firmware.FW_DIR / s for s in firmware.FAMILIES[fw.family]["sources"]]
    flags = [f for f in FLAGS if f != "-O2"] + ["-Os", "-ffunction-sections", "-fdata-sections", "-fstack-usage",
                                               "-fcallgraph-info=su"]
    objs = []
    for src in [*SOURCES, *app, *board]:
        obj = out / f"{src.stem}.o"
        if src.suffix == ".S":
            argv = [*t.cc_argv, *t.cflags, "-g", "-c", str(src), "-o", str(obj)]
        else:
            argv = [*t.cc_argv, *flags, *t.cflags, *t.cpp_defines(), f"-I{common}", "-DCB_TEST_BARE_METAL",
                    "-c", str(src), "-o", str(obj)]
        res = subprocess.run(argv, capture_output=True, text=True, cwd=out)
        assert res.returncode == 0, f"{' '.join(argv)}:\n{res.stdout}{res.stderr}"
        objs.append(obj)
    variant = fw.qemu_variant
    ld = out / "sample_test.ld"
    ld.write_text(firmware.render_linker_script(fw, variant))
    cfg = firmware.link_config(fw, "sample_test", variant)
    cfg["variant"] = "qemu"
    elf = out / f"sample_test-{target}.elf"
    firmware.link_image(cfg, [elf, elf.with_suffix(".map")], objs + [ld])
    return elf


def test_stm32h7_draws_the_specified_ids(expected, tmp_path):
    elf = _firmware_image("stm32h7", tmp_path)
    res = subprocess.run(firmware.qemu_argv(require_target("stm32h7"), str(elf)), capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == expected
