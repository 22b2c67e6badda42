"""Targets are data: one TOML file per board under targets/."""

from __future__ import annotations

import os
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS_DIR = Path(os.environ.get("COLIBRI_TARGETS_DIR") or ROOT / "targets")


class TargetError(Exception):
    """A target that does not exist, does not parse, or cannot be built here."""


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    kind: str  # "linux" | "firmware"
    arch: str
    cc: str  # compiler command, possibly with arguments ("clang-19 --target=...")
    cflags: tuple[str, ...] = ()
    linkflags: tuple[str, ...] = ()
    runner: tuple[str, ...] = ()  # prefix that runs a built program; empty: native
    sysroot: str = ""  # where the runner finds the target's shared libraries (qemu -L)
    tools_prefix: str = ""  # binutils prefix when cc does not imply it (clang)
    packages: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def layout(self) -> str:
        """How the exporter orders int8 matrices for this target's kernels (codegen/layout.py): 16-row
        tiles for the SIMD paths of Linux targets, rows for microcontrollers (MVE, DSP, scalar)."""
        return str(self.extra.get("layout", "tiled16" if self.kind == "linux" else "rows"))

    @property
    def cc_argv(self) -> list[str]:
        return self.cc.split()

    def tool(self, name: str) -> str:
        """A binutils tool of this target's toolchain (ar, objcopy, ...)."""
        if self.tools_prefix:
            return self.tools_prefix + name
        exe = self.cc_argv[0]
        return exe[: -len("gcc")] + name if exe.endswith("gcc") else name

    def missing(self, run: bool = False) -> list[str]:
        """Programs this target needs that are not installed here (to build; with run, to run)."""
        progs = [self.cc_argv[0]] + ([self.tools_prefix + "ar"] if self.tools_prefix else [])
        progs += [self.runner[0]] if run and self.runner else []
        return [p for p in progs if shutil.which(p) is None]

    def cpu_missing(self) -> list[str]:
        """CPU features this target needs that the build machine lacks (native targets only)."""
        need = self.extra.get("cpu_flags", [])
        try:
            flags = set(Path("/proc/cpuinfo").read_text().split())
        except OSError:
            return list(need)
        return [f for f in need if f not in flags]

    def install_hint(self) -> str:
        return f"apt-get install {' '.join(self.packages)}" if self.packages else "(no package listed)"


def load_target(name: str, targets_dir: Path = TARGETS_DIR) -> Target:
    path = targets_dir / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in targets_dir.glob("*.toml")))
        raise TargetError(f"{path}: no such target {name!r} (known: {known})")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise TargetError(f"{path}: {e}") from None
    known_keys = {"description", "kind", "arch", "cc", "cflags", "linkflags", "runner", "sysroot", "tools_prefix",
                  "packages"}
    for key in ("description", "kind", "arch", "cc"):
        if key not in data:
            raise TargetError(f"{path}: missing key {key!r}")
    return Target(
        name=name,
        description=data["description"],
        kind=data["kind"],
        arch=data["arch"],
        cc=data["cc"],
        cflags=tuple(data.get("cflags", ())),
        linkflags=tuple(data.get("linkflags", ())),
        runner=tuple(data.get("runner", ())),
        sysroot=data.get("sysroot", ""),
        tools_prefix=data.get("tools_prefix", ""),
        packages=tuple(data.get("packages", ())),
        extra={k: v for k, v in data.items() if k not in known_keys},
    )


def all_targets(targets_dir: Path = TARGETS_DIR) -> list[Target]:
    return [load_target(p.stem, targets_dir) for p in sorted(targets_dir.glob("*.toml"))]
