"""A `Tokenizer` -> the bytes of the blob's tokenizer section (layout: runtime_c/FORMAT.md, "Tokenizer").

All words little-endian u32. Header (16 words), then in order: piece offsets [n_vocab+1], ids sorted by
their piece bytes [n_vocab], merges sorted by (left, right) as (left, right, rank, merged) [4*n_merges],
added tokens as id | special<<31 [n_added], the 256 byte tokens, the Unicode ranges of each category the
pre-tokenizer uses (L, N; DeepSeek: its letter class as L) and, with NFC, of the NFC-unsafe codepoints (Q),
as inclusive (first, last) pairs, with NFC the NFC block (codegen/tokenizer/nfc.py), then the piece bytes
padded to 4.
"""

from __future__ import annotations

import functools
import struct
import unicodedata

from . import nfc
from .load import Tokenizer

MAGIC = 0x4B4F5443  # "CTOK"
VERSION = 2
HEADER_WORDS = 16
NONE = 0xFFFFFFFF
FLAG_IGNORE_MERGES, FLAG_BYTE_FALLBACK, FLAG_NFC = 1, 2, 4
PREPEND_SHIFT = 3  # 2 bits: 0 never, 1 Metaspace first, 2 Metaspace always, 3 normalizer Prepend
FLAG_ADD_BOS, FLAG_ADD_EOS = 1 << 5, 1 << 6


@functools.cache
def category_ranges(prefix: str) -> tuple[tuple[int, int], ...]:
    """Inclusive codepoint ranges whose general category starts with `prefix` ("L", "N")."""
    out: list[tuple[int, int]] = []
    start = None
    for cp in range(0x110001):
        inside = cp <= 0x10FFFF and unicodedata.category(chr(cp)).startswith(prefix)
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            out.append((start, cp - 1))
            start = None
    return tuple(out)


def _ranges(cps: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for cp in cps:
        if out and out[-1][1] == cp - 1:
            out[-1] = (out[-1][0], cp)
        else:
            out.append((cp, cp))
    return out


@functools.cache
def nfc_unsafe_ranges() -> tuple[tuple[int, int], ...]:
    """Codepoints whose presence may make NFC change a text: NFC_Quick_Check No or Maybe (the second
    character of a canonical composition) or a non-zero combining class. A text without them is NFC."""
    second = set()
    for cp in range(0x110000):
        d = unicodedata.normalize("NFD", chr(cp))
        second.update(ord(c) for c in d[1:])
    second.update(range(0x1161, 0x1176))  # Hangul V and T jamo compose by rule, not by table
    second.update(range(0x11A8, 0x11C3))
    unsafe = [cp for cp in range(0x110000)
              if cp in second or unicodedata.combining(chr(cp)) or not unicodedata.is_normalized("NFC", chr(cp))]
    return tuple(_ranges(unsafe))


def _opt(v: int | None) -> int:
    return NONE if v is None else v


def pack(tok: Tokenizer) -> bytes:
    n = len(tok.pieces)
    offs = [0]
    for p in tok.pieces:
        offs.append(offs[-1] + len(p))
    blob = b"".join(tok.pieces)
    n_piece_bytes = len(blob)
    blob += b"\0" * (-len(blob) % 4)
    order = sorted(range(n), key=lambda i: (tok.pieces[i], i))
    merges = sorted((left, right, rank, merged) for rank, (left, right, merged) in enumerate(tok.merges))
    ids = {p: i for i, p in reversed(list(enumerate(tok.pieces)))}
    byte_tok = list(tok.byte_ids)
    for b in range(256 if not byte_tok else 0):
        key = bytes([b]) if tok.kind == 2 else f"<0x{b:02X}>".encode()
        byte_tok.append(ids.get(key, NONE) if tok.kind == 2 or tok.byte_fallback else NONE)
    ranges = {c: tok.class_ranges.get(c) or category_ranges(c) for c in tok.categories}
    if tok.nfc:
        ranges["Q"] = nfc_unsafe_ranges()
    flags = ((FLAG_IGNORE_MERGES if tok.ignore_merges else 0) | (FLAG_BYTE_FALLBACK if tok.byte_fallback else 0)
             | (FLAG_NFC if tok.nfc else 0) | (tok.prepend << PREPEND_SHIFT)
             | (FLAG_ADD_BOS if tok.add_bos else 0) | (FLAG_ADD_EOS if tok.add_eos else 0))
    words: list[int] = []
    words += offs
    words += order
    for m in merges:
        words += m
    words += [i | (1 << 31 if special else 0) for i, special in tok.added]
    words += byte_tok
    for c in ("L", "N", "Q"):
        for a, b in ranges.get(c, []):
            words += [a, b]
    nfc_block = nfc.block() if tok.nfc else ()
    words += nfc_block
    body = struct.pack(f"<{len(words)}I", *words) + blob
    total = HEADER_WORDS * 4 + len(body)
    header = [MAGIC, VERSION, tok.kind | (tok.pretok << 8) | (flags << 16), n, len(merges), len(tok.added),
              _opt(tok.bos), _opt(tok.eos), _opt(tok.unk), len(ranges.get("L", [])), len(ranges.get("N", [])),
              n_piece_bytes, total, len(ranges.get("Q", [])), len(nfc_block), 0]
    return struct.pack(f"<{HEADER_WORDS}I", *header) + body
