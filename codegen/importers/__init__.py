"""Model-family importers: each maps its config to a ModelSpec and its tensor names to canonical ones."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ExportError
from ._registry import REGISTRY, Importer, View

# isort: off
from . import mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek, dense, granitemoe, gpt_oss, deepseek_v2  # noqa: E402,F401 (each registers itself: this order)
# isort: on

__all__ = ["FAMILIES", "IMPORTERS", "Importer", "View", "find_importer"]

IMPORTERS: tuple[Importer, ...] = tuple(REGISTRY.values())
FAMILIES: tuple[str, ...] = tuple(REGISTRY)


def find_importer(config: Mapping[str, Any], config_path: Path) -> Importer:
    """The importer for a config.json: by `architectures[0]` when given, else by `model_type`."""
    supported = ", ".join(a for imp in IMPORTERS for a in imp.architectures)
    archs = config.get("architectures")
    if archs is not None:
        if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
            raise ExportError(config_path, f"key 'architectures': expected a list of names, got {archs!r}")
        for imp in IMPORTERS:
            if archs[0] in imp.architectures:
                return imp
        raise ExportError(config_path, f"unsupported architecture {archs[0]!r} (supported: {supported})")
    model_type = config.get("model_type")
    for imp in IMPORTERS:
        if model_type in imp.model_types:
            return imp
    raise ExportError(config_path, f"unsupported model_type {model_type!r} and no 'architectures' "
                                   f"(supported: {supported})")
