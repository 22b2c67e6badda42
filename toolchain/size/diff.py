"""Compare two reports: per region, per category, per file and the symbols that changed most.

Like `bloaty -d symbols NEW -- OLD`: keys are build-root independent (category,
source file, symbol), so two builds in different directories compare cleanly.
"""

from __future__ import annotations

import csv
import io

from . import DIFF_SCHEMA
from .attribute import CATEGORIES
from .regions import FLASH_PARTS, RAM_PARTS


def _delta(old: int, new: int) -> dict:
    return {"old": old, "new": new, "delta": new - old,
            "percent": round(100.0 * (new - old) / old, 2) if old else None}


def _keyed(rows: list[dict], fields: tuple[str, ...]) -> dict[tuple, int]:
    out: dict[tuple, int] = {}
    for r in rows:
        key = tuple(r[f] for f in fields)
        out[key] = out.get(key, 0) + r["bytes"]
    return out


def _changes(old: list[dict], new: list[dict], fields: tuple[str, ...]) -> list[dict]:
    a, b = _keyed(old, fields), _keyed(new, fields)
    rows = []
    for key in a.keys() | b.keys():
        o, n = a.get(key, 0), b.get(key, 0)
        if o != n:
            rows.append({**dict(zip(fields, key, strict=True)), **_delta(o, n),
                         "status": "added" if not o else "removed" if not n else "changed"})
    return sorted(rows, key=lambda r: (-abs(r["delta"]), *(str(r[f]) for f in fields)))


def diff(old: dict, new: dict, top: int = 20) -> dict:
    regions = {}
    for key, parts in (("flash", FLASH_PARTS), ("ram", RAM_PARTS)):
        o, n = old["regions"][key], new["regions"][key]
        regions[key] = {**_delta(o["bytes"], n["bytes"]),
                        "parts": {p: _delta(o["parts"].get(p, 0), n["parts"].get(p, 0)) for p in parts}}
    oc = {c["key"]: c["bytes"] for c in old["categories"]}
    nc = {c["key"]: c["bytes"] for c in new["categories"]}
    categories = [{"key": k, "label": label, **_delta(oc.get(k, 0), nc.get(k, 0))} for k, label in CATEGORIES.items()]
    symbols = _changes(old["symbols"], new["symbols"], ("category", "file", "symbol"))
    ow, nw = old.get("weights") or {}, new.get("weights") or {}
    kinds = (ow.get("by_kind") or {}).keys() | (nw.get("by_kind") or {}).keys()
    return {
        "schema": DIFF_SCHEMA,
        "old": old["file"],
        "new": new["file"],
        "allocated_bytes": _delta(old["allocated_bytes"], new["allocated_bytes"]),
        "regions": regions,
        "categories": categories,
        "weights_by_kind": {k: _delta((ow.get("by_kind") or {}).get(k, 0), (nw.get("by_kind") or {}).get(k, 0))
                            for k in sorted(kinds)},
        "quant": {"old": ow.get("quant"), "new": nw.get("quant")},
        "files": _changes(old["files"], new["files"], ("category", "file")),
        "symbols": symbols,
        "symbols_changed": len(symbols),
        "top": top,
    }


def _signed(n: int) -> str:
    return f"{n:+,}"


def _pct(p: float | None) -> str:
    return "new" if p is None else f"{p:+.1f}%"


def diff_table(d: dict) -> str:
    lines = [f"== {d['old']}  ->  {d['new']}"]
    q = d.get("quant") or {}
    if q.get("old") or q.get("new"):
        lines.append(f"   quantization {q.get('old')} -> {q.get('new')}")
    lines.append(f"{'':<24} {'old':>13} {'new':>13} {'delta':>13} {'':>8}")
    for key in ("flash", "ram"):
        r = d["regions"][key]
        lines.append(f"{key:<24} {r['old']:>13,} {r['new']:>13,} {_signed(r['delta']):>13} {_pct(r['percent']):>8}")
        for p, v in r["parts"].items():
            if v["old"] or v["new"]:
                lines.append(f"  {p:<22} {v['old']:>13,} {v['new']:>13,} {_signed(v['delta']):>13} "
                             f"{_pct(v['percent']):>8}")
    lines.append("")
    lines.append(f"{'category':<24} {'old':>13} {'new':>13} {'delta':>13}")
    for c in d["categories"]:
        if c["old"] or c["new"]:
            lines.append(f"{c['key']:<24} {c['old']:>13,} {c['new']:>13,} {_signed(c['delta']):>13} "
                         f"{_pct(c['percent']):>8}")
    for k, v in d["weights_by_kind"].items():
        if v["delta"]:
            lines.append(f"  weights: {k:<13} {v['old']:>13,} {v['new']:>13,} {_signed(v['delta']):>13}")
    lines.append("")
    lines.append(f"top {d['top']} changed symbols (of {d['symbols_changed']})")
    lines.append(f"{'delta':>13} {'old':>11} {'new':>11}  {'category':<12} symbol")
    for s in d["symbols"][: d["top"]]:
        lines.append(f"{_signed(s['delta']):>13} {s['old']:>11,} {s['new']:>11,}  {s['category']:<12} "
                     f"{s['symbol']}  [{s['file']}]")
    return "\n".join(lines) + "\n"


def diff_csv(d: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["category", "source", "symbol", "old", "new", "delta", "status"])
    for s in d["symbols"]:
        w.writerow([s["category"], s["file"], s["symbol"], s["old"], s["new"], s["delta"], s["status"]])
    return buf.getvalue()


# --- the pull-request report: a Markdown table, and the growth limits that fail a CI job ------------------


def md_cell(text: str) -> str:
    """Any string as the text of one Markdown table cell: `|`, backslash, backquote, `<`, `>`, `&`, `*`, `_`,
    `[`, `]` escaped, line breaks as spaces."""
    out = []
    for c in str(text):
        if c in "\r\n\t":
            out.append(" ")
        elif c in "&<>":
            out.append({"&": "&amp;", "<": "&lt;", ">": "&gt;"}[c])
        elif c in "\\|`*_[]#~":
            out.append("\\" + c)
        elif ord(c) < 32 or ord(c) == 127:
            out.append(" ")
        else:
            out.append(c)
    return "".join(out)


def _pct_md(p: float | None, old: int, new: int) -> str:
    if p is None:
        return "new" if new else "0.0%"
    return f"{p:+.2f}%"


def parse_limits(text: str | None, what: str, cast) -> dict[str, float]:
    """`5` (every region) or `flash=5,ram=10`; ValueError naming the option when malformed."""
    if text is None:
        return {}
    text = text.strip()
    try:
        if "=" not in text:
            v = cast(text)
            if v < 0:
                raise ValueError
            return {"flash": v, "ram": v}
        out = {}
        for part in text.split(","):
            region, _, value = part.partition("=")
            region = region.strip()
            if region not in ("flash", "ram"):
                raise ValueError
            v = cast(value.strip())
            if v < 0:
                raise ValueError
            out[region] = v
        return out
    except ValueError:
        raise ValueError(f"{what} {text!r}: expected a non-negative number, or flash=N,ram=N") from None


def over_limits(d: dict, pct: dict[str, float], nbytes: dict[str, float]) -> list[str]:
    """The regions that grew more than allowed: one line each."""
    problems = []
    for region in ("flash", "ram"):
        r = d["regions"][region]
        grew = r["delta"]
        if region in nbytes and grew > nbytes[region]:
            problems.append(f"{region} grew by {grew:+,} B, over --fail-over-bytes {nbytes[region]:,.0f}")
        if region in pct and grew > 0:
            p = r["percent"]
            if p is None or p > pct[region]:
                shown = "from 0" if p is None else f"{p:+.2f}%"
                problems.append(f"{region} grew by {grew:+,} B ({shown}), over --fail-over {pct[region]:g}%")
    return problems


def diff_markdown(d: dict, base: str = "base", head: str = "head", problems: list[str] | None = None) -> str:
    """The comparison as GitHub-flavoured Markdown: per region (and its parts), then per category."""
    b, h = md_cell(base), md_cell(head)
    lines = [f"### colibri size: {b} → {h}", ""]
    q = d.get("quant") or {}
    if (q.get("old") or q.get("new")) and q.get("old") != q.get("new"):
        lines += [f"Quantization: {md_cell(q.get('old'))} → {md_cell(q.get('new'))}", ""]
    lines += [f"| region | {b} | {h} | delta | % |", "|:--|--:|--:|--:|--:|"]
    for key in ("flash", "ram"):
        r = d["regions"][key]
        lines.append(f"| **{key}** | {r['old']:,} | {r['new']:,} | {_signed(r['delta'])} | "
                     f"{_pct_md(r['percent'], r['old'], r['new'])} |")
        for p, v in r["parts"].items():
            if v["old"] or v["new"]:
                lines.append(f"| {key}: {p} | {v['old']:,} | {v['new']:,} | {_signed(v['delta'])} | "
                             f"{_pct_md(v['percent'], v['old'], v['new'])} |")
    lines += ["", f"| category | {b} | {h} | delta | % |", "|:--|--:|--:|--:|--:|"]
    for c in d["categories"]:
        if c["old"] or c["new"]:
            lines.append(f"| {md_cell(c['label'])} | {c['old']:,} | {c['new']:,} | {_signed(c['delta'])} | "
                         f"{_pct_md(c['percent'], c['old'], c['new'])} |")
    if problems:
        lines += ["", "**Over the limit:**", ""] + [f"- {md_cell(p)}" for p in problems]
    return "\n".join(lines) + "\n"
