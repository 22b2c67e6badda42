"""The -o of `colibri project`: the rule of `colibri export` (codegen/emit.check_output), with a project's marker.

-o must be missing, an empty directory, or a previous project: a directory whose every file is listed in
its MARKER, a JSON object written by `colibri project`. Anything else is refused and left untouched.
The folder is written beside -o and replaces it whole when complete.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from colibri.codegen.emit import output_lock
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
    out = Path(os.path.abspath(out))
    if not out.name:
        raise _refuse(out, "is the root directory")
    check_output(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out):
        check_output(out)
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        old = out.parent / f".{out.name}.tmp-{os.getpid()}-old"
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)


def write_marker(d: Path, files: list[str], fields: dict) -> None:
    (d / MARKER).write_text(json.dumps({"generator": GENERATOR, **fields, "files": sorted(files)}, indent=1,
                                       sort_keys=True) + "\n", encoding="utf-8")
