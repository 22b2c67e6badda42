"""One artifact in, one report (a JSON-ready dict, schema in SCHEMA.md) out."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import targets as targets_mod
from . import SCHEMA
from .abi import artifact_kind, audit_abi
from .attribute import CATEGORIES, Item, attribute, merge
from .elf import Artifact, ElfImage, load
from .models import model_manifests, models_summary
from .regions import (
    MemoryRegion,
    memory_map,
    parse_bytes,
    region_totals,
    region_usage,
    section_role,
    stack_reservation,
)
from .stack import audit_stack
from .weights import BLOB_SECTION, BLOB_SYMBOL, load_manifest, weights_summary


@dataclass
class Options:
    manifest: Path | None = None  # default: manifest.json beside the artifact
    target: str | None = None  # default: inferred from build/<target>/<model>/
    budget: dict[str, int] = field(default_factory=dict)  # overrides the target's
    stack_dirs: list[Path] | None = None  # None: <artifact dir>/obj; []: no stack audit
    stack_files: list[Path] | None = None  # the linked objects' .ci/.su files: used instead of stack_dirs
    stack: bool = True


def infer_target(path: Path) -> targets_mod.Target | None:
    """The target of build/<target>[-sanitizers]/<model>/<artifact>, when that is a known target."""
    name = path.resolve().parent.parent.name
    for candidate in (name, name.split("-", 1)[0]):
        try:
            return targets_mod.load_target(candidate)
        except targets_mod.TargetError:
            continue
    return None


def resolve_target(path: Path, name: str | None) -> targets_mod.Target | None:
    """--target NAME (targets/NAME.toml) or --target path/to/board.toml; else inferred from the path."""
    if not name:
        return infer_target(path)
    if name.endswith(".toml"):
        toml = Path(name)
        return targets_mod.load_target(toml.stem, toml.parent)
    return targets_mod.load_target(name)


def target_budget(target: targets_mod.Target | None) -> dict[str, int]:
    raw = target.budget if target else {}
    return {k: parse_bytes(v) for k, v in raw.items() if k in ("flash", "ram")}


def _memory(target: targets_mod.Target | None) -> list[MemoryRegion]:
    return memory_map(target.memory) if target else []


def _section_rows(art: Artifact, memory: list[MemoryRegion]) -> list[dict]:
    rows = []
    for img in art.images:
        for s in img.sections:
            if s.index == 0:
                continue
            flash, ram = section_role(s, memory or None)
            row = {"name": s.name, "type": s.type.removeprefix("SHT_"), "flags": s.flag_letters, "address": s.addr,
                   "lma": s.lma, "size": s.size, "align": s.align, "alloc": s.alloc, "flash": flash, "ram": ram}
            if art.archive:
                row["member"] = img.member
            rows.append(row)
    return rows


def _aggregate(items: list[Item]) -> tuple[list[dict], list[dict], list[dict]]:
    cats = {k: {"key": k, "label": v, "bytes": 0, "flash": 0, "ram": 0} for k, v in CATEGORIES.items()}
    files: dict[tuple[str, str], dict] = {}
    symbols: dict[tuple[str, str, str], dict] = {}
    for it in items:
        for row in (cats[it.category],
                    files.setdefault((it.category, it.file),
                                     {"category": it.category, "file": it.file, "bytes": 0, "flash": 0, "ram": 0}),
                    symbols.setdefault((it.category, it.file, it.symbol),
                                       {"category": it.category, "file": it.file, "symbol": it.symbol,
                                        "section": it.section, "bytes": 0, "flash": 0, "ram": 0})):
            row["bytes"] += it.bytes
            row["flash"] += it.bytes if it.flash else 0
            row["ram"] += it.bytes if it.ram else 0
    order = sorted(symbols.values(), key=lambda r: (-r["bytes"], r["category"], r["file"], r["symbol"]))
    return list(cats.values()), sorted(files.values(), key=lambda r: (-r["bytes"], r["file"])), order


def _blob_bytes(items: list[Item]) -> int:
    """The blob's bytes: its weights and, inside it, the tokenizer section."""
    return sum(it.bytes for it in items if it.category in ("weights", "tokenizer"))


def _budget(regions: dict, budget: dict[str, int]) -> dict | None:
    if not budget:
        return None
    out = {}
    for key, limit in budget.items():
        used = regions[key]["bytes"]
        out[key] = {"limit": limit, "used": used, "ok": used <= limit,
                    "percent": round(100.0 * used / limit, 2) if limit else None}
    return out


def _elf_info(img: ElfImage, kind: str) -> dict:
    return {"class": img.elfclass, "machine": img.machine, "arch": img.arch, "type": img.etype.removeprefix("ET_"),
            "endian": "little" if img.little_endian else "big", "kind": kind}


def quick_regions(path: Path, target: targets_mod.Target | None) -> tuple[Artifact, dict, list[dict]]:
    """Regions only (no DWARF): what the post-link summary needs."""
    art = load(path, dwarf=False)
    memory = _memory(target)
    items = [it for img in art.images for it in attribute(img, None, memory or None)]
    reserved = stack_reservation(art.main) if art.images and not art.archive else 0
    usage = region_usage(art.main, memory, reserved)[0] if memory and not art.archive else []
    return art, region_totals(items, reserved), usage


def audit(path: str | Path, opts: Options | None = None) -> dict:
    opts = opts or Options()
    path = Path(path)
    target = resolve_target(path, opts.target)
    art = load(path)
    manifest = load_manifest(opts.manifest or path.parent / "manifest.json")
    memory = _memory(target)
    models = model_manifests(path.parent)  # several models in one image (models.py); usually none
    items: list[Item] = []
    for img in art.images:
        items += attribute(img, manifest, memory or None, models)
    items = merge(items)
    warnings: list[str] = []
    main = art.images[0] if art.images else None
    reserved = stack_reservation(main) if main is not None and not art.archive else 0
    regions = region_totals(items, reserved)
    usage: list[dict] = []
    if memory and main is not None and not art.archive:
        usage, outside = region_usage(main, memory, reserved)
        warnings += outside
    categories, files, symbols = _aggregate(items)
    blob = _blob_bytes(items)
    has_blob = any(img.symbol(BLOB_SYMBOL) or img.section(BLOB_SECTION) for img in art.images)
    if manifest is not None and has_blob and manifest.blob_bytes != blob:
        warnings.append(f"weights are {blob} bytes but {manifest.path} describes a {manifest.blob_bytes}-byte blob:"
                        " tensors not attributed")
    firmware = None if target is None else target.kind == "firmware"
    kind = artifact_kind(main, art.archive, firmware) if main is not None else "archive"
    budget = dict(target_budget(target))
    budget.update(opts.budget)
    stack = None
    if opts.stack and main is not None:
        dirs = opts.stack_dirs if opts.stack_dirs is not None else [path.parent / "obj"]
        stack = audit_stack(dirs, art.images, main.arch, opts.stack_files)
    allocated = sum(s.size for img in art.images for s in img.allocated())
    return {
        "schema": SCHEMA,
        "file": str(path),
        "file_bytes": art.file_bytes,
        "elf": _elf_info(main, kind) if main is not None else None,
        "members": [{"name": img.member, "allocated_bytes": sum(s.size for s in img.allocated())}
                    for img in art.images] if art.archive else None,
        "target": {"name": target.name, "kind": target.kind} if target else None,
        "allocated_bytes": allocated,
        "sections": _section_rows(art, memory),
        "regions": regions,
        "memory": usage,
        "categories": categories,
        "files": files,
        "symbols": symbols,
        "weights": weights_summary(manifest, blob) if has_blob else None,
        "models": models_summary(art.images, models),
        "abi": audit_abi(art, firmware),
        "stack": stack,
        "budget": _budget(regions, budget),
        "warnings": warnings,
    }


def region_overflow(name: str, over: int, size: int, kind: str, limits: dict[str, int],
                    classes: dict[str, str] | None = None) -> str:
    """A memory region's overflow in GNU ld's words, with its size and the budget of its kind, and the
    classes of data that did not fit (class -> its section, or its bytes in the region):
    'AXI_SRAM overflowed by 1024 bytes (region 524288 bytes, ram budget 1048576): kv_cache (.bss.colibri_kv)'."""
    budget = f", {kind} budget {limits[kind]}" if kind in limits else ""
    what = ", ".join(f"{c} ({sec})" for c, sec in (classes or {}).items())
    return f"{name} overflowed by {over} bytes (region {size} bytes{budget})" + (f": {what}" if what else "")


def overruns(regions: dict, memory: list[dict], limits: dict[str, int]) -> list[str]:
    """One line per budget (flash, ram) and per memory region exceeded: the decision behind the
    post-link check (check_budget), the firmware link step and `colibri size`'s exit status."""
    out = [f"{key} overflowed by {used - limit} bytes (budget {limit})"
           for key, limit in limits.items() if (used := regions[key]["bytes"]) > limit]
    return out + [region_overflow(m["name"], m["used"] - m["size"], m["size"], m["kind"], limits,
                                  {c: f"{n:,} bytes" for c, n in (m.get("classes") or {}).items()})
                  for m in memory if m["used"] > m["size"]]


def budget_limits(report: dict) -> dict[str, int]:
    return {key: b["limit"] for key, b in (report.get("budget") or {}).items()}


def over_budget(report: dict) -> list[str]:
    """overruns() of a report: its budgets and its memory map."""
    return overruns(report["regions"], report["memory"], budget_limits(report))
