"""Read what the audit needs from ELF files and ar archives, never a section's contents.

Only headers, symbol tables, the dynamic section and DWARF (compile-unit names,
address ranges and file-scope variables) are read: a 300 MB `.rodata.model` is
never touched. Archive members are opened in place through a window on the file.
"""

from __future__ import annotations

import io
import os
import struct
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from elftools.common.exceptions import DWARFError, ELFError, ELFRelocationError
from elftools.dwarf.die import DIE
from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile

from colibri.codegen.errors import ExportError
from colibri.codegen.safeio import open_regular

from .elfcheck import check_elf
from .errors import SizeError

ARCH = {"EM_X86_64": "x86_64", "EM_386": "x86", "EM_AARCH64": "aarch64", "EM_ARM": "arm", "EM_RISCV": "riscv"}
DW_OP_ADDR = 0x03

# What pyelftools raises on a malformed file once the tables are known to lie inside it: its own
# errors, and whatever its parsers hit on bad DWARF (a missing abbreviation, a bad form, a bad offset).
PARSE_ERRORS = (ELFError, DWARFError, ValueError, KeyError, IndexError, TypeError, AttributeError, ZeroDivisionError,
                AssertionError, OverflowError, EOFError, struct.error, NotImplementedError, RecursionError)


@dataclass(frozen=True)
class Section:
    index: int
    name: str
    type: str  # "SHT_PROGBITS", ...
    flags: int
    addr: int
    lma: int  # load address: addr unless a PT_LOAD segment places it elsewhere
    size: int
    align: int

    @property
    def alloc(self) -> bool:
        return bool(self.flags & SH_FLAGS.SHF_ALLOC)

    @property
    def write(self) -> bool:
        return bool(self.flags & SH_FLAGS.SHF_WRITE)

    @property
    def exec(self) -> bool:
        return bool(self.flags & SH_FLAGS.SHF_EXECINSTR)

    @property
    def tls(self) -> bool:
        return bool(self.flags & SH_FLAGS.SHF_TLS)

    @property
    def nobits(self) -> bool:
        return self.type == "SHT_NOBITS"

    @property
    def flag_letters(self) -> str:
        return "".join(c for bit, c in ((SH_FLAGS.SHF_WRITE, "W"), (SH_FLAGS.SHF_ALLOC, "A"),
                                        (SH_FLAGS.SHF_EXECINSTR, "X"), (SH_FLAGS.SHF_TLS, "T")) if self.flags & bit)


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int
    size: int
    type: str  # "FUNC", "OBJECT", "NOTYPE", "TLS", "FILE", "SECTION", ...
    bind: str  # "GLOBAL", "LOCAL", "WEAK", ...
    visibility: str  # "DEFAULT", "HIDDEN", ...
    shndx: int | str  # section index or "SHN_UNDEF", "SHN_ABS", "SHN_COMMON"
    file: str | None = None  # the STT_FILE before it (local symbols only)

    @property
    def defined(self) -> bool:
        return self.shndx != "SHN_UNDEF"


@dataclass(frozen=True)
class Segment:
    type: str
    vaddr: int
    paddr: int
    offset: int
    filesz: int
    memsz: int
    flags: int


@dataclass
class CompileUnit:
    name: str  # DW_AT_name as written by the compiler
    comp_dir: str
    producer: str
    length: int  # unit_length: identical in the object and in whatever links it
    ranges: list[tuple[int, int]] = field(default_factory=list)  # code [lo, hi)
    variables: list[int] = field(default_factory=list)  # addresses of file-scope variables

    @property
    def path(self) -> str:
        if os.path.isabs(self.name) or not self.comp_dir:
            return os.path.normpath(self.name)
        return os.path.normpath(os.path.join(self.comp_dir, self.name))


@dataclass
class ElfImage:
    name: str  # file path, or "archive.a(member.o)"
    member: str | None
    elfclass: int
    little_endian: bool
    machine: str
    flags: int  # e_flags
    etype: str  # "ET_EXEC", "ET_DYN", "ET_REL"
    sections: list[Section]
    segments: list[Segment]
    symbols: list[Symbol]  # .symtab, or .dynsym when stripped
    dynsyms: list[Symbol]
    dynamic: dict[str, list[int]]  # DT_* tag -> values
    interp: str | None
    units: list[CompileUnit]
    needed: list[str] = field(default_factory=list)
    _starts: list[int] | None = field(default=None, repr=False)
    _spans: list[tuple[int, CompileUnit]] = field(default_factory=list, repr=False)
    _vars: dict[int, CompileUnit] | None = field(default=None, repr=False)

    @property
    def arch(self) -> str:
        base = ARCH.get(self.machine, self.machine.removeprefix("EM_").lower())
        return f"riscv{self.elfclass}" if base == "riscv" else base

    @property
    def linked(self) -> bool:
        return self.etype != "ET_REL"

    def allocated(self) -> list[Section]:
        return [s for s in self.sections if s.alloc and s.size > 0]

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)

    def symbol(self, name: str) -> Symbol | None:
        return next((s for s in self.symbols if s.name == name and s.defined), None)

    def unit_at(self, addr: int) -> CompileUnit | None:
        """The compile unit whose code range or file-scope variable is at addr (linked files)."""
        if self._starts is None:
            spans = sorted(((lo, hi, u) for u in self.units for lo, hi in u.ranges if hi > lo), key=lambda t: t[:2])
            self._starts = [lo for lo, _, _ in spans]
            self._spans = [(hi, u) for _, hi, u in spans]
            self._vars = {a: u for u in self.units for a in u.variables}
        i = bisect_right(self._starts, addr) - 1
        if i >= 0 and addr < self._spans[i][0]:
            return self._spans[i][1]
        return self._vars.get(addr) if self._vars else None

    def unit_ranges(self) -> list[tuple[int, int, CompileUnit]]:
        """Every code range of every compile unit, sorted by address."""
        return sorted(((lo, hi, u) for u in self.units for lo, hi in u.ranges if hi > lo), key=lambda t: t[:2])


@dataclass
class Artifact:
    path: Path
    archive: bool
    file_bytes: int
    images: list[ElfImage]

    @property
    def main(self) -> ElfImage:
        return self.images[0]


class Window(io.RawIOBase):
    """A read-only view of [start, start + size) of a file: an archive member as a stream."""

    def __init__(self, f: BinaryIO, start: int, size: int) -> None:
        self.f, self.start, self.size, self.pos = f, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n is None or n < 0 else min(n, max(0, self.size - self.pos))
        self.f.seek(self.start + self.pos)
        data = self.f.read(n)
        self.pos += len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def _sections(elf: ELFFile, segments: list[Segment]) -> list[Section]:
    loads = [s for s in segments if s.type == "PT_LOAD"]
    out = []
    for i, sec in enumerate(elf.iter_sections()):
        h = sec.header
        lma = h["sh_addr"]
        if h["sh_flags"] & SH_FLAGS.SHF_ALLOC and h["sh_type"] != "SHT_NOBITS":
            for seg in loads:
                if seg.offset <= h["sh_offset"] < seg.offset + seg.filesz and seg.vaddr <= h["sh_addr"]:
                    lma = seg.paddr + h["sh_addr"] - seg.vaddr
                    break
        elif h["sh_flags"] & SH_FLAGS.SHF_ALLOC:
            for seg in loads:
                if seg.vaddr <= h["sh_addr"] < seg.vaddr + max(seg.memsz, 1):
                    lma = seg.paddr + h["sh_addr"] - seg.vaddr
                    break
        out.append(Section(i, sec.name, str(h["sh_type"]), h["sh_flags"], h["sh_addr"], lma, h["sh_size"],
                           h["sh_addralign"]))
    return out


def _symbols(elf: ELFFile, table: str, thumb: bool) -> list[Symbol]:
    sec = elf.get_section_by_name(table)
    if sec is None or not hasattr(sec, "iter_symbols"):
        return []
    out, current_file = [], None
    for s in sec.iter_symbols():
        info = s["st_info"]
        kind = str(info["type"]).removeprefix("STT_")
        if kind == "FILE":
            current_file = s.name
        value = s["st_value"]
        if thumb and kind == "FUNC":
            value &= ~1  # Thumb functions have bit 0 set in st_value
        bind = str(info["bind"]).removeprefix("STB_")
        out.append(Symbol(s.name, value, s["st_size"], kind, bind,
                          str(s["st_other"]["visibility"]).removeprefix("STV_"), s["st_shndx"],
                          current_file if bind == "LOCAL" else None))
    return out


def _dynamic(elf: ELFFile) -> tuple[dict[str, list[int]], list[str]]:
    tags: dict[str, list[int]] = {}
    needed: list[str] = []
    sec = elf.get_section_by_name(".dynamic")
    if sec is None or not hasattr(sec, "get_tag") or sec["sh_type"] == "SHT_NOBITS":
        return tags, needed
    for n in range(sec["sh_size"] // elf.structs.Elf_Dyn.sizeof()):  # up to DT_NULL, never past the section
        t = sec.get_tag(n)
        if t.entry.d_tag == "DT_NULL":
            break
        tags.setdefault(str(t.entry.d_tag), []).append(t.entry.d_val)
        if t.entry.d_tag == "DT_NEEDED":
            needed.append(t.needed)
    return tags, needed


def _attr_int(die, name: str) -> int | None:
    a = die.attributes.get(name)
    return a.value if a is not None and isinstance(a.value, int) else None


def _attr_str(die, name: str) -> str:
    a = die.attributes.get(name)
    if a is None:
        return ""
    v = a.value
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _cu_ranges(dwarf, cu, top) -> list[tuple[int, int]]:
    low = _attr_int(top, "DW_AT_low_pc")
    high = top.attributes.get("DW_AT_high_pc")
    if low is not None and high is not None:
        hi = low + high.value if high.form != "DW_FORM_addr" else high.value
        return [(low, hi)]
    rng = top.attributes.get("DW_AT_ranges")
    lists = dwarf.range_lists()
    if rng is None or lists is None or rng.form == "DW_FORM_rnglistx":
        return []
    base = low or 0
    out = []
    for entry in lists.get_range_list_at_offset(rng.value, cu=cu):
        if hasattr(entry, "base_address"):
            base = entry.base_address
        elif getattr(entry, "is_absolute", False):
            out.append((entry.begin_offset, entry.end_offset))
        else:
            out.append((base + entry.begin_offset, base + entry.end_offset))
    return out


def _top_children(cu, top):
    """The top DIE's children, read in order through the unit (pyelftools' iter_children follows
    DW_AT_sibling, which a malformed file can point backwards: a loop without end)."""
    end, offset, depth = cu.cu_offset + cu.size, top.offset + top.size, 1 if top.has_children else 0
    while depth and offset < end:
        die = DIE(cu, top.stream, offset)
        if die.size <= 0:
            raise ValueError(f"DIE of size {die.size} at offset {offset}")
        offset += die.size
        if die.is_null():
            depth -= 1
            continue
        if depth == 1:
            yield die
        depth += die.has_children


def _cu_variables(cu, top) -> list[int]:
    """Addresses of the file-scope variables a compile unit defines (DW_OP_addr locations)."""
    out = []
    for die in _top_children(cu, top):
        if die.tag != "DW_TAG_variable":
            continue
        loc = die.attributes.get("DW_AT_location")
        if loc is None or loc.form != "DW_FORM_exprloc" or not loc.value or loc.value[0] != DW_OP_ADDR:
            continue
        out.append(int.from_bytes(bytes(loc.value[1:]), "little" if die.dwarfinfo.config.little_endian else "big"))
    return out


def _units(elf: ELFFile, linked: bool) -> list[CompileUnit]:
    if not elf.has_dwarf_info() or elf.get_section_by_name(".debug_info") is None:
        return []  # (.zdebug_*, GNU's old compressed DWARF, is not read: its size is unbounded)
    if not linked:
        unit = object_unit(elf)
        return [unit] if unit is not None else []
    dwarf = elf.get_dwarf_info(relocate_dwarf_sections=False, follow_links=False)
    aranges: dict[int, list[tuple[int, int]]] = {}
    ar = dwarf.get_aranges()
    if ar is not None:
        for e in ar.entries:
            if e.length:
                aranges.setdefault(e.info_offset, []).append((e.begin_addr, e.begin_addr + e.length))
    units = []
    for cu in dwarf.iter_CUs():
        top = cu.get_top_DIE()
        unit = CompileUnit(_attr_str(top, "DW_AT_name"), _attr_str(top, "DW_AT_comp_dir"),
                           _attr_str(top, "DW_AT_producer"), cu["unit_length"])
        # both: pyelftools ends a unit's aranges at the first (0, 0) entry, which --gc-sections
        # leaves mid-list for each discarded function, losing the ranges after it
        both = set(aranges.get(cu.cu_offset, [])) | set(_cu_ranges(dwarf, cu, top))
        unit.ranges = sorted((lo, hi) for lo, hi in both if hi > lo)
        unit.variables = _cu_variables(cu, top)
        units.append(unit)
    return units


def _reloc_string(elf: ELFFile, attr) -> str | None:
    """A strp/line_strp attribute of an object file, relocated by hand (pyelftools lacks some
    architectures' relocation recipes, e.g. RISC-V): addend + symbol value into the string section."""
    table = {"DW_FORM_strp": ".debug_str", "DW_FORM_line_strp": ".debug_line_str"}.get(attr.form)
    relocs = elf.get_section_by_name(".rela.debug_info") or elf.get_section_by_name(".rel.debug_info")
    strings = elf.get_section_by_name(table) if table else None
    if relocs is None or strings is None:
        return None
    symtab = elf.get_section(relocs["sh_link"])
    for r in relocs.iter_relocations():
        if r["r_offset"] == attr.offset:
            offset = (r["r_addend"] if r.is_RELA() else attr.raw_value) + symtab.get_symbol(r["r_info_sym"])["st_value"]
            data = strings.data()
            return data[offset: data.index(b"\0", offset)].decode("utf-8", "replace")
    return None


def object_unit(elf: ELFFile) -> CompileUnit | None:
    """The first compile unit of a relocatable object: its source name and unit length."""
    try:
        dwarf = elf.get_dwarf_info(follow_links=False)
        manual = False
    except ELFRelocationError:
        dwarf = elf.get_dwarf_info(relocate_dwarf_sections=False, follow_links=False)
        manual = True
    cu = next(dwarf.iter_CUs(), None)
    if cu is None:
        return None
    top = cu.get_top_DIE()
    values = []
    for name in ("DW_AT_name", "DW_AT_comp_dir", "DW_AT_producer"):
        attr = top.attributes.get(name)
        text = _reloc_string(elf, attr) if manual and attr is not None else None
        values.append(text if text is not None else _attr_str(top, name))
    return CompileUnit(values[0], values[1], values[2], cu["unit_length"])


def read_elf(stream: BinaryIO, name: str, member: str | None = None, dwarf: bool = True) -> ElfImage:
    """The audit's view of one ELF file; SizeError naming it when it is malformed."""
    check_elf(stream, name)
    try:
        return _read_elf(stream, name, member, dwarf)
    except PARSE_ERRORS as e:
        raise SizeError(f"{name}: malformed ELF file: {' '.join(str(e).split()) or type(e).__name__}") from e


def _read_elf(stream: BinaryIO, name: str, member: str | None, dwarf: bool) -> ElfImage:
    elf = ELFFile(stream)
    segments = [Segment(str(p["p_type"]), p["p_vaddr"], p["p_paddr"], p["p_offset"], p["p_filesz"], p["p_memsz"],
                        p["p_flags"]) for p in elf.iter_segments()]
    interp = next((p.get_interp_name() for p in elf.iter_segments() if p["p_type"] == "PT_INTERP"), None)
    thumb = elf["e_machine"] == "EM_ARM"
    symbols = _symbols(elf, ".symtab", thumb)
    dynsyms = _symbols(elf, ".dynsym", thumb)
    tags, needed = _dynamic(elf)
    linked = elf["e_type"] != "ET_REL"
    img = ElfImage(
        name=name, member=member, elfclass=elf.elfclass, little_endian=elf.little_endian,
        machine=str(elf["e_machine"]), flags=elf["e_flags"], etype=str(elf["e_type"]),
        sections=_sections(elf, segments), segments=segments, symbols=symbols or dynsyms, dynsyms=dynsyms,
        dynamic=tags, interp=interp, units=_units(elf, linked) if dwarf else [], needed=needed,
    )
    return img


AR_MAGIC, AR_THIN = b"!<arch>\n", b"!<thin>\n"
AR_HEADER = 60
AR_SYMBOL_TABLES = ("/", "/SYM64/", "__.SYMDEF", "__.SYMDEF SORTED")


def _ar_number(field: bytes, path: Path, pos: int, what: str) -> int:
    text = field.decode("latin-1").strip()
    if not text.isascii() or not text.isdigit():
        raise SizeError(f"{path}: malformed archive: member header at offset {pos} has {what} {text!r}, "
                        "not a decimal number")
    return int(text)


def _ar_members(f: BinaryIO, path: Path) -> list[tuple[str, int, int]]:
    """(name, data offset, size) of each member of a System V / GNU / BSD ar archive. Every size is
    checked against the file's, and each header starts after the last, so the walk ends."""
    magic = f.read(8)
    thin = magic == AR_THIN
    if magic not in (AR_MAGIC, AR_THIN):
        raise SizeError(f"{path}: not an ar archive")
    f.seek(0, io.SEEK_END)
    end = f.tell()
    pos, longnames, out = 8, b"", []
    while pos + AR_HEADER <= end:
        f.seek(pos)
        hdr = f.read(AR_HEADER)
        if hdr[58:60] != b"`\n":
            raise SizeError(f"{path}: corrupt archive member header at offset {pos}")
        raw, size = hdr[:16].decode("latin-1").rstrip(), _ar_number(hdr[48:58], path, pos, "size")
        data = pos + AR_HEADER
        inside = not thin or raw in ("//", *AR_SYMBOL_TABLES)  # a thin archive's members are files beside it
        if inside and data + size > end:
            raise SizeError(f"{path}: malformed archive: member at offset {pos} claims {size} bytes, past the end "
                            f"of the file ({end} bytes)")
        if raw == "//":
            f.seek(data)
            longnames = f.read(size)
        elif raw not in AR_SYMBOL_TABLES:
            if raw.startswith("#1/"):  # BSD: the name precedes the data
                n = _ar_number(raw[3:].encode("latin-1"), path, pos, "name length")
                if n > size:
                    raise SizeError(f"{path}: malformed archive: member at offset {pos} has a {n}-byte name in "
                                    f"{size} bytes")
                f.seek(data)
                name, data, size = f.read(n).rstrip(b"\0").decode("utf-8", "replace"), data + n, size - n
            elif raw.startswith("/") and raw[1:].isdigit():
                off = int(raw[1:])
                stop = longnames.find(b"\n", off)
                if off >= len(longnames) or stop < 0:
                    raise SizeError(f"{path}: malformed archive: member at offset {pos} names offset {off} of a "
                                    f"{len(longnames)}-byte name table")
                name = longnames[off:stop].decode("utf-8", "replace").rstrip("/")
            else:
                name = raw.rstrip("/")
            out.append((name, -1 if thin else data, size))
        pos = data + (size if inside else 0)
        pos += pos & 1
    return out


def open_input(path: Path, what: str) -> BinaryIO:
    """A regular file opened for reading (a FIFO or a device is refused, never waited on)."""
    try:
        return os.fdopen(open_regular(path, what), "rb")
    except ExportError as e:
        raise SizeError(str(e)) from None


def load(path: str | Path, dwarf: bool = True) -> Artifact:
    """Read an ELF file or every ELF member of an ar archive."""
    path = Path(path)
    with open_input(path, "file") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        f.seek(0)
        if head.startswith(b"\x7fELF"):
            return Artifact(path, False, size, [read_elf(f, str(path), dwarf=dwarf)])
        if head not in (AR_MAGIC, AR_THIN):
            raise SizeError(f"{path}: neither an ELF file nor an ar archive")
        images = []
        for name, start, length in _ar_members(f, path):
            label = f"{path}({name})"
            if start < 0:  # thin archive: the member is a file beside the archive
                with open_input(path.parent / name, f"member {name} of thin archive {path}") as m:
                    if m.read(4) == b"\x7fELF":
                        m.seek(0)
                        images.append(read_elf(m, label, name, dwarf))
                continue
            f.seek(start)
            if f.read(4) != b"\x7fELF":
                continue
            images.append(read_elf(Window(f, start, length), label, name, dwarf))
        return Artifact(path, True, size, images)
