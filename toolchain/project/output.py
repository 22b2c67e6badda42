"""The -o of `colibri project`: the rule of `colibri export` (codegen/emit.check_output), with a project's marker.

-o must be missing, an empty directory, or a previous project: a directory whose every file is listed in
its MARKER, a JSON object written by `colibri project`. Anything else is refused and left untouched.
The folder is written beside -o and replaces it whole when complete.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from colibri.codegen.emit import replace_dir
from colibri.codegen.errors import ExportError

MARKER = ".colibri-project.json"
GENERATOR = "colibri project"


def _refuse(out: Path, why: str) -> ExportError:
    return ExportError(out, f"{why}; refusing to replace it (-o takes a new or empty directory, or a previous "
                            "colibri project)")


def _files(d: Path) -> set[str]:
    return {p.relative_to(d).as_posix() for p in d.rglob("*") if not p.is_dir() or p.is_symlink()}


def is_previous_project(out: Path) -> bool:
    try:
        marker = json.loads((out / MARKER).read_text(encoding="utf-8"))
        files = _files(out)
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("generator") != GENERATOR:
        return False
    listed = marker.get("files")
    return isinstance(listed, list) and files <= {*map(str, listed), MARKER}


def check_output(out: Path) -> None:
    """Refuse an -o that exists and is not an empty directory or a previous project. Touches nothing."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(out, "exists and is not a directory")
    if any(out.iterdir()) and not is_previous_project(out):
        raise _refuse(out, f"exists and is not a colibri project (no {MARKER}, or files it does not list)")


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A sibling directory to write the folder into; on success it replaces `out` whole."""
    with replace_dir(out, check_output) as tmp:
        yield tmp


def write_marker(d: Path, files: list[str], fields: dict) -> None:
    (d / MARKER).write_text(json.dumps({"generator": GENERATOR, **fields, "files": sorted(files)}, indent=1,
                                       sort_keys=True) + "\n", encoding="utf-8")
