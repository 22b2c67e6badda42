"""Give every allocated byte exactly one owner: category -> file -> symbol.

Per allocated section: sized symbols claim their bytes (the first claim wins
where aliases overlap), the weights blob is split tensor by tensor through the
manifest, code no symbol covers goes to the compile unit whose DWARF ranges
cover it, and what is left is padding/unattributed — counted, never dropped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..csources import RUNTIME_SRC
from ..targets import ROOT
from .elf import CompileUnit, ElfImage, Section, Symbol
from .models import blob_model
from .regions import MemoryRegion, is_stack_section, section_role
from .weights import BLOB_SECTION, BLOB_SYMBOL, TOKENIZER_KIND, Manifest, blob_pieces

ARENA_SYMBOL = "colibri_arena"
ARENA_SECTION = ".bss.colibri_arena"
# the arena by class of data (model.c): symbol -> section; the context and activations are colibri_arena's
ARENA_PARTS = {ARENA_SYMBOL: ARENA_SECTION, "colibri_kv": ".bss.colibri_kv", "colibri_scratch": ".bss.colibri_scratch"}

CATEGORIES = {
    "weights": "model weights",
    "tokenizer": "tokenizer",  # the blob's tokenizer section (the code that runs it is runtime code)
    "arena": "arena",
    "runtime": "runtime code",
    "generated": "generated code",
    "app": "application/demo code",
    "libc": "libc/libgcc",
    "stack": "stack/heap reservation",
    "metadata": "ELF/linker metadata",
    "unattributed": "padding/unattributed",
}
RUNTIME_FILES = set(RUNTIME_SRC)
GENERATED_FILES = {"model.c", "model_blob.S", "model.h"}
TOOLCHAIN_MARKERS = ("newlib", "libgloss", "libgcc", "glibc", "sysdeps", "picolibc", "musl", "compiler-rt",
                     "/csu/", "/usr/")
METADATA_TYPES = {"SHT_DYNSYM", "SHT_DYNAMIC", "SHT_HASH", "SHT_GNU_HASH", "SHT_REL", "SHT_RELA", "SHT_RELR",
                  "SHT_NOTE", "SHT_GNU_versym", "SHT_GNU_verdef", "SHT_GNU_verneed", "SHT_ARM_EXIDX",
                  "SHT_INIT_ARRAY", "SHT_FINI_ARRAY", "SHT_PREINIT_ARRAY", "SHT_X86_64_UNWIND", "SHT_GROUP"}
METADATA_NAMES = {".interp", ".dynstr", ".eh_frame", ".eh_frame_hdr", ".got", ".got.plt", ".plt", ".plt.got",
                  ".plt.sec", ".iplt", ".igot.plt", ".tm_clone_table", ".gcc_except_table", ".sframe", ".ctors",
                  ".dtors", ".jcr"}
METADATA_PREFIXES = (".note", ".gnu.version", ".ARM.exidx", ".ARM.extab", ".rela.", ".rel.", ".eh_frame.")
PADDING_MAX = 64  # a gap smaller than the largest alignment colibri asks for is alignment padding


@dataclass
class Item:
    category: str
    file: str
    symbol: str
    section: str
    bytes: int
    flash: bool
    ram: bool
    part: str  # region part: text, rodata, weights, data, bss, arena, stack


def classify(path: str | None, from_dwarf: bool) -> str:
    """The category of code or data from a source file (None: no file known)."""
    if not path:
        return "libc"
    p = path.replace("\\", "/")
    base = p.rsplit("/", 1)[-1]
    if "runtime_c/src/" in p or base in RUNTIME_FILES:
        return "runtime"
    if base in GENERATED_FILES or "/gen/" in p:
        return "generated"
    if "runtime_c/demo/" in p or "firmware_examples/" in p:
        return "app"
    if p.startswith("../") or any(m in p for m in TOOLCHAIN_MARKERS):
        return "libc"
    return "app" if from_dwarf else "libc"


def display_file(path: str | None) -> str:
    """A build-root independent name: ROOT-relative for project files, basename for generated and libc."""
    if not path:
        return "[no file]"
    p = os.path.normpath(path)
    if classify(p, True) in ("generated", "libc"):
        return os.path.basename(p)
    root = str(ROOT) + os.sep
    return p[len(root):] if p.startswith(root) else p


def is_metadata(sec: Section) -> bool:
    return (sec.type in METADATA_TYPES or sec.name in METADATA_NAMES
            or any(sec.name.startswith(p) for p in METADATA_PREFIXES))


def section_part(sec: Section) -> str:
    if sec.exec:
        return "text"
    if sec.nobits:
        return "bss"
    return "data" if sec.write else "rodata"


class Attributor:
    """Attribution of one ELF image (a linked file or one archive member)."""

    def __init__(self, img: ElfImage, manifest: Manifest | None, regions: list[MemoryRegion] | None,
                 models: dict[str, Manifest] | None = None) -> None:
        self.img, self.manifest, self.regions = img, manifest, regions
        self.models = models or {}  # several models in one image: each blob symbol's manifest (models.py)
        self.items: list[Item] = []
        self.member_unit = self._member_unit() if not img.linked else None
        tls = next((s for s in img.segments if s.type == "PT_TLS"), None)
        self.tls_base = tls.vaddr if tls is not None else 0
        self.unit_ranges = img.unit_ranges()
        self.by_section: dict[int, list[Symbol]] = {}
        for sym in img.symbols:
            if isinstance(sym.shndx, int) and sym.type not in ("SECTION", "FILE"):
                self.by_section.setdefault(sym.shndx, []).append(sym)
        bases: dict[str, list[str]] = {}
        for u in img.units:
            bases.setdefault(os.path.basename(u.path), []).append(u.path)
        # STT_FILE names are basenames: map them to the one compile unit of that name, when unique
        self.unit_by_base = {b: paths[0] for b, paths in bases.items() if len(set(paths)) == 1}

    def _member_unit(self) -> tuple[str | None, bool]:
        """An object file's own source: its first DWARF compile unit, else its STT_FILE symbol."""
        for u in self.img.units:
            if u.name:
                return u.path, True
        f = next((s.name for s in self.img.symbols if s.type == "FILE" and s.name), None)
        return f, False

    def run(self) -> list[Item]:
        for sec in self.img.allocated():
            self._section(sec)
        return self.items

    def _emit(self, sec: Section, category: str, file: str, symbol: str, n: int, part: str | None = None) -> None:
        if n <= 0:
            return
        flash, ram = section_role(sec, self.regions)
        self.items.append(Item(category, file, symbol, sec.name, n, flash, ram, part or section_part(sec)))

    def _offset(self, sec: Section, sym: Symbol) -> int:
        if not self.img.linked:
            return sym.value
        if sym.type == "TLS":
            return self.tls_base + sym.value - sec.addr
        return sym.value - sec.addr

    def _section(self, sec: Section) -> None:
        if is_metadata(sec):
            self._emit(sec, "metadata", "[linker]", f"[{sec.name}]", sec.size)
            return
        syms = self.by_section.get(sec.index, [])
        spans = sorted(((self._offset(sec, s), s.size, s) for s in syms if s.size > 0),
                       key=lambda t: (t[0], -t[1], t[2].bind != "GLOBAL", t[2].name))
        self.sizeless = sorted(((self._offset(sec, s), s) for s in syms
                                if sec.exec and s.size == 0 and s.type == "FUNC"), key=lambda t: t[0])
        cursor = 0
        for start, size, sym in spans:
            lo, hi = max(start, cursor), min(start + size, sec.size)
            if hi <= lo:
                continue
            if lo > cursor:
                self._gap(sec, cursor, lo)
            self._symbol(sec, sym, start, lo, hi)
            cursor = hi
        if cursor < sec.size:
            self._gap(sec, cursor, sec.size)

    def _owner(self, sym: Symbol, sec: Section) -> tuple[str, str]:
        if self.member_unit is not None:
            path, dwarf = self.member_unit
        else:
            unit = self.img.unit_at(sym.value if sym.type != "TLS" else sec.addr + self._offset(sec, sym))
            if unit is not None:
                path, dwarf = unit.path, True
            elif sym.file and sym.file in self.unit_by_base:
                path, dwarf = self.unit_by_base[sym.file], True
            else:
                path, dwarf = sym.file, False
        return classify(path, dwarf), display_file(path)

    def _symbol(self, sec: Section, sym: Symbol, start: int, lo: int, hi: int) -> None:
        if blob_model(sym.name) is not None:  # one of several models' blobs (models.py)
            self._weights(sec, lo - start, hi - start, sym.size, self.models.get(blob_model(sym.name)))
        elif sym.name == BLOB_SYMBOL:
            self._weights(sec, lo - start, hi - start, sym.size)
        elif sym.name in ARENA_PARTS:
            self._emit(sec, "arena", "arena", sym.name, hi - lo, "arena")
        elif is_stack_section(sec):
            self._emit(sec, "stack", "[linker script]", sym.name, hi - lo, "stack")
        else:
            category, file = self._owner(sym, sec)
            self._emit(sec, category, file, sym.name, hi - lo)

    def _weights(self, sec: Section, lo: int, hi: int, blob_size: int, manifest: Manifest | None = None) -> None:
        """Blob bytes [lo, hi) (relative to the blob start), tensor by tensor (manifest: one model's of
        several; default the image's own)."""
        for kind, name, a, b in blob_pieces(manifest or self.manifest, blob_size):
            n = min(b, hi) - max(a, lo)
            if kind == TOKENIZER_KIND:  # in the blob, but not weights: its own category
                self._emit(sec, "tokenizer", "tokenizer section", name, n, "weights")
            else:
                self._emit(sec, "weights", kind, name, n, "weights")

    def _gap(self, sec: Section, lo: int, hi: int) -> None:
        if sec.name == BLOB_SECTION or sec.name.startswith(BLOB_SECTION + "."):
            self._weights(sec, lo, hi, sec.size)
        elif sec.name in ARENA_PARTS.values():
            sym = next(k for k, v in ARENA_PARTS.items() if v == sec.name)
            self._emit(sec, "arena", "arena", sym, hi - lo, "arena")
        elif is_stack_section(sec):
            self._emit(sec, "stack", "[linker script]", f"[{sec.name}]", hi - lo, "stack")
        elif self.member_unit is not None:
            path, dwarf = self.member_unit
            self._emit(sec, classify(path, dwarf), display_file(path), f"[{sec.name}]", hi - lo)
        elif sec.name.startswith(("__libc", "__gcc", ".init", ".fini")):
            self._emit(sec, "libc", "[toolchain]", f"[{sec.name}]", hi - lo)
        else:
            self._sizeless_gap(sec, lo, hi)

    def _sizeless_gap(self, sec: Section, lo: int, hi: int) -> None:
        """Code functions without a size (crtstuff, hand-written assembly) claim up to the next one."""
        starts = [(off, sym) for off, sym in self.sizeless if lo <= off < hi]
        if not starts:
            self._code_gap(sec, lo, hi)
            return
        self._code_gap(sec, lo, starts[0][0])
        for i, (off, sym) in enumerate(starts):
            end = starts[i + 1][0] if i + 1 < len(starts) else hi
            if end > off:
                category, file = self._owner(sym, sec)
                self._emit(sec, category, file, sym.name, end - off)

    def _code_gap(self, sec: Section, lo: int, hi: int) -> None:
        """Bytes no symbol claims: to the compile unit whose DWARF ranges cover them, else unattributed."""
        cursor = lo
        for a, b, unit in self._units_over(sec.addr + lo, sec.addr + hi) if sec.exec else ():
            a, b = max(a - sec.addr, cursor), min(b - sec.addr, hi)
            if b <= a:
                continue
            self._unattributed(sec, cursor, a)
            self._emit(sec, classify(unit.path, True), display_file(unit.path), "[no symbol]", b - a)
            cursor = b
        self._unattributed(sec, cursor, hi)

    def _units_over(self, lo: int, hi: int) -> list[tuple[int, int, CompileUnit]]:
        return [(a, b, u) for a, b, u in self.unit_ranges if a < hi and b > lo]

    def _unattributed(self, sec: Section, lo: int, hi: int) -> None:
        kind = "padding" if hi - lo < PADDING_MAX else "unknown"
        self._emit(sec, "unattributed", kind, f"[{sec.name} {kind}]", hi - lo)


def attribute(img: ElfImage, manifest: Manifest | None, regions: list[MemoryRegion] | None,
              models: dict[str, Manifest] | None = None) -> list[Item]:
    items = Attributor(img, manifest, regions, models).run()
    total = sum(s.size for s in img.allocated())
    got = sum(i.bytes for i in items)
    if got != total:  # a bug in this module, not in the artifact
        raise AssertionError(f"{img.name}: attributed {got} bytes of {total} allocated")
    return items


def merge(items: list[Item]) -> list[Item]:
    """Sum items with the same (category, file, symbol, section)."""
    out: dict[tuple, Item] = {}
    for it in items:
        key = (it.category, it.file, it.symbol, it.section, it.part, it.flash, it.ram)
        if key in out:
            out[key].bytes += it.bytes
        else:
            out[key] = Item(**vars(it))
    return list(out.values())
