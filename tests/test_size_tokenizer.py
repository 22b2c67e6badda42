"""`colibri size` shows the blob's tokenizer section as its own category, "tokenizer", on the model .so, the
.a and colibri_demo: its bytes are the manifest's, and the bytes it names are, read from the ELF file at
the blob symbol's address (readelf), exactly the section blobread.py finds in model.bin."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from test_demo_text import text_ckpt

import blobread
from conftest import BIN


@pytest.fixture(scope="module")
def out(tmp_path_factory, build_model):
    return build_model(text_ckpt(tmp_path_factory), "int8c", "host")


def _size(path) -> dict:
    # the categories and the weights, not the stack audit (test_size's), which would double the run's time
    res = subprocess.run([str(BIN / "colibri"), "size", "--json", "--no-stack", str(path)], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _elf_bytes(path, symbol: str, offset: int, n: int) -> bytes:
    """n bytes at symbol + offset of a linked ELF file, located by readelf (symbol value, section headers)."""
    syms = subprocess.run(["readelf", "-sW", str(path)], capture_output=True, text=True, check=True).stdout
    value = next(int(m.group(1), 16) for m in re.finditer(r"^\s*\d+:\s+([0-9a-f]+)\s+\d+\s+\w+\s+\w+\s+\w+\s+\S+\s+"
                                                           + re.escape(symbol) + r"$", syms, re.M))
    secs = subprocess.run(["readelf", "-SW", str(path)], capture_output=True, text=True, check=True).stdout
    for m in re.finditer(r"\]\s+\S+\s+\w+\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)", secs):
        addr, off, size = (int(x, 16) for x in m.groups())
        if addr and addr <= value < addr + size:
            with open(path, "rb") as f:
                f.seek(off + value - addr + offset)
                return f.read(n)
    raise AssertionError(f"{symbol} in no section of {path}")


@pytest.mark.parametrize("artifact", ["libcolibri_demotext.so", "libcolibri_demotext.a", "colibri_demo"])
def test_tokenizer_is_its_own_category(out, artifact):
    manifest = json.loads((out / "manifest.json").read_text())
    tok = manifest["tokenizer"]
    section = blobread.tokenizer_section((out / "model.bin").read_bytes())
    assert tok["bytes"] == len(section) > 0
    r = _size(out / artifact)
    cats = {c["key"]: c for c in r["categories"]}
    assert cats["tokenizer"]["bytes"] == tok["bytes"] == cats["tokenizer"]["flash"]
    assert cats["weights"]["bytes"] + cats["tokenizer"]["bytes"] == manifest["blob"]["bytes"]
    assert r["weights"]["by_kind"]["tokenizer"] == tok["bytes"]
    if artifact != "libcolibri_demotext.a":  # a linked file: the bytes at the blob symbol are the section
        assert _elf_bytes(out / artifact, "colibri_blob_data", tok["offset"], tok["bytes"]) == section
