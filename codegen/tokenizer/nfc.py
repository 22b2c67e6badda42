"""The NFC tables of the tokenizer section (runtime_c/FORMAT.md, "Tokenizer", NFC block), generated from
Python's `unicodedata` (its Unicode version: `unicodedata.unidata_version`), for runtime_c/src/text/nfc.c.

Block of u32 words: n_decomp, n_pool, n_ccc, n_comp, then
  - decompositions [2*n_decomp]: (codepoint, offset | length<<24) strictly increasing by codepoint, the
    full canonical decomposition being pool[offset : offset+length] (1..MAX_DECOMP codepoints);
  - the pool [n_pool] of codepoints;
  - canonical combining classes [2*n_ccc]: (first, last | ccc<<24) sorted, disjoint, ccc 1..255 (0 elsewhere);
  - primary composites [3*n_comp]: (first, second, composite) strictly increasing by (first, second).
Hangul syllables are decomposed and composed by rule (not in the tables), as Unicode specifies.
"""

from __future__ import annotations

import functools
import unicodedata

MAX_DECOMP = 4  # the longest full canonical decomposition (e.g. U+1F82: 4 codepoints)
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3
UNICODE_VERSION = unicodedata.unidata_version


def _canonical_pair(cp: int) -> tuple[int, int] | None:
    d = unicodedata.decomposition(chr(cp))
    if not d or d.startswith("<"):
        return None
    parts = [int(x, 16) for x in d.split()]
    return (parts[0], parts[1]) if len(parts) == 2 else None


@functools.cache
def tables() -> tuple[list[tuple[int, tuple[int, ...]]], list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """(full decompositions, combining-class ranges, primary composites) of this Python's Unicode."""
    decomp: list[tuple[int, tuple[int, ...]]] = []
    comp: list[tuple[int, int, int]] = []
    ccc: list[tuple[int, int, int]] = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        cc = unicodedata.combining(c)
        if cc:
            if ccc and ccc[-1][1] == cp - 1 and ccc[-1][2] == cc:
                ccc[-1] = (ccc[-1][0], cp, cc)
            else:
                ccc.append((cp, cp, cc))
        if HANGUL_FIRST <= cp <= HANGUL_LAST:
            continue
        d = unicodedata.normalize("NFD", c)
        if d != c:
            if len(d) > MAX_DECOMP:
                raise ValueError(f"U+{cp:04X} decomposes into {len(d)} codepoints")
            decomp.append((cp, tuple(map(ord, d))))
        pair = _canonical_pair(cp)
        if pair is not None and unicodedata.normalize("NFC", c) == c:  # not a composition exclusion
            comp.append((pair[0], pair[1], cp))
    comp.sort()
    return decomp, ccc, comp


@functools.cache
def block() -> tuple[int, ...]:
    """The NFC block's words."""
    decomp, ccc, comp = tables()
    pool: list[int] = []
    entries: list[int] = []
    index: dict[tuple[int, ...], int] = {}
    for cp, d in decomp:
        off = index.get(d)
        if off is None:
            off = index[d] = len(pool)
            pool.extend(d)
        entries += [cp, off | (len(d) << 24)]
    words = [len(decomp), len(pool), len(ccc), len(comp), *entries, *pool]
    for first, last, cc in ccc:
        words += [first, last | (cc << 24)]
    for a, b, c in comp:
        words += [a, b, c]
    return tuple(words)
