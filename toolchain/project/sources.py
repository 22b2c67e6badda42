"""Which files of the runtime and of the firmware example a project folder needs, and where they go.

The translation units are csources.RUNTIME_SRC (the one list) plus the example's; the headers are the
ones those files reach through `#include "..."`, followed from file to file (model.h, the export's, and
colibri.h, the public header, are placed by the generator). kernels.c and kernels_q8.c include every
arch/ header (each is empty unless its ISA is the compiler's), so those are all reached.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..csources import RUNTIME_DIR, RUNTIME_SRC, TEXT_SRC
from ..firmware import COMMON_SRC, FAMILIES, FW_DIR
from ..scons.linux import DEMO_COMMON
from ..targets import Target

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
PROVIDED = {"model.h", "colibri.h"}  # placed by the generator: model/ and include/
DEMO_MAIN = "demo/colibri_demo.c"


def _closure(roots: list[Path], base: Path) -> list[Path]:
    """The files under `base` that `roots` reach by quoted includes (the roots included), sorted."""
    seen: set[Path] = set()
    todo = list(roots)
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        for inc in _INCLUDE.findall(f.read_text(encoding="utf-8")):
            if Path(inc).name in PROVIDED:
                continue
            cand = (f.parent / inc).resolve()
            if cand.is_file() and base.resolve() in cand.parents:
                todo.append(cand)
    return sorted(seen)


def runtime_files() -> dict[str, Path]:
    """{path in the folder: source file} of the runtime: runtime/<as in runtime_c/src>."""
    src = (RUNTIME_DIR / "src").resolve()
    files = _closure([src / s for s in RUNTIME_SRC + TEXT_SRC], src)  # the text runtime: demo/firmware text
    out = {f"runtime/{f.relative_to(src).as_posix()}": f for f in files}
    public = RUNTIME_DIR / "include"
    # colibri.h and every other public header the runtime sources include (colibri_sample.h, ...)
    for name in {"colibri.h", *(inc for f in files for inc in _INCLUDE.findall(f.read_text(encoding="utf-8")))}:
        if (public / name).is_file():
            out[f"include/{name}"] = public / name
    return dict(sorted(out.items()))


def example_files(t: Target) -> tuple[dict[str, Path], list[str]]:
    """The example program's files and its translation units (paths in the folder)."""
    if t.kind == "firmware":
        base = FW_DIR.resolve()
        units = [*COMMON_SRC, *FAMILIES[t.family]["sources"]]
        files = _closure([base / u for u in units], base)
        return ({f"firmware/{f.relative_to(base).as_posix()}": f for f in files}, [f"firmware/{u}" for u in units])
    base = RUNTIME_DIR.resolve()
    units = [DEMO_MAIN, DEMO_COMMON]
    files = _closure([base / u for u in units], base)
    extra = {"colibri.map": RUNTIME_DIR / "colibri.map"}  # the shared library's version script
    return ({f.relative_to(base).as_posix(): f for f in files} | extra, units)
