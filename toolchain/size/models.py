"""Weights per model in an image holding several (`scons MODEL=a,b`, toolchain/multimodel.py).

Each model's blob is its own symbol, colibri_<name>_blob_data, and its manifest lies beside the image
as <name>.manifest.json: the audit's "models" block gives each model's weights from them, tensor by
tensor as the single model's "weights" block does (weights.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from .elf import ElfImage
from .weights import Manifest, load_manifest, weights_summary

MODEL_BLOB = re.compile(r"colibri_(\w+)_blob_data")
MANIFEST_SUFFIX = ".manifest.json"


def blob_model(symbol: str) -> str | None:
    """The model whose blob symbol this is (colibri_<name>_blob_data), None for any other symbol."""
    m = MODEL_BLOB.fullmatch(symbol)
    return m.group(1) if m else None


def model_manifests(directory: Path) -> dict[str, Manifest]:
    """{name: manifest} of the <name>.manifest.json files in directory; ValueError on a malformed one."""
    out = {}
    for p in sorted(directory.glob(f"*{MANIFEST_SUFFIX}")):
        m = load_manifest(p)
        if m is not None:
            out[p.name.removesuffix(MANIFEST_SUFFIX)] = m
    return out


def models_summary(images: list[ElfImage], manifests: dict[str, Manifest]) -> dict | None:
    """{name: {symbol, weights_bytes, weights}} per model blob symbol of the images; None when there is none."""
    out = {}
    for img in images:
        for sym in img.symbols:
            name = blob_model(sym.name)
            if name is not None and sym.defined and sym.size:
                out[name] = {"symbol": sym.name, "weights_bytes": sym.size,
                             "weights": weights_summary(manifests.get(name), sym.size)}
    return dict(sorted(out.items())) or None
