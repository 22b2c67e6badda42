"""One self-contained HTML page: region bars and a zoomable treemap (category -> file -> symbol)."""

from __future__ import annotations

from jinja2 import Environment, PackageLoader, select_autoescape

from .attribute import CATEGORIES

SYMBOL_FIELDS = ("category", "file", "symbol", "flash", "ram", "bytes")


def _slim(report: dict) -> dict:
    """What the page's script needs, nothing more (a 300 MB blob has a few thousand tensors at most)."""
    return {
        "file": report["file"],
        "regions": report["regions"],
        "memory": report.get("memory") or [],
        "budget": report.get("budget"),
        "categories": report["categories"],
        "labels": dict(CATEGORIES),
        "symbols": [{k: s[k] for k in SYMBOL_FIELDS} for s in report["symbols"]],
    }


def render(reports: list[dict], top: int = 20) -> str:
    from colibri.codegen import __version__

    env = Environment(loader=PackageLoader("colibri.toolchain.size", "templates"),
                      autoescape=select_autoescape(["html", "j2"]), keep_trailing_newline=True)
    title = ", ".join(r["file"] for r in reports)
    page = env.get_template("report.html.j2").render(reports=reports, data=[_slim(r) for r in reports], top=top,
                                                     title=title, version=__version__)
    if "http://" in page or "https://" in page:  # a symbol or path could carry one: never a fetchable URL
        page = page.replace("http://", "http:\u200b//").replace("https://", "https:\u200b//")
    return page
