"""ABI and hygiene: what a library exports, what it needs, and how it is hardened.

The runtime's contract (DESIGN.md): only `colibri_*` is public; no malloc, no
threads, no I/O, no system calls. A library that exports or imports anything
else is flagged; executables and firmware are checked for what they link in.
"""

from __future__ import annotations

import re

from .elf import Artifact, ElfImage, Symbol

PUBLIC_PREFIX = "colibri_"
DF_TEXTREL, DF_BIND_NOW, DF_1_NOW, PF_X = 0x4, 0x8, 0x1, 0x1
FORBIDDEN: dict[str, str] = {
    **dict.fromkeys(("malloc", "calloc", "realloc", "free", "aligned_alloc", "posix_memalign", "memalign",
                     "valloc", "pvalloc", "reallocarray", "strdup", "strndup", "sbrk", "brk", "_sbrk", "_sbrk_r",
                     "_malloc_r", "_calloc_r", "_realloc_r", "_free_r", "__libc_malloc", "__libc_free"),
                    "heap allocation"),
    **dict.fromkeys(("fopen", "fclose", "fread", "fwrite", "printf", "fprintf", "vfprintf", "puts", "fputs",
                     "putchar", "fputc", "fflush", "perror", "open", "read", "write", "close", "mmap", "munmap",
                     "ioctl", "syscall", "getenv", "time", "clock_gettime", "gettimeofday", "signal", "raise",
                     "__errno_location", "exit", "_exit", "abort", "atexit", "__cxa_atexit", "__tls_get_addr"),
                    "I/O, process or system call"),
}
FORBIDDEN_PATTERNS = [(re.compile(r"^(pthread_|thrd_|mtx_|cnd_|sem_)"), "threads"),
                      (re.compile(r"^(setjmp|longjmp|_setjmp|__longjmp)"), "non-local jumps")]
ALLOWED_PATTERNS = [re.compile(p) for p in (
    r"^(memcpy|memmove|memset|memcmp|memchr|strlen|strnlen|strcmp|strncmp|strchr)$",
    r"^__(memcpy|memset|memmove)_chk$",
    r"^(sqrt|exp|expm1|log|log1p|pow|sin|cos|tan|tanh|erf|fabs|floor|ceil|round|fmax|fmin|ldexp|frexp)f?$",
    r"^__stack_chk_(fail|guard)$", r"^__aeabi_", r"^__gnu_(f2h|h2f)_ieee$", r"^__(extend|trunc)[a-z0-9]+2$",
    r"^__(add|sub|mul|div|mod|udiv|umod|neg|cmp|ucmp|ashl|ashr|lshr|fix|fixuns|float|floatun|popcount|clz|ctz|"
    r"bswap|ffs|eq|ne|lt|le|gt|ge|unord)[a-z0-9]*[0-9]$",
    r"^(_ITM_registerTMCloneTable|_ITM_deregisterTMCloneTable|__gmon_start__|__cxa_finalize|_GLOBAL_OFFSET_TABLE_|"
    r"__dso_handle|_DYNAMIC|__global_pointer\$)$",
)]


def why_forbidden(name: str) -> str | None:
    if name in FORBIDDEN:
        return FORBIDDEN[name]
    return next((why for pat, why in FORBIDDEN_PATTERNS if pat.match(name)), None)


def undefined_flag(name: str) -> str | None:
    """Why a library must not need this symbol, or None when it may."""
    why = why_forbidden(name)
    if why:
        return f"forbidden: {why}"
    if any(p.match(name) for p in ALLOWED_PATTERNS):
        return None
    return "unexpected dependency"


def _clean(name: str) -> str:
    return name.split("@", 1)[0]


def artifact_kind(img: ElfImage, archive: bool, firmware: bool | None = None) -> str:
    if archive:
        return "archive"
    if img.etype == "ET_REL":
        return "object"
    has_dynamic = any(s.type == "PT_DYNAMIC" for s in img.segments)
    if img.etype == "ET_DYN":
        return "pie-executable" if img.interp else "shared-library"
    if has_dynamic or img.interp:
        return "executable"
    if firmware is None:
        firmware = img.section(".note.ABI-tag") is None
    return "firmware" if firmware else "static-executable"


def _exports(images: list[ElfImage], kind: str) -> list[Symbol]:
    if kind == "shared-library":
        return [s for s in images[0].dynsyms if s.defined and s.bind in ("GLOBAL", "WEAK", "GNU_UNIQUE")
                and s.visibility in ("DEFAULT", "PROTECTED") and s.type not in ("SECTION", "FILE")
                and not (s.shndx == "SHN_ABS" and s.size == 0)]
    if kind in ("archive", "object"):  # default visibility: exported by any .so this is linked into
        return [s for img in images for s in img.symbols if s.defined and s.bind in ("GLOBAL", "WEAK")
                and s.visibility in ("DEFAULT", "PROTECTED") and s.type not in ("SECTION", "FILE")]
    return []


def _namespace(images: list[ElfImage], kind: str) -> list[str]:
    """Hidden globals of an archive: not exported, but they can still clash in a user's static link."""
    if kind not in ("archive", "object"):
        return []
    return sorted({s.name for img in images for s in img.symbols if s.defined and s.bind in ("GLOBAL", "WEAK")
                   and s.visibility not in ("DEFAULT", "PROTECTED") and not s.name.startswith(PUBLIC_PREFIX)
                   and s.type not in ("SECTION", "FILE")})


def _undefined(images: list[ElfImage], kind: str) -> list[str]:
    if kind == "shared-library":
        return sorted({_clean(s.name) for s in images[0].dynsyms if not s.defined and s.name})
    if kind in ("archive", "object"):
        defined = {s.name for img in images for s in img.symbols if s.defined and s.bind != "LOCAL"}
        return sorted({s.name for img in images for s in img.symbols
                       if not s.defined and s.name and s.type != "FILE" and s.name not in defined})
    if kind in ("executable", "pie-executable"):
        return sorted({_clean(s.name) for s in images[0].dynsyms if not s.defined and s.name})
    return []


def _hardening(img: ElfImage) -> dict:
    types = {s.type: s for s in img.segments}
    flags = (img.dynamic.get("DT_FLAGS") or [0])[0]
    flags1 = (img.dynamic.get("DT_FLAGS_1") or [0])[0]
    bind_now = "DT_BIND_NOW" in img.dynamic or bool(flags & DF_BIND_NOW) or bool(flags1 & DF_1_NOW)
    relro = "PT_GNU_RELRO" in types
    stack = types.get("PT_GNU_STACK")
    return {
        "relro": "full" if relro and bind_now else "partial" if relro else "none",
        "bind_now": bind_now,
        "textrel": "DT_TEXTREL" in img.dynamic or bool(flags & DF_TEXTREL),
        "exec_stack": stack is None or bool(stack.flags & PF_X),
        "gnu_stack_note": stack is not None,
        "needed": list(img.needed),
    }


def audit_abi(artifact: Artifact, firmware: bool | None = None) -> dict:
    images = artifact.images
    if not images:
        return {"kind": "archive", "exported": [], "flagged_exports": [], "undefined": [], "flagged_undefined": [],
                "link_namespace": [], "linked_forbidden": [], "hardening": None,
                "issues": ["archive has no ELF members"]}
    kind = artifact_kind(images[0], artifact.archive, firmware)
    exported = sorted({_clean(s.name) for s in _exports(images, kind)})
    undefined = _undefined(images, kind)
    library = kind in ("shared-library", "archive", "object")
    issues: list[str] = []
    flagged_exports = [n for n in exported if not n.startswith(PUBLIC_PREFIX)] if library else []
    flagged_undefined = []
    if library:
        flagged_undefined = [{"name": n, "reason": r} for n in undefined if (r := undefined_flag(n))]
    for n in flagged_exports:
        issues.append(f"exports {n}: not {PUBLIC_PREFIX}*")
    for f in flagged_undefined:
        issues.append(f"needs {f['name']}: {f['reason']}")
    linked_forbidden = []
    if kind == "firmware":  # a hosted static executable links all of these through libc's startup
        linked_forbidden = sorted({s.name for s in images[0].symbols if s.defined and s.type == "FUNC"
                                   and why_forbidden(s.name) not in (None, "I/O, process or system call")})
        issues += [f"links {n}: {why_forbidden(n)}" for n in linked_forbidden]
    out = {"kind": kind, "exported": exported, "flagged_exports": flagged_exports, "undefined": undefined,
           "flagged_undefined": flagged_undefined, "link_namespace": _namespace(images, kind),
           "linked_forbidden": linked_forbidden, "hardening": None}
    if kind in ("shared-library", "executable", "pie-executable"):
        h = _hardening(images[0])
        out["hardening"] = h
    if kind == "shared-library":  # executables are shown, not judged: the runtime ships as a library
        h = out["hardening"]
        if h["relro"] != "full":
            issues.append(f"RELRO is {h['relro']} (link with -Wl,-z,relro,-z,now)")
        if h["textrel"]:
            issues.append("has text relocations (compile with -fPIC)")
        if h["exec_stack"]:
            issues.append("executable stack (link with -Wl,-z,noexecstack)" if h["gnu_stack_note"]
                          else "no PT_GNU_STACK: the stack may be executable (link with -Wl,-z,noexecstack)")
    out["issues"] = issues
    return out
