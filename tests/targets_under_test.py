"""The targets the tests run on, and what each must select, read from targets/*.toml (one place).

A new board file is tested without editing a test: the lists below come from the files, and the
kernels a target's flags must select are its `kernels` table (targets/SCHEMA.md).
"""

from __future__ import annotations

from pathlib import Path

from colibri.toolchain.targets import Target, all_targets, load_target

CPU_FLAGS = frozenset(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else frozenset()
HOST = "host"  # this machine, -march=native


def names(kind: str | None = None, host: bool = True) -> list[str]:
    """Every target of a kind (linux, firmware; None: all), sorted by name; host=False leaves out this machine."""
    return [t.name for t in all_targets() if (kind is None or t.kind == kind) and (host or t.name != HOST)]


def cross() -> list[str]:
    """The Linux targets other than this machine."""
    return names("linux", host=False)


def firmware() -> list[str]:
    """The firmware targets, one per compiler, flags and QEMU command: a board variant that differs from
    another only in its memory map (stm32h7-qspi beside stm32h7) compiles and boots the same code, so the
    kernel and model tests run on the first by name; its memory map has tests of its own
    (tests/test_memory_regions.py)."""
    seen: dict[tuple, str] = {}
    for n in sorted(names("firmware")):
        t = load_target(n)
        seen.setdefault((t.cc, t.cflags, t.linkflags, t.runner), n)
    return sorted(seen.values())


def one_per_arch(targets: list[str]) -> list[str]:
    """The first target (by name: the baseline before its variants, x86_64 before x86_64-v3) of each
    architecture among targets."""
    seen: dict[str, str] = {}
    for n in sorted(targets):
        seen.setdefault(load_target(n).arch, n)
    return list(seen.values())


def expected_kernel(target: str | Target, path: str) -> str:
    """The kernel the runtime must report on target for path ("float": float activations, "int8": the
    integer matmuls), by its file and, for -march=native, this machine's CPU flags."""
    t = load_target(target) if isinstance(target, str) else target
    want = t.expected_kernel(path, CPU_FLAGS)
    assert want, f"targets/{t.name}.toml: kernels.{path} is not declared (targets/SCHEMA.md)"
    return want
