"""`colibri targets --check`: what loading a target file does not catch.

Loading checks a file against the schema (toolchain/target_schema.py). This adds the checks of a
target as a whole: a firmware target's memory maps (the firmware view builds, so placement names
known regions of the right kind; no two regions overlap; a budget is not larger than the regions of
its kind; the QEMU map keeps each region's size; each [partitions] table fits its region) and that
its compiler and runner are installed.
"""

from __future__ import annotations

from .firmware import Firmware, Variant, firmware_spec
from .partition import partition_problems
from .targets import Target, TargetError


def _overlaps(variant: Variant) -> list[str]:
    regions = sorted(variant.regions, key=lambda r: r.origin)
    return [f"{variant.name} map: regions {a.name} [{a.origin:#x}, {a.origin + a.length:#x}) and {b.name} "
            f"[{b.origin:#x}, {b.origin + b.length:#x}) overlap"
            for i, a in enumerate(regions) for b in regions[i + 1:] if b.origin < a.origin + a.length]


def map_problems(fw: Firmware) -> list[str]:
    """What is wrong with a firmware target's memory maps, one line each (empty: nothing)."""
    out = _overlaps(fw.part) + (_overlaps(fw.qemu) if fw.qemu else [])
    for kind, budget in (("flash", fw.flash_budget), ("ram", fw.ram_budget)):
        total = sum(r.length for r in fw.part.regions if r.role == kind)
        if budget > total:
            out.append(f"budget.{kind} = {budget} is more than the part's {kind} regions hold ({total} bytes)")
    if fw.qemu:
        part = {r.name: r for r in fw.part.regions}
        out += [f"qemu_memory {r.name}: length {r.length:#x}, the part's is {part[r.name].length:#x} (the QEMU image "
                "must overflow where the part does)" for r in fw.qemu.regions
                if r.name in part and r.length != part[r.name].length]
    return out


def check_target(t: Target) -> list[str]:
    """Every problem of one target, each a line naming its file."""
    path = f"targets/{t.name}.toml"
    problems = []
    if t.kind == "firmware":
        try:
            fw = firmware_spec(t)
        except TargetError as e:
            problems.append(str(e))
        else:
            problems += [f"{path}: {p}" for p in map_problems(fw)]
            problems += partition_problems(fw)
    missing = t.missing(run=True)
    if missing:
        problems.append(f"{path}: {', '.join(missing)} not found; install it with: {t.install_hint()}")
    return problems
