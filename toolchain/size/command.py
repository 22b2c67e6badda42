"""`colibri size`: the CLI, and the one-line summary and budget check every build runs after linking."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .. import targets as targets_mod
from .audit import (
    Options,
    audit,
    budget_limits,
    over_budget,
    overruns,
    quick_regions,
    resolve_target,
    target_budget,
)
from .diff import diff, diff_csv, diff_markdown, diff_table, over_limits, parse_limits
from .elf import SizeError
from .regions import parse_budget
from .report import csv_text, human, table

EPILOG = """\
Budgets: --budget flash=2M,ram=1M (K/M/G are powers of 1024), else the target's own [budget].
Exit status: 0 fine, 1 over budget (or --strict and an ABI/hygiene issue), 2 unreadable input.
JSON schema: toolchain/size/SCHEMA.md."""


def _target_of(path: Path, target: str | targets_mod.Target | None) -> targets_mod.Target | None:
    if isinstance(target, targets_mod.Target):
        return target
    try:
        return resolve_target(path, target)
    except targets_mod.TargetError:
        return None


def summary_line(path: str | Path, target: str | targets_mod.Target | None = None) -> str:
    """One line for the build log, PlatformIO style:
    'fw.elf: flash 36,324 B (13.9% of 256.00 KiB, 17.7% of budget; weights 34,432) · RAM ...'."""
    path = Path(path)
    t = _target_of(path, target)
    _, regions, usage = quick_regions(path, t)
    return _line(path.name, regions, usage, target_budget(t))


def report_line(report: dict) -> str:
    """summary_line() of a full report (the firmware build prints this one)."""
    return _line(Path(report["file"]).name, report["regions"], report["memory"], budget_limits(report))


def _line(name: str, regions: dict, usage: list[dict], budget: dict[str, int]) -> str:
    parts = []
    for key, label, detail in (("flash", "flash", "weights"), ("ram", "RAM", "arena")):
        used = regions[key]["bytes"]
        notes = []
        size = sum(m["size"] for m in usage if m["kind"] == key)
        if size:
            mapped = sum(m["used"] for m in usage if m["kind"] == key)
            notes.append(f"{100.0 * mapped / size:.1f}% of {human(size)}")
        if budget.get(key):
            notes.append(f"{100.0 * used / budget[key]:.1f}% of budget")
        text = ", ".join(notes)
        if regions[key]["parts"].get(detail):
            text += ("; " if text else "") + f"{detail} {regions[key]['parts'][detail]:,}"
        parts.append(f"{label} {used:,} B" + (f" ({text})" if text else ""))
    return f"{name}: " + " · ".join(parts)


def check_budget(path: str | Path, target: str | targets_mod.Target | None = None,
                 budget: dict[str, int] | None = None) -> list[str]:
    """'fw.elf: flash overflowed by N bytes (budget B)' for each budget (the target's, updated by
    budget) and memory region exceeded; [] when within."""
    path = Path(path)
    t = _target_of(path, target)
    _, regions, usage = quick_regions(path, t)
    limits = {**target_budget(t), **(budget or {})}
    return [f"{path.name}: {msg}" for msg in overruns(regions, usage, limits)]


def _is_binary(path: Path) -> bool:
    """A linked file worth a summary: an ELF file or an archive, not a symlink to one, a map or a hex."""
    if path.is_symlink() or not path.is_file():
        return False
    with open(path, "rb") as f:
        head = f.read(8)
    return head.startswith(b"\x7fELF") or head in (b"!<arch>\n", b"!<thin>\n")


def post_link(target, source, env) -> int:  # noqa: ARG001 - SCons action signature
    """SCons post-action: print the summary of each linked file; fail (1) when a budget is exceeded.

    Uses env["COLIBRI_TARGET"] (a target name) when set, else infers it from build/<target>/<model>/.
    Nodes that are not ELF files or archives (maps, .bin, .hex, symlinks) are skipped."""
    name = env.get("COLIBRI_TARGET") if hasattr(env, "get") else None
    status = 0
    for node in target:
        path = Path(str(node))
        if not _is_binary(path):
            continue
        try:
            print(f"colibri size: {summary_line(path, name)}")
            problems = check_budget(path, name)
        except SizeError as e:
            print(f"colibri size: {e}", file=sys.stderr)
            continue
        for p in problems:
            print(f"colibri size: over budget: {p}", file=sys.stderr)
            status = 1
    return status


def _options(a: argparse.Namespace) -> Options:
    budget = parse_budget(a.budget) if a.budget else {}
    dirs = None if not a.stack_dir else [Path(d) for d in a.stack_dir]
    return Options(manifest=Path(a.manifest) if a.manifest else None, target=a.target, budget=budget,
                   stack_dirs=dirs, stack=not a.no_stack)


def _write_html(path: str, reports: list[dict], top: int) -> None:
    """The HTML report, whole or not at all: written beside OUT, then renamed over it."""
    from .html import render

    out = Path(path)
    if out.is_dir() or not out.name:
        raise SizeError(f"{path}: cannot write the HTML report: a directory")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(render(reports, top))
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise SizeError(f"{path}: cannot write the HTML report: {e.strerror or e}") from None


def cmd_diff(a: argparse.Namespace, opts: Options) -> int:
    old_path, new_path = a.diff
    old = audit(old_path, Options(**{**vars(opts), "manifest": None, "stack": False}))
    new = audit(new_path, Options(**{**vars(opts), "stack": False}))
    d = diff(old, new, a.top)
    problems = over_limits(d, a.limits_pct, a.limits_bytes)
    if a.html:
        _write_html(a.html, [old, new], a.top)
    if a.json:
        print(json.dumps(d, indent=1))
    elif a.csv:
        print(diff_csv(d), end="")
    elif a.markdown:
        print(diff_markdown(d, a.base_label or old_path, a.head_label or new_path, problems), end="")
    else:
        print(diff_table(d), end="")
    for p in problems:
        print(f"colibri size: {p}", file=sys.stderr)
    return 1 if problems else 0


def cmd_size(a: argparse.Namespace) -> int:
    try:
        return _cmd_size(a)
    except BrokenPipeError:  # `colibri size x --json | head`
        sys.stderr.close()
        return 0


def _cmd_size(a: argparse.Namespace) -> int:
    try:
        opts = _options(a)
        a.limits_pct = parse_limits(a.fail_over, "--fail-over", float)
        a.limits_bytes = parse_limits(a.fail_over_bytes, "--fail-over-bytes", int)
        if not a.diff and (a.markdown or a.limits_pct or a.limits_bytes or a.base_label or a.head_label):
            raise ValueError("--markdown, --fail-over, --fail-over-bytes and the labels go with --diff OLD NEW")
    except ValueError as e:
        print(f"colibri size: {e}", file=sys.stderr)
        return 2
    try:
        if a.diff:
            return cmd_diff(a, opts)
        if not a.files:
            print("colibri size: give FILE(s) or --diff OLD NEW", file=sys.stderr)
            return 2
        reports = [audit(f, opts) for f in a.files]
        if a.html:
            _write_html(a.html, reports, a.top)
    except (SizeError, OSError, ValueError, targets_mod.TargetError) as e:
        print(f"colibri size: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(reports[0] if len(reports) == 1 else reports, indent=1))
    elif a.csv:
        print(csv_text(reports), end="")
    else:
        print("\n".join(table(r, a.top) for r in reports), end="")
    if a.html:
        print(f"colibri size: wrote {a.html}", file=sys.stderr)
    status = 0
    for r in reports:
        for msg in over_budget(r):
            print(f"colibri size: {r['file']}: over budget: {msg}", file=sys.stderr)
            status = 1
        if a.strict and r["abi"]["issues"]:
            print(f"colibri size: {r['file']}: {len(r['abi']['issues'])} ABI/hygiene issue(s)", file=sys.stderr)
            status = 1
    return status


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("size", help="binary size audit: flash/RAM, attribution, ABI, stack, budgets",
                              description="Where every byte of a built artifact goes (.so, executable, firmware "
                                          ".elf, .a).", epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", metavar="FILE")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the report as JSON (schema colibri-size/1)")
    out.add_argument("--csv", action="store_true", help="print one CSV row per symbol")
    out.add_argument("--markdown", action="store_true",
                     help="with --diff: a Markdown table per region and per category (for a pull request)")
    p.add_argument("--fail-over", metavar="PCT",
                   help="with --diff: exit 1 when a region grows by more than PCT percent (N, or flash=N,ram=N)")
    p.add_argument("--fail-over-bytes", metavar="N",
                   help="with --diff: exit 1 when a region grows by more than N bytes (N, or flash=N,ram=N)")
    p.add_argument("--base-label", help="with --diff: the old side's name in the report (default: OLD)")
    p.add_argument("--head-label", help="with --diff: the new side's name in the report (default: NEW)")
    p.add_argument("--html", metavar="OUT", help="also write a self-contained HTML report with treemaps")
    p.add_argument("--diff", nargs=2, metavar=("OLD", "NEW"), help="compare two builds")
    p.add_argument("--budget", help="flash=SIZE,ram=SIZE; exit 1 when exceeded (overrides the target's)")
    p.add_argument("--target", help="target name or path to a target .toml (default: inferred from "
                   "build/<target>/<model>/)")
    p.add_argument("--manifest", help="manifest.json of the weights (default: beside FILE)")
    p.add_argument("--top", type=int, default=20, help="symbols to list (default 20)")
    p.add_argument("--stack-dir", action="append", metavar="DIR",
                   help="where the .su/.ci files are (repeatable; default: FILE's dir/obj)")
    p.add_argument("--no-stack", action="store_true", help="skip the stack audit")
    p.add_argument("--strict", action="store_true", help="exit 1 on ABI/hygiene issues too")
    p.set_defaults(fn=cmd_size)
    return p
