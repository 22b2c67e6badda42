"""One build at a time per build directory: an fcntl lock held for the whole SCons run.

Two builds sharing a build directory share its signature database and its generated sources (an
export replaces build/gen/<key>/ as a whole), so a second build waits for the first, saying so once.
"""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import IO

LOCK_NAME = ".colibri.lock"

_held: list[IO] = []  # the open lock file lives as long as the SCons process


def hold_build_lock(build: Path) -> Path:
    """Block until this process holds build/.colibri.lock; returns the lock file's path."""
    path = build / LOCK_NAME
    f = open(path, "a+")  # noqa: SIM115 - held until the process exits
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"colibri: waiting for another build in {build} to finish (lock {path})", flush=True)
        fcntl.flock(f, fcntl.LOCK_EX)
    _held.append(f)
    return path
