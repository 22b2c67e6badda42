"""Rendering of the generated sources and the all-or-nothing output directory."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

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
        with unnamed_file(out_dir / name) as f:
            f.write(text.encode())


@contextmanager
def unnamed_file(path: Path) -> Iterator[BinaryIO]:
    """A read/write file that gets its name only once it is complete.

    On Linux it is an O_TMPFILE inode linked in at the end, so an export killed
    with SIGKILL leaves no partial file behind; elsewhere a plain file."""
    flags = getattr(os, "O_TMPFILE", 0)
    try:
        fd = os.open(path.parent, flags | os.O_RDWR, 0o644) if flags else -1
    except OSError:  # a file system without O_TMPFILE
        fd = -1
    if fd < 0:
        with open(path, "w+b") as f:
            yield f
        return
    with os.fdopen(fd, "w+b") as f:
        yield f
        f.flush()
        # linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/N names the inode without privileges; passing
        # dir fds makes CPython call linkat (plain link() would link the /proc symlink itself)
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.link(f"/proc/self/fd/{fd}", path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=True)
        finally:
            os.close(dir_fd)


@contextmanager
def staged_dir(out_dir: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces out_dir whole.

    On any error (or an interrupted export) out_dir is left as it was. Files
    written with unnamed_file appear in it only when complete; the empty staging
    directory of a killed export is removed by the next run.
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
