"""Build steps that only move bytes: copy a file, write a Value's text (a generated linker script, the
compile database). Nodes in, nodes out."""

from __future__ import annotations

import shutil
from pathlib import Path

from .safe import file_node


def _copy_action(target, source, env):  # noqa: ARG001 - SCons action signature
    shutil.copyfile(str(source[0]), str(target[0]))
    return 0


def _write_value_action(target, source, env):  # noqa: ARG001
    Path(str(target[0])).write_text(source[0].read())
    return 0


def copy(env, dst: Path, src) -> list:
    from SCons.Script import Action  # type: ignore[import-not-found]

    return env.Command(file_node(env, dst), src, Action(_copy_action, "COPY   $TARGET"))


def write_text(env, dst: Path, text: str) -> list:
    from SCons.Script import Action, Value  # type: ignore[import-not-found]

    return env.Command(file_node(env, dst), Value(text), Action(_write_value_action, "GEN    $TARGET"))
