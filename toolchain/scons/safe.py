"""User strings in a SCons build: paths become nodes, other strings are escaped, and no shell runs.

SCons substitutes `$...` (evaluating `${...}` as Python) in every string it is given as a source,
target, flag, message or command, and on POSIX runs each command line through `sh -c`, quoting
arguments only for spaces (backquotes and `"` inside a path would reach the shell). Here:
  file_node/dir_node  a path as a node, never substituted (env.File and env.Dir substitute);
  escape              a string that must be part of a flag or message, `$` doubled (include
                      directories are nodes, written into -I flags escaped);
  generate(env)       SPAWN runs the argument list itself (no shell), so no quoting is needed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_LITERAL = "\0"  # marks an argument SCons passed through ESCAPE (a node's path): no file name holds NUL


def escape(text: str) -> str:
    """`text` as a SCons string whose substitution gives back exactly `text`."""
    return str(text).replace("$", "$$")


def escape_all(items) -> list[str]:
    """Flags from a target file, each escaped: SCons passes them on as written (no shell follows)."""
    return [escape(i) for i in items]


def shown(path: str | Path) -> str:
    """A path as a line of output can always print it (a byte that is not UTF-8 as U+FFFD)."""
    return str(path).encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def file_node(env, path: str | Path):
    """The File node of a path, without substitution (relative paths: from the current directory)."""
    return env.fs.File(str(Path(path).absolute()))


def dir_node(env, path: str | Path):
    return env.fs.Dir(str(Path(path).absolute()))


def flag_path(node) -> str:
    """A node's path for a flag (`-Xassembler -I<dir>`), escaped. SCons spells it relative to the top directory
    when inside it, as it spells its own node paths: the same build in another checkout has the same
    command lines, so CACHE=dir hits."""
    return escape(str(node))


def _escape_literal(arg: str) -> str:
    return _LITERAL + arg


def _unescape(arg: str) -> str:
    """One argument back as SCons had it before it prepared it for a shell.

    A node's path comes through ESCAPE (marked); any other argument holding whitespace comes wrapped
    in a pair of double quotes (SCons.Subst.quote_spaces), everything else as it is."""
    if arg.startswith(_LITERAL):
        return arg[len(_LITERAL):]
    if (" " in arg or "\t" in arg) and len(arg) >= 2 and arg[0] == arg[-1] == '"':
        return arg[1:-1]
    return arg


def spawn(sh, escape_fn, cmd, args, env) -> int:  # noqa: ARG001 - SCons SPAWN signature
    """Run a command's argument list directly (no `sh -c`)."""
    argv = [_unescape(str(a)) for a in args]
    try:
        return subprocess.call(argv, env=env)
    except OSError as e:
        print(f"colibri: cannot run {argv[0]}: {e.strerror or e}", file=sys.stderr)
        return 127


def _include_flags(paths, env) -> list[str]:
    """-I<dir> per CPPPATH entry (nodes: the scanner finds headers through them), escaped, because SCons
    substitutes what a `${...}` call returns (its own _concat would evaluate a `$` in a directory)."""
    return [f"{env['INCPREFIX']}{escape(str(p))}" for p in paths]


def generate(env) -> None:
    env["ESCAPE"] = _escape_literal
    env["SPAWN"] = spawn
    env["_colibri_include_flags"] = _include_flags
    env["_CPPINCFLAGS"] = "$( ${_colibri_include_flags(CPPPATH, __env__)} $)"


def exists(env) -> bool:  # noqa: ARG001
    return True
