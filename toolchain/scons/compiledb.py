"""compile_commands.json: every object a target's build compiles, with its exact command.

SCons' own compilation_db tool rebuilds its output on every run; recording the commands while the
graph is made keeps a null build doing nothing. `env.ColibriObjects(objdir)` gives a recorder that
Linux and firmware builds compile through; `recorder.database(env, path)` writes the file.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from ..targets import ROOT
from .files import write_text
from .safe import file_node


class Objects:
    """Compiles sources to objects under one directory and records each command."""

    def __init__(self, objdir: Path):
        self.objdir = objdir
        self.entries: list[dict] = []

    def record(self, env, nodes: list, source, com: str, **overrides) -> None:
        # the compiler's own command: a launcher (CC_LAUNCHER=ccache) is how it ran, not what it compiles
        words = env.Override({**overrides, "COLIBRI_LAUNCHER": []}).subst_list(com, target=nodes, source=source)[0]
        self.entries.append({"directory": str(ROOT), "file": str(source), "output": str(nodes[0]),
                             "command": shlex.join(str(w) for w in words)})

    def __call__(self, env, stem: str, source: str | Path, shared: bool = False, **overrides) -> list:
        """One object (.os when shared, else .o) of one source."""
        builder = env.SharedObject if shared else env.Object
        src = file_node(env, source)
        nodes = builder(file_node(env, self.objdir / f"{stem}{'.os' if shared else '.o'}"), src, **overrides)
        com = "$ASPPCOM" if str(source).endswith(".S") else ("$SHCCCOM" if shared else "$CCCOM")
        self.record(env, nodes, src, com, **overrides)
        return nodes

    def database(self, env, path: Path):
        return write_text(env, path, json.dumps(self.entries, indent=1, sort_keys=True) + "\n")


def generate(env) -> None:
    env.AddMethod(lambda env, objdir: Objects(objdir), "ColibriObjects")


def exists(env) -> bool:  # noqa: ARG001
    return True
