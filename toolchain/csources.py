"""What every build of the C runtime shares, written once: its sources, the flags, the ABI and the version.

The SCons tools (toolchain/scons/) and the tests that compile the runtime directly (tests/cbuild.py,
tests/test_kernels.py) read these; none of them lists a runtime source or a warning flag itself.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

RUNTIME_DIR = Path(__file__).resolve().parent.parent / "runtime_c"

# The runtime's translation units, relative to runtime_c/src/.
RUNTIME_SRC = ("blob.c", "forward.c", "kernels.c", "kernels_q8.c", "cbmath.c", "sample.c")
# The optional text runtime (colibri_text.h): linked into the Linux shared libraries, not into firmware.
TEXT_SRC = ("text/tok.c",)
# The kernels alone (the kernel test programs bring their own main and no blob code).
KERNEL_SRC = ("kernels.c", "kernels_q8.c", "cbmath.c")  # what the kernel tests link: no blob, no forward pass

WARN_CFLAGS = ("-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic")
# Identical arithmetic on every target: no fused multiply-add contraction, no errno from sqrt.
FLOAT_CFLAGS = ("-ffp-contract=off", "-fno-math-errno")
# The optimisation level per kind of target: microcontrollers trade speed for flash.
OPT_CFLAGS = {"linux": "-O2", "firmware": "-Os"}
# Every C compile of every target: the above, debug info, and sections the linker can drop one by one.
COMMON_CFLAGS = (*WARN_CFLAGS, *FLOAT_CFLAGS, OPT_CFLAGS["linux"], "-g", "-fvisibility=hidden", "-ffunction-sections",
                 "-fdata-sections")
# The runtime and model objects of a specialised build (the model's dimensions compiled in).
SPECIALISED_DEFINES = ("COLIBRI_BUILDING", "COLIBRI_SPECIALISED")


def runtime_sources(names: tuple[str, ...] = RUNTIME_SRC) -> list[Path]:
    """Absolute paths of runtime sources (default: all of them)."""
    return [RUNTIME_DIR / "src" / s for s in names]


@cache
def abi_major() -> int:
    """COLIBRI_ABI_VERSION as colibri.h defines it (the shared libraries' SONAME carries it)."""
    header = RUNTIME_DIR / "include" / "colibri.h"
    m = re.search(r"^#define COLIBRI_ABI_VERSION (\d+)\b", header.read_text(), re.M)
    if not m:
        raise RuntimeError(f"{header}: no #define COLIBRI_ABI_VERSION")
    return int(m.group(1))


@cache
def package_version() -> str:
    """The installed colibri's version (pyproject.toml's), as the pkg-config files state it."""
    from colibri.codegen import __version__

    return __version__
