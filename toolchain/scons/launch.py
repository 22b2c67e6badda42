"""One C compile through a launcher (CC_LAUNCHER=, DISTCC=1), with the analysis files a local compile writes.

`python -m colibri.toolchain.scons.launch LAUNCHER... -- CC ARGS...` runs `LAUNCHER... CC ARGS...`. GCC
writes `-fstack-usage` (.su) and `-fcallgraph-info` (.ci) files beside the object; they bound a firmware
image's stack (toolchain/size/stack.py), and launchers lose them: distcc's protocol returns the object
only (the files stay in distccd's temporary directory), ccache before 4.10 restores a .su but not a .ci.
Here:
  - a remote launcher (distcc, icecc) compiles the object without the analysis options (the server
    writes nothing beside it; the options change no code and, with -gno-record-gcc-switches, no
    debug info), while this machine compiles the same command to assembly (-S, -g0: no assembler, no
    debug info) in a temporary directory for the .su/.ci only, at the same time;
  - any other launcher (ccache) compiles as given; an analysis file it did not write (a cache hit that
    does not restore it) comes from the same local -S compile afterwards.
The analysis files are those a plain compile writes, byte for byte (tests/test_distcc.py). A command
without -c, -o or analysis options runs as it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REMOTE = ("distcc", "icecc")  # launchers that compile on another machine and return the object only
SEPARATOR = "--"


def analysis_suffixes(args: list[str]) -> list[str]:
    """The analysis files (suffixes) a GCC compile of args writes beside its object."""
    out = []
    if "-fstack-usage" in args:
        out.append(".su")
    if any(a == "-fcallgraph-info" or a.startswith("-fcallgraph-info=") for a in args):
        out.append(".ci")
    return out


def is_analysis(arg: str) -> bool:
    return arg == "-fstack-usage" or arg == "-fcallgraph-info" or arg.startswith("-fcallgraph-info=")


def _output(args: list[str]) -> int | None:
    """The index of the object path (after -o), None without one."""
    for i, a in enumerate(args[:-1]):
        if a == "-o":
            return i + 1
    return None


def analysis_command(args: list[str], out: int, tmp: Path) -> list[str]:
    """The compile to assembly in tmp that writes the same analysis files (GCC names them after -o)."""
    stem = Path(args[out]).stem
    argv = ["-S" if a == "-c" else a for a in args]
    argv[out] = str(tmp / f"{stem}.s")
    return argv + ["-g0"]


def run(launcher: list[str], cc: list[str]) -> int:
    out = _output(cc)
    wanted = analysis_suffixes(cc)
    if out is None or "-c" not in cc or not wanted:
        return subprocess.call(launcher + cc)
    obj = Path(cc[out])
    files = [obj.with_suffix(s) for s in wanted]
    for f in files:  # a stale one must not pass for this compile's
        f.unlink(missing_ok=True)
    remote = os.path.basename(launcher[0]) in REMOTE if launcher else False
    tmp = Path(tempfile.mkdtemp(prefix=f".{obj.stem}-", dir=obj.parent))
    try:
        local_argv = analysis_command(cc, out, tmp)
        if remote:
            local = subprocess.Popen(local_argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                rc = subprocess.call(launcher + [a for a in cc if not is_analysis(a)])
            finally:  # no compile outlives this one (a launcher that cannot start included)
                _, err = local.communicate()
            local_rc = local.returncode
        else:
            rc = subprocess.call(launcher + cc)
            if rc != 0 or all(f.is_file() for f in files):  # a compile here, or a cache that restores them
                return rc
            done = subprocess.run(local_argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            err, local_rc = done.stderr, done.returncode
        if rc != 0:
            return rc  # the launcher's compile has said why
        if local_rc != 0:
            sys.stderr.write(err.decode("utf-8", "replace"))
            print(f"colibri: {obj}: the local compile of its analysis files failed", file=sys.stderr)
            return local_rc
        for f in files:  # those the compile wrote (clang writes no .su for a unit without functions)
            made = tmp / f.name
            if made.is_file():
                os.replace(made, f)
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> int:
    if SEPARATOR not in argv:
        print(f"usage: python -m {__spec__.name if __spec__ else 'launch'} LAUNCHER... -- CC ARGS...",
              file=sys.stderr)
        return 2
    i = argv.index(SEPARATOR)
    try:
        return run(argv[:i], argv[i + 1:])
    except OSError as e:
        print(f"colibri: {argv[0] if argv else 'launcher'}: {e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
