"""The structure of an ELF file checked against its size before pyelftools walks it.

pyelftools trusts the headers: a section table past the end of the file, an `e_shnum` of 65535, a
`.symtab` with `sh_entsize` 0 or a bad `e_shstrndx` surface as ELFParseError, ZeroDivisionError or
reads of whatever lies beyond. Here every table the audit reads is checked to lie inside the file
and to hold entries of at least their struct's size, so every count derived from it is bounded by
the file's size. Each problem is a SizeError naming the file.
"""

from __future__ import annotations

import io
import struct
from typing import BinaryIO

from .errors import SizeError

# ELF constants (gABI)
ELFCLASS32, ELFCLASS64 = 1, 2
ELFDATA2LSB, ELFDATA2MSB = 1, 2
SHT_NULL, SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_DYNAMIC, SHT_NOBITS, SHT_REL, SHT_DYNSYM = 0, 2, 3, 4, 6, 8, 9, 11
SHF_COMPRESSED = 0x800
SHN_UNDEF, SHN_XINDEX, PN_XNUM = 0, 0xFFFF, 0xFFFF

# Per class: ELF header layout after e_ident, its size, and the sizes of one entry of each table.
_LAYOUT = {
    ELFCLASS32: dict(header="HHIIIIIHHHHHH", ehdr=52, phdr=32, shdr=40, shdr_fmt="IIIIIIIIII", sym=16, rel=8,
                     rela=12, chdr=12),
    ELFCLASS64: dict(header="HHIQQQIHHHHHH", ehdr=64, phdr=56, shdr=64, shdr_fmt="IIQQQQIIQQ", sym=24, rel=16,
                     rela=24, chdr=24),
}
# A compressed section's declared inflated size: at most this (the audit reads only DWARF inflated).
MAX_INFLATED = 1 << 30


def _stream_size(stream: BinaryIO) -> int:
    end = stream.seek(0, io.SEEK_END)
    stream.seek(0)
    return end


def _read(stream: BinaryIO, offset: int, n: int) -> bytes:
    stream.seek(offset)
    return stream.read(n)


def check_elf(stream: BinaryIO, name: str) -> None:
    """Raise SizeError unless the ELF header, program header table, section header table and every
    section's data lie within the stream, with table entries of at least their struct's size."""
    size = _stream_size(stream)
    ident = _read(stream, 0, 16)
    if len(ident) < 16 or ident[:4] != b"\x7fELF":
        raise SizeError(f"{name}: not an ELF file (truncated identification)")
    cls, data = ident[4], ident[5]
    if cls not in _LAYOUT:
        raise SizeError(f"{name}: malformed ELF file: unknown ELF class {cls}")
    if data not in (ELFDATA2LSB, ELFDATA2MSB):
        raise SizeError(f"{name}: malformed ELF file: unknown data encoding {data}")
    lay = _LAYOUT[cls]
    end = "<" if data == ELFDATA2LSB else ">"
    if size < lay["ehdr"]:
        raise SizeError(f"{name}: truncated ELF file: {size} bytes, shorter than its {lay['ehdr']}-byte header")
    (_type, _machine, _version, _entry, phoff, shoff, _flags, _ehsize, phentsize, phnum, shentsize, shnum,
     shstrndx) = struct.unpack(end + lay["header"], _read(stream, 16, lay["ehdr"] - 16))

    def table(what: str, offset: int, count: int, entsize: int, minimum: int) -> None:
        if count and entsize < minimum:
            raise SizeError(f"{name}: malformed ELF file: {what} entries of {entsize} bytes, less than {minimum}")
        if count and offset + count * entsize > size:
            raise SizeError(f"{name}: malformed ELF file: {what} ({count} entries of {entsize} bytes at offset "
                            f"{offset}) ends past the end of the file ({size} bytes)")

    sections: list[tuple[int, ...]] = []
    if shoff:
        table("section header table", shoff, 1, shentsize, lay["shdr"])
        first = struct.unpack(end + lay["shdr_fmt"], _read(stream, shoff, lay["shdr"]))
        count = first[5] if shnum == 0 else shnum  # sh_size of section 0 holds a count >= SHN_LORESERVE
        table("section header table", shoff, count, shentsize, lay["shdr"])
        sections = [struct.unpack(end + lay["shdr_fmt"], _read(stream, shoff + i * shentsize, lay["shdr"]))
                    for i in range(count)]
        if phnum == PN_XNUM:
            phnum = first[7]  # sh_info of section 0
        strndx = first[6] if shstrndx == SHN_XINDEX else shstrndx  # sh_link of section 0
        if strndx != SHN_UNDEF and (strndx >= count or sections[strndx][1] != SHT_STRTAB):
            raise SizeError(f"{name}: malformed ELF file: e_shstrndx {strndx} is not a string table "
                            f"(the file has {count} sections)")
    table("program header table", phoff, phnum, phentsize, lay["phdr"])
    for i in range(phnum):
        raw = _read(stream, phoff + i * phentsize, lay["phdr"])
        if cls == ELFCLASS32:  # p_type, p_offset, p_vaddr, p_paddr, p_filesz, ...
            (p_offset,), (p_filesz,) = struct.unpack_from(end + "I", raw, 4), struct.unpack_from(end + "I", raw, 16)
        else:  # p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, ...
            (p_offset,), (p_filesz,) = struct.unpack_from(end + "Q", raw, 8), struct.unpack_from(end + "Q", raw, 32)
        if p_filesz and p_offset + p_filesz > size:
            raise SizeError(f"{name}: malformed ELF file: program header {i}'s data ({p_filesz} bytes at offset "
                            f"{p_offset}) ends past the end of the file ({size} bytes)")
    entries = {SHT_SYMTAB: lay["sym"], SHT_DYNSYM: lay["sym"], SHT_REL: lay["rel"], SHT_RELA: lay["rela"]}
    for i, (_name, sh_type, sh_flags, _addr, sh_offset, sh_size, sh_link, _info, _align, sh_entsize) in \
            enumerate(sections):
        if sh_type in (SHT_NULL, SHT_NOBITS):
            continue
        if sh_size and sh_offset + sh_size > size:
            raise SizeError(f"{name}: malformed ELF file: section {i}'s data ({sh_size} bytes at offset {sh_offset}) "
                            f"ends past the end of the file ({size} bytes)")
        if sh_type in entries:
            if sh_entsize < entries[sh_type]:
                raise SizeError(f"{name}: malformed ELF file: section {i} has entries of {sh_entsize} bytes, "
                                f"less than {entries[sh_type]}")
            if sh_link >= len(sections):
                raise SizeError(f"{name}: malformed ELF file: section {i} links to section {sh_link} "
                                f"(the file has {len(sections)} sections)")
        if sh_flags & SHF_COMPRESSED:
            if sh_size < lay["chdr"]:
                raise SizeError(f"{name}: malformed ELF file: compressed section {i} is shorter than its header")
            raw = _read(stream, sh_offset, lay["chdr"])
            inflated = struct.unpack_from(end + ("I" if cls == ELFCLASS32 else "Q"), raw,
                                          4 if cls == ELFCLASS32 else 8)[0]
            if inflated > MAX_INFLATED:
                raise SizeError(f"{name}: malformed ELF file: compressed section {i} claims {inflated} bytes "
                                f"inflated, more than {MAX_INFLATED}")
