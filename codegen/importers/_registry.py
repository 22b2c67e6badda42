"""The family registry: each importer module registers itself here when imported; the CLI, synth and the
spec read the families from it (codegen/importers/__init__.py imports every family module, in order)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..spec import ModelSpec


@dataclass(frozen=True)
class View:
    """Where a canonical tensor is in a family whose files fuse or scale tensors (Granite-MoE): the source
    tensor, its shape on disk, the index that selects the canonical tensor from it, and a factor the
    importer folds into it (a multiplier of the family's config that is linear in this weight)."""

    source: str
    shape: tuple[int, ...]
    index: tuple[Any, ...] = ()
    scale: Any = 1.0  # a float, or a (rows, 1) float array: one factor per row of the canonical tensor
    transpose: bool = False  # the selected 2-D block is stored (in, out): the canonical tensor is its transpose


@dataclass(frozen=True)
class Importer:
    family: str  # ModelSpec.arch and `colibri synth --arch`
    architectures: tuple[str, ...]  # config.json "architectures"; the first is what synth writes
    model_types: tuple[str, ...]
    parse_config: Callable[[Mapping[str, Any], Path], ModelSpec]
    tensor_map: Callable[[ModelSpec], dict[str, str]]
    is_ignored: Callable[[ModelSpec, str], bool]
    source_name: Callable[[str], str]  # canonical tensor name -> the family's HF name
    # families whose tensors are not one file tensor each: (spec, config, canonical name) -> View
    view: Callable[[ModelSpec, Mapping[str, Any], str], View] | None = None


REGISTRY: dict[str, Importer] = {}


def register(importer: Importer) -> Importer:
    if importer.family in REGISTRY:
        raise RuntimeError(f"family {importer.family!r} registered twice")
    REGISTRY[importer.family] = importer
    return importer
