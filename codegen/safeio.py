"""Reading input files that a user (or an attacker) controls: regular files only, bounded in size.

Every file colibri opens from a checkpoint, a calibration set or a blob goes through here, so a FIFO
never blocks, a device or a link to /dev/zero is never read to exhaustion, and a deeply nested JSON
document is one error line instead of a RecursionError. Each failure is an `ExportError` naming the file.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from .errors import ExportError

KiB, MiB = 1 << 10, 1 << 20

# The largest file of each kind colibri reads whole (safetensors data is mapped, never read whole).
LIMITS = {
    "config": 4 * MiB,  # config.json, colibri.json
    "index": 64 * MiB,  # model.safetensors.index.json (a weight map of ~100k tensors is ~10 MiB)
    "tokenizer": 64 * MiB,  # tokenizer.json (a 256k vocabulary with merges is ~20 MiB)
    "calibration": 256 * MiB,  # --prune-experts / --calib token id files
    "blob": 1 << 40,  # model.bin: bounded by the file system, mapped by the readers that can
}

# Deeper JSON than this is no checkpoint file (HF configs nest 3-4 levels).
MAX_JSON_DEPTH = 64


def file_kind(mode: int) -> str:
    """What a non-regular file is, for the error line."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | Path, what: str) -> int:
    """A read-only descriptor of a regular file (after following links). A FIFO does not block: it is
    opened non-blocking, found not to be a regular file and closed."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ExportError(p, f"{what} not found") from None
    except OSError as e:
        raise ExportError(p, f"cannot open {what}: {e.strerror or e}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ExportError(p, f"{what} is {file_kind(st.st_mode)}, not a regular file")
    os.set_blocking(fd, True)
    return fd


def check_regular(path: str | Path, what: str) -> int:
    """The size of a regular file that will be mapped or read in parts; anything else is an error."""
    fd = open_regular(path, what)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def read_bytes(path: str | Path, what: str, kind: str) -> bytes:
    """The whole of a regular file no larger than LIMITS[kind]."""
    limit = LIMITS[kind]
    fd = open_regular(path, what)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise ExportError(path, f"{what} is {size} bytes, more than the {limit}-byte limit for such a file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(size + 1)  # one byte more tells whether it grew since fstat
    except OSError as e:
        raise ExportError(path, f"cannot read {what}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) != size:
        raise ExportError(path, f"{what} changed while being read ({size} bytes at open, {len(data)} read)")
    return data


def read_text(path: str | Path, what: str, kind: str) -> str:
    data = read_bytes(path, what, kind)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ExportError(path, f"{what} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def parse_json(text: str | bytes, path: str | Path, what: str, **kw: Any) -> Any:
    """JSON with a bound on nesting, checked before the (recursive) parser sees it."""
    check_depth(text if isinstance(text, str) else text.decode("utf-8", "replace"), path, what)
    try:
        return json.loads(text, **kw)
    except RecursionError:
        raise ExportError(path, f"{what}: JSON nested too deeply") from None
    except ValueError as e:
        raise ExportError(path, f"{what}: invalid JSON: {e}") from None


def read_json(path: str | Path, what: str, kind: str = "config", **kw: Any) -> Any:
    return parse_json(read_text(path, what, kind), path, what, **kw)


_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def check_depth(text: str, path: str | Path, what: str) -> None:
    """Brackets outside strings nested deeper than MAX_JSON_DEPTH: refused (a regex scan, no recursion)."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return
    depth = 0
    for m in _TOKENS.finditer(text):
        tok = m.group()
        if tok in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise ExportError(path, f"{what}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
        elif tok in "]}":
            depth -= 1
