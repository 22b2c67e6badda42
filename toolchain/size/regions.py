"""Flash and RAM: which sections occupy which, the target's memory map, budgets.

Without a memory map a section is in flash when its bytes are in the file image
(read-only sections, and the load image of writable ones) and in RAM when it is
writable (.data, .bss, the arena, the stack). With a map (firmware targets), the
section's run address (VMA) and load address (LMA) decide, region by region.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .elf import ElfImage, Section

STACK_SECTIONS = {".stack", ".heap", "._user_heap_stack", ".stack_dummy", ".heap_dummy"}
STACK_SYMBOLS = ("__stack_size", "_Min_Stack_Size", "__STACK_SIZE", "_stack_size", "__stack_size__")
FLASH_PARTS = ("text", "rodata", "weights", "data")
RAM_PARTS = ("data", "bss", "arena", "stack")
# Region kinds (targets/SCHEMA.md): internal flash, memory-mapped external flash (read-only, code and
# weights executed/read in place), internal RAM and external RAM (SDRAM/PSRAM: the model's buffers).
KIND_ROLE = {"flash": "flash", "xip-flash": "flash", "ram": "ram", "ext-ram": "ram"}
# The class of data of an output section (targets/SCHEMA.md placement): the model's own sections by name,
# the rest by prefix. A region's row in the audit lists the classes it holds.
SECTION_CLASS = {".rodata.model": "model", ".bss.colibri_kv": "kv_cache", ".bss.colibri_arena": "activations",
                 ".bss.colibri_scratch": "scratch"}
_PREFIX_CLASS = ((".vectors", "code"), (".text", "code"), (".ARM", "code"), (".glue", "code"),
                 (".rodata", "rodata"), (".srodata", "rodata"), (".data", "data"), (".tdata", "data"),
                 (".sdata", "data"), (".bss", "bss"), (".tbss", "bss"), (".sbss", "bss"))
_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2, "mib": 1024**2,
          "g": 1024**3, "gb": 1024**3, "gib": 1024**3}


@dataclass(frozen=True)
class MemoryRegion:
    name: str
    origin: int
    length: int
    kind: str  # a KIND_ROLE key: "flash" | "xip-flash" | "ram" | "ext-ram"

    @property
    def role(self) -> str:
        """What the region counts as for budgets and the flash/RAM split: "flash" or "ram"."""
        return KIND_ROLE[self.kind]

    @property
    def attrs(self) -> str:
        """Linker-script MEMORY attributes."""
        return "rx" if self.role == "flash" else "rwx"

    def holds(self, addr: int, size: int = 0) -> bool:
        """[addr, addr + size) lies within the region (size 0: the byte at addr)."""
        return self.origin <= addr and addr + max(size, 1) <= self.origin + self.length


def parse_bytes(text: str | int) -> int:
    """'2M', '512K', '1.5MiB', '0x8000', 1024 -> bytes (K = 1024)."""
    if isinstance(text, int):
        return text
    s = str(text).strip().lower().replace("_", "")
    if s.startswith("0x"):
        return int(s, 16)
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", s)
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 2M, 512K, 65536, 0x8000)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def parse_budget(text: str) -> dict[str, int]:
    """'flash=2M,ram=1M' -> {"flash": 2097152, "ram": 1048576}."""
    out = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("flash", "ram"):
            raise ValueError(f"bad budget {part!r}: use flash=SIZE,ram=SIZE")
        out[key] = parse_bytes(value)
    return out


def memory_map(memory: Sequence[Mapping]) -> list[MemoryRegion]:
    """A target's memory: [{name, origin, length, kind}], sizes as ints or '256K' strings."""
    out = []
    for r in memory:
        kind = str(r.get("kind", "")).lower()
        if kind not in KIND_ROLE:
            kind = "flash" if "x" in str(r.get("attrs", "")) or "flash" in str(r.get("name", "")).lower() else "ram"
        out.append(MemoryRegion(str(r["name"]), parse_bytes(r["origin"]), parse_bytes(r["length"]), kind))
    return out


def _region_at(regions: list[MemoryRegion], addr: int) -> MemoryRegion | None:
    return next((r for r in regions if r.holds(addr)), None)


def section_role(sec: Section, regions: list[MemoryRegion] | None = None) -> tuple[bool, bool]:
    """(in flash, in RAM) for an allocated section."""
    if not sec.alloc or sec.size == 0 or (sec.tls and sec.nobits):
        return False, False  # .tbss occupies no address range of its own (its addresses overlap what follows)
    if regions:
        vma, lma = _region_at(regions, sec.addr), _region_at(regions, sec.lma)
        if vma is not None or lma is not None:
            flash = not sec.nobits and any(r is not None and r.role == "flash" for r in (vma, lma))
            ram = vma is not None and vma.role == "ram"
            return flash, ram
    if sec.nobits:
        return False, True
    return True, sec.write


def section_class(name: str) -> str:
    """The class of data an output section holds: model, kv_cache, activations, scratch, code, rodata,
    data, bss, stack, or other."""
    if name in SECTION_CLASS:
        return SECTION_CLASS[name]
    if name in STACK_SECTIONS:
        return "stack"
    return next((c for p, c in _PREFIX_CLASS if name == p or name.startswith(p + ".") or name.startswith(p + "_")),
                "other")


def is_stack_section(sec: Section) -> bool:
    return sec.name in STACK_SECTIONS


def stack_reservation(img: ElfImage) -> int:
    """Stack bytes a linker script reserves by symbol only (no section): __stack_size and friends."""
    if any(is_stack_section(s) and s.size for s in img.sections):
        return 0
    for name in STACK_SYMBOLS:
        sym = next((s for s in img.symbols if s.name == name and s.shndx == "SHN_ABS"), None)
        if sym is not None and 0 < sym.value < 1 << 32:
            return sym.value
    return 0


def region_usage(img: ElfImage, regions: list[MemoryRegion], reserved_stack: int) -> tuple[list[dict], list[str]]:
    """used / size / percent for every region of the map, and warnings for sections outside it."""
    used = {r.name: 0 for r in regions}
    classes: dict[str, dict[str, int]] = {r.name: {} for r in regions}

    def count(region: MemoryRegion, cls: str, n: int) -> None:
        used[region.name] += n
        classes[region.name][cls] = classes[region.name].get(cls, 0) + n

    warnings = []
    for sec in img.allocated():
        if sec.tls and sec.nobits:
            continue
        vma, lma = _region_at(regions, sec.addr), _region_at(regions, sec.lma)
        if vma is None and (lma is None or sec.nobits):
            warnings.append(f"section {sec.name} at {sec.addr:#x} is outside the memory map")
            continue
        if vma is not None:
            count(vma, section_class(sec.name), sec.size)
        if lma is not None and lma is not vma and not sec.nobits:
            count(lma, section_class(sec.name), sec.size)  # a load image: its class still (data)
    if reserved_stack:
        ram = next((r for r in regions if r.kind == "ram"), None)  # the stack is in internal RAM
        if ram is not None:
            count(ram, "stack", reserved_stack)
    rows = [{"name": r.name, "kind": r.role, "region_kind": r.kind, "origin": r.origin, "size": r.length,
             "used": used[r.name], "percent": round(100.0 * used[r.name] / r.length, 2) if r.length else None,
             "classes": {c: n for c, n in sorted(classes[r.name].items(), key=lambda kv: -kv[1]) if n}}
            for r in regions]
    return rows, warnings


def region_totals(items: list, reserved_stack: int) -> dict:
    """{"flash": {"bytes", "parts"}, "ram": {...}} from attributed items."""
    flash = dict.fromkeys(FLASH_PARTS, 0)
    ram = dict.fromkeys(RAM_PARTS, 0)
    for it in items:
        if it.flash:
            flash[it.part] = flash.get(it.part, 0) + it.bytes
        if it.ram:
            ram[it.part] = ram.get(it.part, 0) + it.bytes
    ram["stack"] += reserved_stack
    return {"flash": {"bytes": sum(flash.values()), "parts": flash},
            "ram": {"bytes": sum(ram.values()), "parts": ram, "reserved_stack": reserved_stack}}
