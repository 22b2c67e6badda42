"""Model-family importers: each maps its config to a ModelSpec and its tensor names to canonical ones."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ExportError
from ..spec import ModelSpec
from . import deepseek, mixtral, olmoe, qwen2_moe, qwen3_moe


@dataclass(frozen=True)
class Importer:
    family: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    parse_config: Callable[[Mapping[str, Any], Path], ModelSpec]
    tensor_map: Callable[[ModelSpec], dict[str, str]]
    is_ignored: Callable[[ModelSpec, str], bool]


IMPORTERS: tuple[Importer, ...] = (
    Importer("mixtral", mixtral.ARCHITECTURES, mixtral.MODEL_TYPES, mixtral.parse_config, mixtral.tensor_map,
             mixtral.is_ignored),
    *(Importer(m.__name__.rsplit(".", 1)[-1], m.ARCHITECTURES, m.MODEL_TYPES, m.parse_config, m.tensor_map,
               m.is_ignored) for m in (qwen2_moe, qwen3_moe, olmoe, deepseek)),
)


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
