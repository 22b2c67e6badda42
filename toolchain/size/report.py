"""Reports for people (a table) and for spreadsheets (CSV); JSON is the report dict itself."""

from __future__ import annotations

import csv
import io

from .attribute import CATEGORIES
from .regions import FLASH_PARTS, RAM_PARTS

BAR = 20


def human(n: int | float) -> str:
    """1536 -> '1.50 KiB'; exact bytes are printed beside it where they matter."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def bar(fraction: float, width: int = BAR) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return "[" + "=" * filled + " " * (width - filled) + "]"


def clip(text: str, width: int) -> str:
    """Keep the end of long paths: '...untime_c/src/kernels.c'."""
    return text if len(text) <= width else "..." + text[-(width - 3):]


def _parts(parts: dict, names: tuple[str, ...]) -> str:
    return " · ".join(f"{k} {parts.get(k, 0):,}" for k in names)


def _header(r: dict) -> list[str]:
    elf = r.get("elf") or {}
    target = f", target {r['target']['name']}" if r.get("target") else ""
    lines = [f"== {r['file']}",
             f"   {elf.get('kind', '?')}, ELF{elf.get('class', '')} {elf.get('arch', '?')}, "
             f"{r['allocated_bytes']:,} allocated bytes (file {r['file_bytes']:,}){target}"]
    if r.get("members") is not None:
        lines.append(f"   {len(r['members'])} members: " + ", ".join(m["name"] for m in r["members"]))
    return lines


def _regions(r: dict) -> list[str]:
    fl, ram = r["regions"]["flash"], r["regions"]["ram"]
    lines = [f"flash {fl['bytes']:>13,} B {human(fl['bytes']):>11}   {_parts(fl['parts'], FLASH_PARTS)}",
             f"RAM   {ram['bytes']:>13,} B {human(ram['bytes']):>11}   {_parts(ram['parts'], RAM_PARTS)}"]
    for m in r.get("memory") or []:
        frac = m["used"] / m["size"] if m["size"] else 0.0
        held = ", ".join(f"{c} {n:,}" for c, n in (m.get("classes") or {}).items())
        lines.append(f"{m['name']:<8} {bar(frac)} {100 * frac:6.1f}% (used {m['used']:,} bytes from "
                     f"{m['size']:,} bytes)" + (f" {m.get('region_kind', m['kind'])}: {held}" if held else ""))
    for key, b in (r.get("budget") or {}).items():
        state = "ok" if b["ok"] else "OVER BUDGET"
        lines.append(f"budget {key}: {b['used']:,} of {b['limit']:,} bytes ({b['percent']}%) {state}")
    return lines


def _categories(r: dict, files_per_category: int) -> list[str]:
    total = r["allocated_bytes"] or 1
    lines = [f"{'category':<40} {'bytes':>13} {'%':>6} {'flash':>13} {'RAM':>11}"]
    for c in r["categories"]:
        if not c["bytes"]:
            continue
        lines.append(f"{c['label']:<40} {c['bytes']:>13,} {100 * c['bytes'] / total:5.1f}% "
                     f"{c['flash']:>13,} {c['ram']:>11,}")
        files = [f for f in r["files"] if f["category"] == c["key"]]
        for f in files[:files_per_category]:
            lines.append(f"  {clip(f['file'], 38):<38} {f['bytes']:>13,} {100 * f['bytes'] / total:5.1f}%")
        if len(files) > files_per_category:
            rest = sum(f["bytes"] for f in files[files_per_category:])
            lines.append(f"  {'(' + str(len(files) - files_per_category) + ' more)':<38} {rest:>13,}")
    lines.append(f"{'total allocated':<40} {r['allocated_bytes']:>13,} 100.0%")
    return lines


def _weights(r: dict) -> list[str]:
    w = r.get("weights")
    if not w:
        return []
    models = r.get("models") or {}
    src = (f"manifest {w['manifest']}" if w["manifest"] else f"{len(models)} models" if models
           else "no manifest.json: the blob is one block")
    lines = [f"weights: {w['blob_bytes']:,} bytes ({src})"]
    if models:
        lines.append("  per model: " + " · ".join(f"{n} {m['weights_bytes']:,}" for n, m in models.items()))
    if w["by_layer"] and w["manifest"]:
        lines.append("  per layer: " + " · ".join(f"{k} {v:,}" for k, v in w["by_layer"].items()))
    experts: dict[str, int] = {}
    for key, v in w["by_expert"].items():
        e = key.rsplit(".", 1)[-1]
        experts[e] = experts.get(e, 0) + v
    if experts:
        lines.append("  per expert (all layers): " + " · ".join(f"{k} {v:,}" for k, v in list(experts.items())[:16]))
    return lines


def _top(r: dict, n: int) -> list[str]:
    """The biggest symbols other than tensors (those are broken down under weights)."""
    rows = [s for s in r["symbols"] if s["category"] != "weights"][:n]
    lines = [f"top {n} symbols (weights tensors excluded)", f"{'bytes':>13}  {'category':<12} {'file':<32} symbol"]
    for s in rows:
        lines.append(f"{s['bytes']:>13,}  {s['category']:<12} {clip(s['file'], 32):<32} {s['symbol']}")
    return lines


def _abi(r: dict) -> list[str]:
    a = r["abi"]
    exported = a["exported"]
    parts = [a["kind"]]
    if a["kind"] in ("shared-library", "archive", "object"):
        flagged = a["flagged_exports"]
        parts.append(f"exports {len(exported)} ({'all colibri_*' if not flagged else f'{len(flagged)} not colibri_*'})")
        parts.append("needs " + (", ".join(a["undefined"]) if a["undefined"] else "nothing"))
    h = a.get("hardening")
    if h:
        parts.append(f"RELRO {h['relro']}, {'BIND_NOW' if h['bind_now'] else 'lazy binding'}, "
                     f"{'TEXTREL' if h['textrel'] else 'no TEXTREL'}, "
                     f"{'EXECUTABLE stack' if h['exec_stack'] else 'non-exec stack'}")
    if a.get("linked_forbidden"):
        parts.append("links " + ", ".join(a["linked_forbidden"]))
    lines = ["ABI: " + "; ".join(parts)]
    if a.get("link_namespace"):
        names = a["link_namespace"]
        lines.append(f"  link namespace: {len(names)} hidden globals not colibri_*: {', '.join(names[:8])}"
                     + (", ..." if len(names) > 8 else ""))
    return lines + [f"  ! {i}" for i in a["issues"]]


def _stack(r: dict) -> list[str]:
    s = r.get("stack")
    if not s:
        return []
    what = "call graph" if s["call_graph"] else "frames only"
    lines = [f"stack ({what} from {len(s['inputs'])} file(s); red zone {s['red_zone']} B included)"]
    for e in s["entries"]:
        size = f"{e['bytes']:,} B" if e["bounded"] else f">= {e['bytes']:,} B, unbounded"
        ext = f"  [+ not counted: {', '.join(e['externals'])}]" if e["externals"] else ""
        why = f"  ({'; '.join(e['reasons'])})" if e["reasons"] else ""
        lines.append(f"  {e['entry']:<28} {size:>22}  {' > '.join(e['path'])}{why}{ext}")
    lines += [f"  note: {n}" for n in s["notes"]]
    return lines


def table(r: dict, top: int = 20, files_per_category: int = 8) -> str:
    blocks = [_header(r), _regions(r), _categories(r, files_per_category), _weights(r), _top(r, top), _abi(r),
              _stack(r), [f"warning: {w}" for w in r.get("warnings", [])]]
    return "\n".join("\n".join(b) for b in blocks if b) + "\n"


CSV_FIELDS = ["file", "category", "category_label", "source", "symbol", "section", "bytes", "flash", "ram"]


def csv_text(reports: list[dict]) -> str:
    """One row per symbol of every report: file, category, source file, symbol, section, bytes, flash, ram."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for r in reports:
        for s in r["symbols"]:
            w.writerow([r["file"], s["category"], CATEGORIES[s["category"]], s["file"], s["symbol"], s["section"],
                        s["bytes"], s["flash"], s["ram"]])
    return buf.getvalue()
