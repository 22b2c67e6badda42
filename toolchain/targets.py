"""Targets are data: one TOML file per board under targets/, checked against toolchain/target_schema.py."""

from __future__ import annotations

import os
import shutil
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .target_schema import SchemaError, missing_for_image, validate

ROOT = Path(__file__).resolve().parent.parent
TARGETS_DIR = Path(os.environ.get("COLIBRI_TARGETS_DIR") or ROOT / "targets")


class TargetError(Exception):
    """A target that does not exist, does not parse, or cannot be built here."""


@dataclass(frozen=True)
class Target:
    """A target file's values, one field per key of target_schema.SCHEMA (defaults filled in)."""

    name: str
    given: frozenset[str]  # the keys the file itself sets
    description: str
    kind: str  # "linux" | "firmware"
    arch: str
    cc: str  # compiler command, possibly with arguments ("clang-19 --target=...")
    tools_prefix: str
    cflags: tuple[str, ...]
    linkflags: tuple[str, ...]
    runner: tuple[str, ...]  # prefix that runs a built program; empty: native
    sysroot: str
    packages: tuple[str, ...]
    cpu_flags: tuple[str, ...]
    weight_layout: str  # "tiled16" | "rows" (codegen/layout.py)
    max_prefill_block: int
    threads: bool
    kernels: dict[str, Any]  # {"float": name or {cpu flags: name}, "int8": ...}
    family: str | None
    stack_bytes: int | None
    qemu_clock_hz: int
    memory: tuple[dict, ...]  # [{name, origin, length, kind}], sizes as integers
    placement: dict[str, str]
    qemu_memory: tuple[dict, ...]
    qemu_placement: dict[str, str]
    budget: dict[str, int]
    partitions: dict[str, dict]  # {"model": {region, origin, length}}

    def cpp_defines(self) -> list[str]:
        """-D flags of what this target declares for the runtime (threads, largest prefill block)."""
        return ([] if self.threads else ["-DCOLIBRI_NO_PARALLEL"]) + [
            f"-DCOLIBRI_MAX_PREFILL_BLOCK={self.max_prefill_block}"]

    def expected_kernel(self, path: str, cpu_flags: set[str] | frozenset[str] = frozenset()) -> str | None:
        """The kernel the runtime must report for `path` ("float" or "int8") on this target; None if the
        file does not say. A table maps space-separated CPU flags to names (-march=native): the first entry
        whose flags are all in cpu_flags, else "scalar"."""
        want = self.kernels.get(path)
        if want is None or isinstance(want, str):
            return want
        return next((name for flags, name in want.items() if set(flags.split()) <= set(cpu_flags)), "scalar")

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

    def missing_for_image(self) -> list[str]:
        """Keys a firmware image needs that this file does not give (target_schema IMAGE)."""
        return missing_for_image(self.given) if self.kind == "firmware" else []

    def cpu_missing(self) -> list[str]:
        """CPU features this target needs that the build machine lacks (native targets only)."""
        try:
            flags = set(Path("/proc/cpuinfo").read_text().split())
        except OSError:
            return list(self.cpu_flags)
        return [f for f in self.cpu_flags if f not in flags]

    def install_hint(self) -> str:
        return f"apt-get install {' '.join(self.packages)}" if self.packages else "(no package listed)"


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def load_target(name: str, targets_dir: Path = TARGETS_DIR) -> Target:
    path = targets_dir / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in targets_dir.glob("*.toml")))
        raise TargetError(f"{path}: no such target {name!r} (known: {known})")
    return parse_target(path)


def parse_target(path: Path) -> Target:
    """One target file, validated against the schema; TargetError (one line naming the file) if it is not."""
    shown = _display(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        values = validate(data, shown)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as e:
        raise TargetError(f"{shown}: {' '.join(str(e).split())}") from None
    except SchemaError as e:
        raise TargetError(str(e)) from None
    return Target(name=path.stem, given=frozenset(data), **values)


def scan_targets(targets_dir: Path = TARGETS_DIR) -> list[tuple[str, Target | TargetError]]:
    """Every target file, sorted by name: (name, its Target or the TargetError that says why it is broken)."""
    out: list[tuple[str, Target | TargetError]] = []
    for p in sorted(targets_dir.glob("*.toml")):
        try:
            out.append((p.stem, parse_target(p)))
        except TargetError as e:
            out.append((p.stem, e))
    return out


def all_targets(targets_dir: Path = TARGETS_DIR) -> list[Target]:
    """Every target; TargetError for the first broken file."""
    out = []
    for _, t in scan_targets(targets_dir):
        if isinstance(t, TargetError):
            raise t
        out.append(t)
    return out


def layout_max_prefill_block(layout: str, targets_dir: Path = TARGETS_DIR) -> int:
    """The largest prefill block every target of a weight layout takes (what `colibri export --layout`
    without a target plans for): the smallest max_prefill_block they declare."""
    from colibri.codegen.plan import MAX_PREFILL_BLOCK

    limits = [t.max_prefill_block for _, t in scan_targets(targets_dir)
              if isinstance(t, Target) and t.weight_layout == layout]
    return min(limits, default=MAX_PREFILL_BLOCK)


# the fields a target file sets, each a key of the schema
SCHEMA_FIELDS = tuple(f.name for f in fields(Target) if f.name not in ("name", "given"))
