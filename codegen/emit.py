"""Rendering of the generated sources and the all-or-nothing output directory."""

from __future__ import annotations

import fcntl
import functools
import os
import re
import shutil
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import jinja2

from .errors import ExportError
from .safeio import file_kind, read_json

TEMPLATES = ("model.h", "model.c", "model_blob.S")
MANIFEST = "manifest.json"
# Every file an export writes; a directory holding only these, with a manifest.json whose "generator"
# names colibri, is a previous export and may be replaced.
# tokenizer.bin: the tokenizer section, written beside model.bin by earlier versions (now inside model.bin);
# still a file of a previous export that may be replaced
EXPORT_FILES = frozenset((*TEMPLATES, "model.bin", MANIFEST, "tokenizer.bin"))
GENERATOR_PREFIX = "colibri "  # manifest.json's "generator": "colibri <version>"


def c_identifier(name: str) -> str:
    """A checkpoint directory's name made safe for C identifiers and file names (ASCII letters, digits, _)."""
    ident = re.sub(r"[^A-Za-z0-9_]", "_", name.strip("/").split("/")[-1]) or "model"
    return f"m_{ident}" if ident[0].isdigit() else ident


_PLAIN = re.compile(r"[A-Za-z0-9 _.,:;+=@()\[\]<>#%&!~^'-]")


def c_comment_text(text: str) -> str:
    """Any string made safe inside a C comment and a C string literal: characters that mean nothing
    there (no '*', '/', '?', quote, backslash or control character: no comment end, trigraph or escape)
    kept, each other one spelt <U+XXXX> (a non-UTF-8 byte of a file name is U+DC80..U+DCFF)."""
    return "".join(ch if _PLAIN.fullmatch(ch) else f"<U+{ord(ch):04X}>" for ch in text)


def _finalize(value: Any) -> Any:
    """Every {{ value }} of the templates passes here: no Python-only spelling reaches C."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"template value {value!r} has no C spelling")
    if isinstance(value, int) and not -(1 << 63) <= value < 1 << 64:
        raise ValueError(f"template value {value} does not fit a 64-bit C constant")
    if isinstance(value, str):
        return c_comment_text(value)
    return value


@functools.cache
def templates() -> dict[str, jinja2.Template]:
    """The compiled templates (compiled once per process: most of a small export's time otherwise)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("colibri.codegen", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=_finalize,
    )
    return {name: env.get_template(f"{name}.j2") for name in TEMPLATES}


def render_sources(out_dir: Path, context: dict) -> None:
    for key in ("prompt", "prompt_text", "chat_prefix", "chat_suffix", "sampling_stop"):
        if any(isinstance(t, bool) or not isinstance(t, int) for t in context[key]):
            raise ValueError(f"template {key} holds a non-integer")
    for name in TEMPLATES:
        text = templates()[name].render(**context)
        with unnamed_file(out_dir / name) as f:
            f.write(text.encode("ascii"))


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


def _describe(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISREG(mode):
        return "a file"
    return file_kind(mode)


def _refuse(out_dir: Path, why: str) -> ExportError:
    return ExportError(out_dir, f"{why}; refusing to replace it (-o takes a new or empty directory, or a "
                                "previous colibri export)")


def is_previous_export(out_dir: Path) -> bool:
    """A directory holding only an export's files, with a manifest.json whose "generator" names colibri."""
    try:
        names = {p.name for p in out_dir.iterdir()}
    except OSError:
        return False
    if MANIFEST not in names or not names <= EXPORT_FILES:
        return False
    try:
        manifest = read_json(out_dir / MANIFEST, MANIFEST, kind="index")
    except ExportError:
        return False
    return isinstance(manifest, dict) and str(manifest.get("generator", "")).startswith(GENERATOR_PREFIX)


def check_output(out_dir: Path, protect: tuple[Path, ...] = ()) -> None:
    """Refuse an -o that is, contains or lies inside a protected directory (the checkpoint), or that exists
    and is anything but an empty directory or a previous export. Touches nothing."""
    try:
        real = out_dir.resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise _refuse(out_dir, f"cannot be resolved ({e})") from None
    for p in protect:
        q = Path(p).resolve()
        if real == q or q in real.parents or real in q.parents:
            rel = "is" if real == q else "lies inside" if q in real.parents else "contains"
            raise _refuse(out_dir, f"the output directory {rel} the checkpoint directory {p}")
    try:
        st = os.lstat(out_dir)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(out_dir, f"exists and is {_describe(st.st_mode)}, not a directory")
    if any(out_dir.iterdir()) and not is_previous_export(out_dir):
        raise _refuse(out_dir, f"exists and is not a colibri export (files other than "
                               f"{', '.join(sorted(EXPORT_FILES))}, or no {MANIFEST} of colibri)")


@contextmanager
def output_lock(out_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on `.<name>.lock` beside out_dir: concurrent exports to one directory run one
    after the other. The file is removed on release; a waiter that locked a removed file tries again."""
    path = out_dir.parent / f".{out_dir.name}.lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"colibri: waiting for another export to {out_dir} to finish", file=sys.stderr)
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            break
        os.close(fd)  # its holder removed it when done: lock the new one
    try:
        yield
    finally:
        try:
            os.unlink(path)
        finally:
            os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(out_dir: Path) -> None:
    """Staging directories of exports that died (SIGKILL, power loss): `.<name>.tmp-<pid>[-old]` whose
    process is gone. Called with the lock held, so no live export of this directory owns one."""
    stale = re.compile(re.escape(f".{out_dir.name}.tmp-") + r"(\d+)(-old)?")
    for p in out_dir.parent.iterdir():
        m = stale.fullmatch(p.name)
        if m and (int(m.group(1)) == os.getpid() or not _pid_alive(int(m.group(1)))):
            shutil.rmtree(p, ignore_errors=True)


@contextmanager
def staged_dir(out_dir: Path, protect: tuple[Path, ...] = ()) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces out_dir whole.

    out_dir must be missing, an empty directory or a previous export (check_output), and neither the
    checkpoint nor around it (`protect`); else ExportError and nothing is touched. A lock beside out_dir
    is held throughout, so a second export to the same directory waits for the first. On any error (or an
    interrupted export) out_dir is left as it was. Files written with unnamed_file appear in it only when
    complete; the empty staging directory of a killed export is removed by the next run.
    """
    with replace_dir(out_dir, lambda d: check_output(d, protect)) as tmp:
        yield tmp


@contextmanager
def replace_dir(out_dir: Path, check: Callable[[Path], None]) -> Iterator[Path]:
    """The all-or-nothing swap behind every -o: `check` (which raises to refuse) before taking the lock
    beside out_dir and again under it, then a fresh staging sibling that replaces out_dir whole on success
    and is removed on any error."""
    out_dir = Path(os.path.abspath(out_dir))
    if not out_dir.name:
        raise ExportError(out_dir, "is the root directory; refusing to replace it")
    check(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out_dir):
        check(out_dir)  # again: it may have changed while we waited
        _remove_stale(out_dir)
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
