"""Firmware images: a model in a microcontroller's flash, its arena in SRAM, no OS, no heap.

A firmware target (targets/<name>.toml, kind = "firmware") describes the real part:
`[[memory]]` regions, a `[placement]` of vectors/text/model/rodata/stack/data/bss/arena
(and of the arena's classes kv_cache/activations/scratch, by default where the arena is)
into them, `[budget]` flash/ram and `stack_bytes`. When the QEMU machine that boots the
image has another map, `qemu_memory` (and optionally `qemu_placement`) give a second
variant: both linker scripts come from firmware_examples/firmware.ld.j2.

The SCons tool toolchain/scons/firmware.py builds, under build/<target>/<model>/:
  <model>.ld, <model>.elf/.map/.bin/.hex, <model>.size.json   the part
  <model>-qemu.ld, <model>-qemu.elf/.map                      the image QEMU boots
The link step refuses (one line, no image left behind) a stack reservation below the
computed bound, a region overflow and a flash/RAM budget overrun. Flash, RAM and budgets
are toolchain/size's (`colibri size` on the .elf reports what .size.json holds); only the
stack bound of the whole image, reset path plus exception handlers, is computed here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

from colibri.codegen.format import CLASSES

from .size.audit import Options, audit, over_budget, region_overflow
from .size.command import report_line
from .size.regions import KIND_ROLE, MemoryRegion, section_class
from .size.stack import analysis_files
from .targets import ROOT, Target, TargetError

FW_DIR = ROOT / "firmware_examples"
TEMPLATE = "firmware.ld.j2"
PLACEMENT_KEYS = ("vectors", "text", "model", "rodata", "stack", "data", "bss", "arena")
CLASS_KEYS = CLASSES  # the arena's classes of data: optional placement keys; default: the arena's region
# The region kinds each placement key may name (target_schema.REGION_KINDS). External flash is mapped by
# the startup, after reset: the vector table stays in internal memory (a QEMU image may boot from RAM).
# External RAM is set up by the startup too, after .data/.bss and the stack are needed; the weights are
# read in place, never copied, so they live in a flash region, internal or memory-mapped.
_RAM, _FLASH = ("ram", "ext-ram"), ("flash", "xip-flash")
PLACE_KINDS = {"vectors": ("flash", "ram"), "text": _FLASH, "model": _FLASH, "rodata": _FLASH, "stack": ("ram",),
               "data": ("ram",), "bss": ("ram",), "arena": _RAM, "kv_cache": _RAM, "activations": _RAM,
               "scratch": _RAM}
WHY_NOT = {
    ("model", "ext-ram"): "the weights are read in place and the startup does not copy them into RAM",
    ("vectors", "xip-flash"): "the core boots from internal memory, before external flash is mapped",
    **{(k, "ext-ram"): "boot code uses it before the external memory controller is set up"
       for k in ("stack", "data", "bss")},
}
FAMILIES = {
    # app sources, entry symbol, stack roots: the reset path, then exception handlers
    "cortex-m": {"sources": ("cortex-m/startup.c",), "entry": "Reset_Handler",
                 "reset": ("Reset_Handler",), "handlers": ("SysTick_Handler", "Fault_Handler"),
                 # exception entry pushes 8 words, 26 + alignment with FP context (lazy stacking)
                 "exception_frame": 112},
    "riscv": {"sources": ("riscv/startup.S", "riscv/board.c"), "entry": "_start",
              "reset": ("board_boot", "main", "board_exit"), "handlers": ("board_trap",), "exception_frame": 0},
}
COMMON_SRC = ("common/main.c", "common/boot.c", "common/print.c", "common/semihost.c")
PROMPTS_APP = "common/prompts.c"  # main.c's stand-in in the image of a table of prompts (toolchain/prompts.py)
# Stack for calls into code compiled without -fstack-usage (libc, libgcc, libm: memcpy,
# memset, 64-bit division, soft float: leaves or near-leaves of 16-80 bytes), charged once on
# top of the deepest path.
# What every firmware link adds to the target's linkflags (with -T <script> and -Map=<file>), libm last.
LINK_FLAGS = ("-nostartfiles", "-Wl,--gc-sections", "-Wl,--no-warn-rwx-segments")
LINK_LIBS = ("-lm",)
EXTERNAL_STACK: dict[str, int] = {}
EXTERNAL_STACK_DEFAULT = 128
SEMIHOSTING = ["-semihosting-config", "enable=on,target=native,chardev=colibri_console",
               "-chardev", "stdio,id=colibri_console", "-display", "none", "-serial", "null", "-monitor", "none"]


class FirmwareError(Exception):
    """A firmware image that cannot be made: the message is one line for the user."""


@dataclass(frozen=True)
class Variant:
    name: str  # "part" | "qemu"
    regions: tuple[MemoryRegion, ...]
    place: dict


@dataclass(frozen=True)
class Firmware:
    target: Target
    family: str
    part: Variant
    qemu: Variant | None  # None: QEMU boots the part's own image
    flash_budget: int
    ram_budget: int
    stack_bytes: int
    insn_per_tick: Fraction | None  # Cortex-M under QEMU -icount: SysTick ticks -> instructions

    @property
    def qemu_variant(self) -> Variant:
        """What QEMU boots: the QEMU map, or the part's own map linked as a QEMU image of its own."""
        return self.qemu or Variant("qemu", self.part.regions, self.part.place)


def _int(value, what: str, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TargetError(f"{path}: {what} must be a non-negative integer, not {value!r}")
    return value


def _regions(raw, path: str, what: str, kinds: dict[str, str] | None = None) -> tuple[MemoryRegion, ...]:
    if not isinstance(raw, list) or not raw:
        raise TargetError(f"{path}: {what} must be a non-empty list of {{name, origin, length, kind}}")
    out = []
    for r in raw:
        name = r.get("name")
        kind = r.get("kind") or (kinds or {}).get(name)
        if not name or kind not in KIND_ROLE:
            raise TargetError(f"{path}: {what}: region {r!r} needs a name and kind = one of {', '.join(KIND_ROLE)}")
        out.append(MemoryRegion(name, _int(r.get("origin"), f"{name}.origin", path),
                                _int(r.get("length"), f"{name}.length", path), kind))
    names = [r.name for r in out]
    if len(set(names)) != len(names):
        raise TargetError(f"{path}: {what}: duplicate region names {names}")
    return tuple(out)


def _variant(name: str, regions: tuple[MemoryRegion, ...], place: dict, path: str) -> Variant:
    missing = [k for k in PLACEMENT_KEYS if k not in place]
    unknown = [k for k in place if k not in PLACEMENT_KEYS + CLASS_KEYS]
    if missing or unknown:
        problems = ([f"lacks {', '.join(missing)}"] if missing else []) + (
            [f"unknown keys {', '.join(unknown)}"] if unknown else [])
        raise TargetError(f"{path}: {name} placement: {'; '.join(problems)}")
    place = {**{k: place["arena"] for k in CLASS_KEYS}, **place}  # the classes default to the arena's region
    by_name = {r.name: r for r in regions}
    for key in PLACEMENT_KEYS + CLASS_KEYS:
        region = by_name.get(place[key])
        if region is None:
            raise TargetError(f"{path}: {name} placement {key} = {place[key]!r}: no such region")
        if region.kind not in PLACE_KINDS[key]:
            why = f" ({WHY_NOT[(key, region.kind)]})" if (key, region.kind) in WHY_NOT else ""
            raise TargetError(f"{path}: {name} placement {key} = {region.name!r} is {region.kind}, not "
                              f"{' or '.join(PLACE_KINDS[key])}{why}")
    if place["data"] != place["bss"]:
        raise TargetError(f"{path}: data and bss must share a region (thread-local data spans both)")
    return Variant(name, regions, place)


def firmware_spec(t: Target) -> Firmware:
    """The firmware view of a target: its memory maps, placement, budgets; TargetError if malformed."""
    path = f"targets/{t.name}.toml"
    if t.missing_for_image():
        raise TargetError(f"{path}: missing key {t.missing_for_image()[0]!r} (needed to build a firmware image)")
    family = t.family
    if family not in FAMILIES:
        raise TargetError(f"{path}: family must be one of {', '.join(FAMILIES)}, not {family!r}")
    part_regions = _regions(list(t.memory), path, "[[memory]]")
    place = dict(t.placement)
    part = _variant("part", part_regions, place, path)
    qemu = None
    if t.qemu_memory:
        kinds = {r.name: r.kind for r in part_regions}
        q_regions = _regions(list(t.qemu_memory), path, "qemu_memory", kinds)
        q_place = {**place, **t.qemu_placement}
        qemu = _variant("qemu", q_regions, q_place, path)
        if set(qemu.regions) == set(part_regions) and q_place == place:
            qemu = None  # QEMU boots the part's own image
    budget = t.budget
    if "flash" not in budget or "ram" not in budget:
        raise TargetError(f"{path}: [budget] needs flash and ram (bytes)")
    insn_per_tick = None
    if family == "cortex-m" and t.qemu_clock_hz:
        shift = _icount_shift(t.runner)
        if shift is not None:
            insn_per_tick = Fraction(10**9, _int(t.qemu_clock_hz, "qemu_clock_hz", path) * 2**shift)
    return Firmware(t, family, part, qemu, _int(budget["flash"], "budget.flash", path),
                    _int(budget["ram"], "budget.ram", path), _int(t.stack_bytes, "stack_bytes", path),
                    insn_per_tick)


# RAM the runtime and the application keep outside the arena (.data, .bss: console buffers, the demo's
# token arrays) when they share the arena's region: reserved by MAX_SEQ=auto before the image is
# linked, which is when their exact size is known; the link's region check has the last word.
DATA_BSS_RESERVE = 8192


def arena_rooms(fw: Firmware) -> list[tuple[tuple[str, ...], int, str]]:
    """Per memory region holding arena classes (kv_cache, activations, scratch), in the part's map and in
    QEMU's: (the classes placed there, the bytes they may take, how that was found): the region's length
    less the stack reservation and DATA_BSS_RESERVE where the stack or .data/.bss share the region."""
    rooms = []
    for v in (fw.part, fw.qemu_variant):
        held: dict[str, list[str]] = {}
        for cls in CLASS_KEYS:
            held.setdefault(v.place[cls], []).append(cls)
        for name, classes in held.items():
            region = {r.name: r for r in v.regions}[name]
            shared = [k for k in ("stack", "data", "bss") if v.place.get(k) == region.name]
            left = region.length - (fw.stack_bytes if "stack" in shared else 0) - (
                DATA_BSS_RESERVE if {"data", "bss"} & set(shared) else 0)
            why = (f"{region.name} {region.length:,} B" + (f" less stack {fw.stack_bytes:,} B" if "stack" in shared
                                                            else "")
                   + (f" less .data/.bss {DATA_BSS_RESERVE:,} B" if {"data", "bss"} & set(shared) else ""))
            rooms.append((tuple(classes), left, why))
    return rooms


def _icount_shift(runner: tuple[str, ...]) -> int | None:
    """N of `-icount shift=N` in a QEMU command (each instruction = 2^N ns of virtual time)."""
    for flag, value in zip(runner, runner[1:], strict=False):
        if flag == "-icount":
            m = re.search(r"(?:^|,)shift=(\d+)(?:,|$)", value) or re.fullmatch(r"(\d+)", value)
            return int(m.group(1)) if m else None
    return None


def render_linker_script(fw: Firmware, variant: Variant) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(FW_DIR)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    if variant.name == "part":
        note = "Memory map of the part itself; budgets are checked against it."
    elif fw.qemu is None:
        note = f"QEMU image: the part's own memory map, which {' '.join(fw.target.runner[:3])} has too."
    else:
        note = (f"QEMU variant: the regions moved to where {' '.join(fw.target.runner[:3])} has memory; "
                "same sizes, so the same overflows.")
    return env.get_template(TEMPLATE).render(
        target=fw.target.name, description=fw.target.description, variant_note=note, family=fw.family,
        entry=FAMILIES[fw.family]["entry"], regions=variant.regions, place=variant.place,
        stack_bytes=fw.stack_bytes)


def qemu_argv(t: Target, program: str) -> list[str]:
    """How `colibri run` boots a firmware image: its QEMU variant, with semihosting on stdout."""
    p = Path(program)
    if p.suffix == ".elf" and not p.stem.endswith("-qemu"):
        twin = p.with_name(f"{p.stem}-qemu.elf")
        if twin.is_file():
            p = twin
    return list(t.runner) + SEMIHOSTING + ["-kernel", str(p)]


# --- the link step as data, and its SCons action --------------------------------------------------


def link_config(fw: Firmware, model: str, variant: Variant) -> dict:
    """Everything the link step needs, as JSON-able data (it is also the link's signature)."""
    t, fam = fw.target, FAMILIES[fw.family]
    return {
        "target": t.name, "model": model, "family": fw.family, "variant": variant.name, "arch": t.arch,
        "cc": t.cc_argv, "linkflags": list(t.linkflags), "objcopy": t.tool("objcopy"),
        "regions": [asdict(r) for r in variant.regions], "place": variant.place,
        "flash_budget": fw.flash_budget, "ram_budget": fw.ram_budget, "stack_bytes": fw.stack_bytes,
        "reset": list(fam["reset"]), "handlers": list(fam["handlers"]), "exception_frame": fam["exception_frame"],
    }


def _link_action(target, source, env):  # SCons action signature
    cfg = json.loads(env["COLIBRI_FW"])
    outs = [Path(str(t)) for t in target]
    files = [Path(str(s)) for s in source if type(s).__name__ != "Value"]  # the Value: the link's signature
    try:
        summary = link_image(cfg, outs, files)
    except FirmwareError as e:
        for o in outs:
            o.unlink(missing_ok=True)
        what = f"{cfg['target']}" + (" (QEMU variant)" if cfg["variant"] == "qemu" else "")
        print(f"colibri: {what}: model {cfg['model']} {e}", file=sys.stderr)
        return 1
    if summary:
        print(summary)
    return 0


# --- link, audit ---------------------------------------------------------------------------------


_OVERFLOW = re.compile(r"region [`']([^']+)' overflowed by (\d+) bytes")
_NOT_FIT = re.compile(r"section [`']([^']+)' will not fit in region [`']([^']+)'")


def link_image(cfg: dict, outs: list[Path], sources: list[Path]) -> str:
    """Link one variant; for the part, check its budgets, write .bin/.hex and the size report.

    Returns the build log's line (empty for the QEMU variant); FirmwareError when the image
    cannot be made. The audit and the budget decision are toolchain/size's, as in every build."""
    elf, map_ = outs[0], outs[1]
    ld = next(s for s in sources if s.suffix == ".ld")
    objs = [s for s in sources if s.suffix == ".o"]
    manifest = next((s for s in sources if s.name == "manifest.json"), None)
    stack = stack_bound(cfg, objs)
    if stack["bytes"] > cfg["stack_bytes"]:
        raise FirmwareError(f"needs {stack['bytes']} bytes of stack ({' > '.join(stack['path'])}) "
                            f"but targets/{cfg['target']}.toml reserves stack_bytes = {cfg['stack_bytes']}")
    argv = cfg["cc"] + cfg["linkflags"] + [LINK_FLAGS[0], "-T", str(ld), "-Xlinker", f"-Map={map_}", *LINK_FLAGS[1:],
                                           "-o", str(elf)] + [str(o) for o in objs] + list(LINK_LIBS)
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:  # the linker's own region check comes first
        raise FirmwareError(_link_failure(res.stderr, cfg))
    if cfg["variant"] != "part":
        return ""
    report = audit(elf, Options(manifest=manifest, target=cfg["target"],
                                budget={"flash": cfg["flash_budget"], "ram": cfg["ram_budget"]},
                                stack_files=analysis_files(objs)))
    problems = over_budget(report)
    if problems:
        raise FirmwareError("does not fit: " + "; ".join(problems))
    rows = {r["name"]: r for r in report["sections"]}
    for need, kind in ((".rodata.model", "flash"), (".bss.colibri_arena", "ram")):
        if need == ".rodata.model" and cfg.get("partition"):
            continue  # an application image: the weights are in their partition (toolchain/partition.py)
        if not rows.get(need, {}).get(kind):
            raise FirmwareError(f"{need} is not in a {kind} region")
    for fmt, path in (("binary", outs[2]), ("ihex", outs[3])):
        res = subprocess.run([cfg["objcopy"], "-O", fmt, str(elf), str(path)], capture_output=True, text=True)
        if res.returncode != 0:
            raise FirmwareError(f"objcopy -O {fmt} failed: {res.stderr.strip().splitlines()[-1:]}")
    report["image_stack"] = stack
    outs[4].write_text(json.dumps(report, indent=1) + "\n")
    return (f"colibri size: {report_line(report)} · stack bound {stack['bytes']:,} B "
            f"(reserved {cfg['stack_bytes']:,})")


def _link_failure(stderr: str, cfg: dict) -> str:
    """The linker's complaint as one line: the region, the overflow, the budget."""
    overflows: dict[str, int] = {}
    for region, n in _OVERFLOW.findall(stderr):
        overflows[region] = max(overflows.get(region, 0), int(n))
    if overflows:
        regions = {r["name"]: r for r in cfg["regions"]}
        limits = {"flash": cfg["flash_budget"], "ram": cfg["ram_budget"]}
        classes: dict[str, dict[str, str]] = {}  # region -> the classes of data that did not fit, by section
        for sec, region in _NOT_FIT.findall(stderr):
            classes.setdefault(region, {}).setdefault(section_class(sec), sec)
        return "does not fit: " + "; ".join(
            region_overflow(name, n, regions[name]["length"], KIND_ROLE[regions[name]["kind"]], limits,
                            classes.get(name)) if name in regions
            else f"{name} overflowed by {n} bytes" for name, n in overflows.items())
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() or "undefined reference" in ln] or lines
    return "link failed: " + (errors[0] if errors else "no output from the linker")


def stack_bound(cfg: dict, objs: list[Path]) -> dict:
    """Worst-case stack of the image from the .ci call graphs beside the objects.

    The bound is the reset path's depth plus, for each exception handler, its own depth
    and the hardware's exception frame; calls into code with no frame on record (libc,
    libgcc) are charged EXTERNAL_STACK. The forward path is reported on its own.
    """
    from .size.stack import analyze, load_graph

    ci = [o.with_suffix(".ci") for o in objs if o.with_suffix(".ci").is_file()]
    missing = [o.name for o in objs if o.suffix == ".o" and not o.with_suffix(".ci").is_file()
               and o.stem not in ("model_blob", "startup")]
    if missing:
        raise FirmwareError(f"no call graph (.ci) for {', '.join(missing)}: cannot bound the stack")
    graph = load_graph(ci)
    handlers = [h for h in cfg["handlers"] if h in graph.frames]
    resets = [r for r in cfg["reset"] if r in graph.frames]
    if not resets:
        raise FirmwareError(f"no call graph for {', '.join(cfg['reset'])}: cannot bound the stack")
    bounds = {b.entry: b for b in analyze(graph, resets + handlers + ["colibri_forward"], None)
              if b.entry in graph.frames}

    def charged(b) -> int:
        ext = max((EXTERNAL_STACK.get(x, EXTERNAL_STACK_DEFAULT) for x in b.externals), default=0)
        return b.bytes + ext

    for b in bounds.values():
        if not b.bounded:
            raise FirmwareError(f"stack of {b.entry} is unbounded: {'; '.join(b.reasons)}")
    reset = max((bounds[r] for r in resets), key=charged)
    frames = {h: charged(bounds[h]) + cfg["exception_frame"] for h in handlers}
    fwd = bounds.get("colibri_forward")
    return {
        "bytes": charged(reset) + sum(frames.values()),
        "path": reset.path,
        "reset": {"entry": reset.entry, "bytes": reset.bytes, "charged": charged(reset), "path": reset.path,
                  "externals": reset.externals},
        "handlers": frames,
        "forward": {"bytes": fwd.bytes, "charged": charged(fwd), "path": fwd.path,
                    "externals": fwd.externals} if fwd else None,
        "reserved": cfg["stack_bytes"],
        "external_allowance": {"default": EXTERNAL_STACK_DEFAULT, **EXTERNAL_STACK},
    }
