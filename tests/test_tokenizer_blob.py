"""The tokenizer section inside model.bin (FORMAT.md "Tokenizer"): colibri_tok_from_blob finds it through the
table's TOKENIZER entry and gives HF tokenizers' ids; a blob without it is COLIBRI_TOK_E_NONE, an entry that
points past the blob or a section cut short COLIBRI_TOK_E_SECTION, never a read outside the blob (the
library is built with ASan/UBSan-clean flags by tokvocab.build_lib; the blob checks of blob.c are replayed
by test_fuzz.py on runtime_c/test/regress/*tokenizer*)."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest

import blobread
from tokvocab import build_lib

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))

E_SECTION, E_NONE = -102, -108
TEXTS = ["Hello world, hello there.", "123+456=579", "<|endoftext|>x", ""]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return build_lib(tmp_path_factory.mktemp("tokblob"))


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    from make_fuzz_regressions import tokenizer_seed

    return tokenizer_seed(tmp_path_factory.mktemp("tokseed"))


def _from_blob(lib, raw: bytes):
    from colibri.runtime.text import Tokenizer

    buf = np.frombuffer(bytes(raw) + b"\0" * (-len(raw) % 64), dtype=np.uint8).copy()
    return Tokenizer(lib, buf.ctypes.data, len(raw), buf, in_blob=True)


def _status(lib, raw: bytes) -> int:
    from colibri.runtime.text import TokenizerError

    try:
        _from_blob(lib, raw)
    except TokenizerError as e:
        return e.status
    return 0


def test_from_blob_gives_hf_ids(lib, seed):
    from tokenizers import Tokenizer as HF

    hf = HF.from_file(str(seed.parent.parent.parent / "ckpt" / "tok" / "tokenizer.json"))
    tok = _from_blob(lib, seed.read_bytes())
    for text in TEXTS:
        ids = hf.encode(text, add_special_tokens=False).ids
        assert tok.encode(text) == ids, text
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=False)


def test_blob_without_the_flag_has_none(lib, seed):
    raw = bytearray(seed.read_bytes())
    struct.pack_into("<I", raw, 28, blobread.header(bytes(raw))["flags"] & ~blobread.TOKENIZER_FLAG)
    assert _status(lib, bytes(raw)) == E_NONE


@pytest.mark.parametrize("what", ["cut_short", "past_end", "huge_offset", "wrong_kind", "table_past_end"])
def test_bad_entry_or_section_is_refused(lib, seed, what):
    raw = bytearray(seed.read_bytes())
    last = blobread.entry_offset(blobread.header(bytes(raw))["n_tensors"] - 1)
    rows = struct.unpack_from("<I", raw, last + 8)[0]
    if what == "cut_short":  # the entry says 4 bytes fewer than the section's own total
        struct.pack_into("<I", raw, last + 8, rows - 4)
    elif what == "past_end":
        struct.pack_into("<I", raw, last + 8, len(raw))
    elif what == "huge_offset":
        struct.pack_into("<Q", raw, last + 32, (1 << 64) - 64)
    elif what == "wrong_kind":
        struct.pack_into("<H", raw, last, 14)
    else:  # n_tensors beyond what the blob holds
        struct.pack_into("<I", raw, 24, len(raw))
    assert _status(lib, bytes(raw)) == E_SECTION


def test_inspect_shows_the_section(seed):
    """colibri inspect: the section's bytes on their own line, not counted as weights; the TOKENIZER flag is
    no model feature (the family stays Mixtral)."""
    from colibri.codegen.inspect import format_report, inspect

    raw = seed.read_bytes()
    info = inspect(seed)
    assert info["tokenizer_bytes"] == len(blobread.tokenizer_section(raw))
    assert info["family"] == "mixtral-like" and "quantization" in info and "?7" not in info["quantization"]
    assert f"tokenizer section: {len(blobread.tokenizer_section(raw)):,} bytes" in format_report(info)
