"""Rendering of the generated sources and the all-or-nothing output directory."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import jinja2

TEMPLATES = ("model.h", "model.c", "model_blob.S")


def c_identifier(name: str) -> str:
    """A checkpoint directory's name made safe for C identifiers and file names."""
    ident = re.sub(r"[^A-Za-z0-9_]", "_", name.strip("/").split("/")[-1]) or "model"
    return f"m_{ident}" if ident[0].isdigit() else ident


def render_sources(out_dir: Path, context: dict) -> None:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("colibri.codegen", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    for name in TEMPLATES:
        text = env.get_template(f"{name}.j2").render(**context)
        (out_dir / name).write_text(text)


@contextmanager
def staged_dir(out_dir: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces out_dir whole.

    On any error (or an interrupted export) out_dir is left as it was. Stale
    staging directories of killed exports are removed on the next run.
    """
    out_dir = Path(out_dir).absolute()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.parent.glob(f".{out_dir.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-old"
    if out_dir.exists():
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)
