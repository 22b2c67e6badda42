"""CC_LAUNCHER=<program> (or DISTCC=1 for distcc): a program that every C compile of every target runs through.

ccache, distcc, sccache, icecc...: `CC_LAUNCHER="ccache"` makes each compile `ccache <cc> <flags>`.
The option is split into words (shlex) and reaches the command as separate arguments, escaped for
SCons and run without a shell (safe.py). It sits between `$(` and `$)`: not part of the build
signature, so CACHE=dir is shared by builds with and without it. Assembly files are not launched:
model_blob.S .incbin's the blob, which a remote assembler would not have. The launcher's own
settings (DISTCC_HOSTS, CCACHE_DIR, ...) pass from the environment. The launcher runs inside
toolchain/scons/launch.py, which gives each object the .su/.ci files a local compile writes (the
stack bound's input), whatever the launcher returns.
"""

from __future__ import annotations

import os
import shlex
import sys

from .launch import SEPARATOR
from .safe import escape_all

VAR = "COLIBRI_LAUNCHER"
WRAPPER = "colibri.toolchain.scons.launch"  # python -m WRAPPER LAUNCHER... -- CC ARGS...
PREFIX = "$( ${COLIBRI_LAUNCHER} $)"
COMS = ("CCCOM", "SHCCCOM")  # SCons's C compiles; toolchain/scons/firmware.py's C_COM starts with PREFIX too
ENV_PREFIXES = ("DISTCC_", "CCACHE_", "SCCACHE_", "ICECC_")


class LauncherError(ValueError):
    pass


def parse(arguments: dict) -> list[str]:
    """The launcher's argument list from the command line's CC_LAUNCHER= and DISTCC= ([] for none)."""
    text = arguments.get("CC_LAUNCHER", "")
    distcc = arguments.get("DISTCC", "0")
    if distcc not in ("0", "1", ""):
        raise LauncherError(f"DISTCC={distcc}: expected 1 or 0")
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise LauncherError(f"CC_LAUNCHER={text}: {e}") from None
    if distcc == "1":
        if argv and os.path.basename(argv[0]) != "distcc":
            raise LauncherError(f"DISTCC=1 and CC_LAUNCHER={text}: give one launcher")
        argv = argv or ["distcc"]
    return argv


def use(env, argv: list[str]) -> None:
    """Run every C compile of env (and of its clones) through argv."""
    env[VAR] = escape_all([sys.executable, "-m", WRAPPER, *argv, SEPARATOR] if argv else [])
    if argv:
        env["ENV"].update({k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)})
        if "HOME" in os.environ:  # ccache and distcc keep their state under it
            env["ENV"].setdefault("HOME", os.environ["HOME"])


def generate(env) -> None:
    env[VAR] = []
    for com in COMS:
        env[com] = f"{PREFIX} {env[com]}"


def exists(env) -> bool:  # noqa: ARG001
    return True
