"""The tokenizer's size and encode speed: the C tokenizer (colibri_text.h, through the binding) against HF
`tokenizers` (Rust) on the same text.

    .venv/bin/python bench/text.py CKPT_OR_TOKENIZER_DIR [--mb 1] [--lib libcolibri.so]

Prints the tokenizer section's bytes and, for about --mb MB of mixed text, the encode speed of both in
MB/s and whether their ids agree. (Code size on stm32h7 and time to first token under QEMU: not yet.)
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    from tokenizers import Tokenizer as HF

    from colibri.codegen.tokenizer import load_tokenizer, pack
    from colibri.runtime.text import Tokenizer

    from tokvocab import build_lib, strings

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a directory with tokenizer.json (+ tokenizer_config.json)")
    ap.add_argument("--mb", type=float, default=1.0)
    ap.add_argument("--lib", default=None, help="a library with the text runtime (default: tok.c built here)")
    a = ap.parse_args()
    section = pack(load_tokenizer(a.dir))
    lib = ctypes.CDLL(a.lib) if a.lib else build_lib(Path(tempfile.mkdtemp()))
    tok = Tokenizer.from_bytes(lib, section)
    hf = HF.from_file(str(Path(a.dir) / "tokenizer.json"))
    lines = [s for s in strings() if s]
    text, lines_used = [], 0
    while sum(map(len, text)) < a.mb * 1e6:
        text.append(lines[lines_used % len(lines)])
        lines_used += 1
    mb = sum(len(s.encode()) for s in text) / 1e6
    t0 = time.perf_counter()
    ours = [tok.encode(s, max_ids=4 * len(s.encode()) + 2) for s in text]
    t1 = time.perf_counter()
    theirs = [hf.encode(s, add_special_tokens=False).ids for s in text]
    t2 = time.perf_counter()
    print(f"tokenizer section: {len(section):,} bytes ({len(tok_pieces(section)):,} tokens)")
    print(f"encode {mb:.2f} MB: colibri C {mb / (t1 - t0):.2f} MB/s, HF tokenizers {mb / (t2 - t1):.2f} MB/s "
          f"(one call per line for both); ids agree: {ours == theirs}")
    return 0


def tok_pieces(section: bytes) -> range:
    import struct

    return range(struct.unpack_from("<I", section, 12)[0])


if __name__ == "__main__":
    sys.exit(main())
