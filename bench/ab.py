"""Interleaved timing of commands that print a figure: medians, spread and per-round ratios to the first command.

    .venv/bin/python bench/ab.py --key "prefill tok/s" [--rounds 9] NAME=COMMAND [NAME=COMMAND ...]

For comparing two builds (say of two commits) of `colibri_demo` with each other and with `llama-bench`: each
round runs every command once, in turn, the order reversed every other round, so drift in the machine's state
falls on all of them alike. A command is split as a shell would split it (shlex) and run without a shell. Its
figure is the value of its first output line `KEY: value` (colibri_demo's `tok/s: ...`, `prefill tok/s: ...`)
or, when it prints llama-bench's JSON (`-o json`) and no such line, the first test's `avg_ts`.

Printed per command: the median figure and its spread (min-max) over the rounds, and the median and spread of
the per-round ratio to the first command's figure of the same round; then the CPU and the load average before
and after. On a 2-core machine, a figure taken while anything else runs is not a figure.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path


def figure(out: str, key: str) -> float:
    """The value of out's first `key: value` line, else the first llama-bench JSON test's avg_ts."""
    for line in out.splitlines():
        if line.startswith(key + ":"):
            return float(line.split(":", 1)[1])
    try:
        return float(json.loads(out)[0]["avg_ts"])
    except (ValueError, LookupError, TypeError):
        raise ValueError(f"no '{key}: value' line and no llama-bench JSON in the output") from None


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def paired(xs: list[float], base: list[float], digits: int = 3) -> str:
    """The median and spread (min-max) of the per-round ratios xs[r] / base[r]."""
    rs = [x / b for x, b in zip(xs, base, strict=True)]
    return f"{statistics.median(rs):.{digits}f} [{min(rs):.{digits}f}-{max(rs):.{digits}f}]"


def parse_commands(specs: list[str]) -> list[tuple[str, list[str]]]:
    """NAME=COMMAND arguments as (name, argv); ValueError names a malformed one."""
    cmds = []
    for spec in specs:
        name, sep, command = spec.partition("=")
        argv = shlex.split(command) if sep else []
        if not name or not argv:
            raise ValueError(f"'{spec}' is not NAME=COMMAND")
        if name in (n for n, _ in cmds):
            raise ValueError(f"the name '{name}' is given twice")
        cmds.append((name, argv))
    return cmds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--key", required=True, help="the figure's line prefix, e.g. 'tok/s' or 'prefill tok/s'")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("commands", nargs="+", metavar="NAME=COMMAND")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    try:
        cmds = parse_commands(args.commands)
    except ValueError as e:
        print(f"ab.py: {e}", file=sys.stderr)
        return 2
    figures: dict[str, list[float]] = {name: [] for name, _ in cmds}
    load_before = loadavg()
    for r in range(args.rounds):
        for name, command in cmds if r % 2 == 0 else cmds[::-1]:
            try:
                res = subprocess.run(command, capture_output=True, text=True)
            except OSError as e:
                print(f"ab.py: {name}: cannot run {command[0]}: {e.strerror}", file=sys.stderr)
                return 1
            if res.returncode != 0:
                print(f"ab.py: {name} exited {res.returncode}: {res.stderr.strip()[-500:]}", file=sys.stderr)
                return 1
            try:
                figures[name].append(figure(res.stdout, args.key))
            except ValueError as e:
                print(f"ab.py: {name}: {e}", file=sys.stderr)
                return 1
    first = figures[cmds[0][0]]
    width = max(len(name) for name, _ in cmds)
    for name, xs in figures.items():
        print(f"{name:{width}s}  {statistics.median(xs):10.2f} [{min(xs):.2f}-{max(xs):.2f}]"
              f"  ratio {paired(xs, first)}")
    print(f"rounds: {args.rounds}, CPU: {cpu_model()}, load average {load_before} -> {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
