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
