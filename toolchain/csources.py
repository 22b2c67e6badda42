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
# The optional text runtime (colibri_text.h): in every build; a program that calls none of it (a firmware image
# without a text prompt) links none of it (--gc-sections).
TEXT_SRC = ("text/tok.c", "text/nfc.c", "text/pre_deepseek.c")
# The kernels alone (the kernel test programs bring their own main and no blob code).
KERNEL_SRC = ("kernels.c", "kernels_q8.c", "cbmath.c")  # what the kernel tests link: no blob, no forward pass

WARN_CFLAGS = ("-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic")
# Identical arithmetic on every target: no fused multiply-add contraction, no errno from sqrt.
FLOAT_CFLAGS = ("-ffp-contract=off", "-fno-math-errno")
# The optimisation level per kind of target: microcontrollers trade speed for flash.
OPT_CFLAGS = {"linux": "-O2", "firmware": "-Os"}
# Debug info that is the same wherever the object was compiled. A compile of distcc's preprocessed source
# (macros expanded) places tokens in other columns than a compile of the source: no column numbers. The
# command line is not recorded in DW_AT_producer (the analysis files a compile also writes are no part of
# its object: toolchain/scons/launch.py leaves those options out of a remote compile).
DEBUG_CFLAGS = ("-g", "-gno-column-info", "-gno-record-gcc-switches")
# GCC only (clang takes a macro's tokens' lines from the expansion anyway): a token from a macro on its
# expansion's line, as in preprocessed source, where GCC would track it into the macro (other line rows).
GCC_DEBUG_CFLAGS = ("-ftrack-macro-expansion=0",)
# Every C compile of every target: the above, debug info, and sections the linker can drop one by one.
COMMON_CFLAGS = (*WARN_CFLAGS, *FLOAT_CFLAGS, OPT_CFLAGS["linux"], *DEBUG_CFLAGS, "-fvisibility=hidden",
                 "-ffunction-sections", "-fdata-sections")
# The runtime and model objects of a specialised build (the model's dimensions compiled in).
SPECIALISED_DEFINES = ("COLIBRI_BUILDING", "COLIBRI_SPECIALISED")


PREFIX_MAP = "-ffile-prefix-map="


def prefix_map_flags(root: Path, build: Path) -> list[str]:
    """Debug info and __FILE__ independent of where the checkout and the build root are: the checkout (the
    compiles' working directory, DW_AT_comp_dir) becomes `.`, the build root `build` (its default place
    under the checkout). The last matching map wins, so the build root, which may lie inside the checkout,
    comes last. A path holding `=` cannot be mapped (GCC splits at the first)."""
    maps = [(root, "."), (build, "build")]
    return [f"{PREFIX_MAP}{old}={new}" for old, new in maps if "=" not in str(old)]


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
def abi_minor() -> int:
    """COLIBRI_ABI_MINOR: the compatible additions since the major (a program built against minor N runs on any
    runtime of the same major and a minor >= N)."""
    header = RUNTIME_DIR / "include" / "colibri.h"
    m = re.search(r"^#define COLIBRI_ABI_MINOR (\d+)\b", header.read_text(), re.M)
    if not m:
        raise RuntimeError(f"{header}: no #define COLIBRI_ABI_MINOR")
    return int(m.group(1))


@cache
def package_version() -> str:
    """The installed colibri's version (pyproject.toml's), as the pkg-config files state it."""
    from colibri.codegen import __version__

    return __version__
