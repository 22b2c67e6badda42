"""The files an export reads, listed once: a build system's dependencies for the exporter.

`export_inputs` mirrors what `checkpoint.open_checkpoint` and `export.export` open: config.json, either
model.safetensors or the index and every shard its weight_map names (shards may sit in subdirectories),
the optional colibri.json and tokenizer/generation files, and a calibration file. `exporter_sources` is
the exporter's own code (a newer exporter may write another format or plan).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from .checkpoint import INDEX_FILE, SINGLE_FILE
from .errors import ExportError
from .safeio import read_json

CONFIG_FILE = "config.json"
# Read when present: the demo's prompt, and the tokenizer and generation settings.
OPTIONAL_FILES = ("colibri.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
CODEGEN_DIR = Path(__file__).resolve().parent


def _shards(ckpt: Path) -> list[Path]:
    """The shards the index names that are files inside the checkpoint. An index that cannot be read,
    or a shard that is missing or outside the directory, is the exporter's to report: only the index
    itself is then a dependency (a fixed index changes it)."""
    try:
        index = read_json(ckpt / INDEX_FILE, "index", "index")
    except ExportError:
        return []
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        return []
    out = []
    for shard in sorted({v for v in weight_map.values() if isinstance(v, str)}):
        rel = PurePosixPath(shard)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            continue
        if (ckpt / rel).is_file():
            out.append(ckpt / rel)
    return out


def export_inputs(ckpt_dir: str | Path, *calibration: str | Path | None) -> list[Path]:
    """Every file an export of the checkpoint reads, as absolute paths, each once (calibration: the
    --prune-experts and --calib files, None where not given)."""
    ckpt = Path(ckpt_dir).absolute()
    files = [ckpt / CONFIG_FILE]
    if (ckpt / SINGLE_FILE).is_file():
        files.append(ckpt / SINGLE_FILE)
    elif (ckpt / INDEX_FILE).is_file():
        files += [ckpt / INDEX_FILE, *_shards(ckpt)]
    files += [ckpt / n for n in OPTIONAL_FILES if (ckpt / n).is_file()]
    files += [Path(c).absolute() for c in calibration if c is not None]
    return list(dict.fromkeys(files))


def exporter_sources() -> list[Path]:
    """The exporter's Python modules and templates."""
    return sorted(p for p in CODEGEN_DIR.rglob("*") if p.suffix in (".py", ".j2") and "__pycache__" not in p.parts)
