"""What a target file (targets/<name>.toml) may say: every key once, with its type, default and reader.

`validate(data, path)` checks a parsed file against SCHEMA and returns its values with the defaults
filled in (sizes as integers); it raises SchemaError with one line naming the file and the key.
targets/SCHEMA.md is generated from SCHEMA (`python -m colibri.toolchain.target_schema --write`;
a test fails when the checked-in file differs).
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colibri.codegen.layout import DEFAULT_LAYOUT, LAYOUTS
from colibri.codegen.plan import MAX_PREFILL_BLOCK

from .size.regions import KIND_ROLE, parse_bytes

KINDS = ("linux", "firmware")
IMAGE = "image"  # required to build or boot a firmware image (checked by the build and `colibri targets --check`)
REGION_KINDS = tuple(KIND_ROLE)
PLACEMENT = ("vectors", "text", "model", "rodata", "stack", "data", "bss", "arena")
# The model's buffers by class (codegen/plan.py CLASSES), each in a region of its own if the target says so;
# not given: the arena's region.
CLASS_PLACEMENT = ("kv_cache", "activations", "scratch")
# the prefill blocks the runtime's per-token arrays are written for (runtime_c/src/cb_runtime.h CB_MAX_BLOCK)
PREFILL_BLOCKS = (32, MAX_PREFILL_BLOCK)
KERNEL_PATHS = ("float", "int8")


class SchemaError(ValueError):
    """A target file that does not follow the schema: the message is one line naming the file."""


@dataclass(frozen=True)
class Key:
    name: str
    type: str  # string | integer | size | boolean | strings | kernel | table | tables
    doc: str
    reader: str = ""  # the module that reads it
    required: tuple[str, ...] = ()  # kinds (KINDS, IMAGE) for which it must be given; "*" inside tables
    default: Any = None
    choices: tuple = ()
    keys: tuple[Key, ...] = ()  # the keys of a table, or of each table of a list of tables


def _region_keys(kind_required: bool) -> tuple[Key, ...]:
    return (
        Key("name", "string", "the region's name, as placement and the linker script spell it", required=("*",)),
        Key("origin", "size", "start address (an integer, or a size string such as \"0x8000\")", required=("*",)),
        Key("length", "size", "bytes (an integer, or a size string such as \"512K\")", required=("*",)),
        Key("kind", "string", "flash (internal, read-only at run time), xip-flash (memory-mapped external "
            "flash, QSPI/OSPI: read-only; code and weights are read in place there), ram (internal) or ext-ram "
            "(external SDRAM/PSRAM: the model's KV cache, activations and scratch; not the weights, which the "
            "startup does not copy, nor the stack, .data and .bss, which boot code uses before the external "
            "memory controller is set up)" +
            ("" if kind_required else "; default: the kind of the part's region of that name"),
            required=("*",) if kind_required else (), choices=REGION_KINDS),
    )


PARTITION_KEYS = (
    Key("region", "string", "the flash region (of `memory`) holding the partition; the application keeps the "
        "region's bytes below it", required=("*",)),
    Key("origin", "size", "the partition's start address in the part's map, 64-byte aligned (the QEMU image's: "
        "the same offset in the QEMU map's region of that name)", required=("*",)),
    Key("length", "size", "the partition's bytes: a blob larger than this is refused at build time",
        required=("*",)),
)

_PLACE_DOC = {"vectors": "the vector table", "text": "code", "model": "the weights (.rodata.model)",
              "rodata": "constants", "stack": "the stack", "data": ".data (and .tdata)",
              "bss": ".bss (and .tbss): with data",
              "arena": "the model arena: the default region of kv_cache, activations and scratch",
              "kv_cache": "the KV cache (.bss.colibri_kv); default: arena's region",
              "activations": "the runtime's context and activations (.bss.colibri_arena); default: arena's region",
              "scratch": "attention scores and int8 activations (.bss.colibri_scratch); default: arena's region"}

SCHEMA: tuple[Key, ...] = (
    Key("description", "string", "one line for `colibri targets`", "toolchain/cli.py", required=KINDS),
    Key("kind", "string", "linux: a program for an OS (qemu-user or native); firmware: a bare-metal image",
        "toolchain/sconsbuild.py", required=KINDS, choices=KINDS),
    Key("arch", "string", "the CPU architecture (ELF machine)", "toolchain/firmware.py", required=KINDS),
    Key("cc", "string", "the compiler command, possibly with arguments (\"clang-19 --target=...\")",
        "toolchain/sconsbuild.py", required=KINDS),
    Key("tools_prefix", "string", "binutils prefix when cc does not imply it (clang)", "toolchain/targets.py",
        default=""),
    Key("cflags", "strings", "compiler flags of this target (-mcpu, -march, ...)", "toolchain/sconsbuild.py",
        default=()),
    Key("linkflags", "strings", "linker flags of this target", "toolchain/sconsbuild.py", default=()),
    Key("runner", "strings", "the command that runs a built program (QEMU); empty: natively",
        "toolchain/cli.py", required=(IMAGE,), default=()),
    Key("sysroot", "string", "where the runner finds the target's shared libraries (qemu -L)", "toolchain/cli.py",
        default=""),
    Key("packages", "strings", "Debian packages that provide cc and the runner (toolchain/dev.sh installs "
        "the union)", "toolchain/targets.py", default=()),
    Key("cpu_flags", "strings", "CPU features (/proc/cpuinfo flags) the build machine needs to run natively "
        "built programs", "toolchain/targets.py", default=()),
    Key("weight_layout", "string", "order of the int8 matrices for this target's kernels: 16-row tiles (x86, "
        "NEON, RVV) or rows (MVE, DSP, scalar)", "toolchain/sconsbuild.py", default=DEFAULT_LAYOUT,
        choices=tuple(LAYOUTS)),
    Key("max_prefill_block", "integer", "largest prefill block the runtime takes (-DCOLIBRI_MAX_PREFILL_BLOCK): "
        "its per-token arrays of row pointers live on the stack", "toolchain/sconsbuild.py",
        default=MAX_PREFILL_BLOCK, choices=PREFILL_BLOCKS),
    Key("threads", "boolean", "the runtime may split matrix products through a parallel_for hook; false: "
        "-DCOLIBRI_NO_PARALLEL (no indirect call, a static stack bound)", "toolchain/sconsbuild.py",
        default=True),
    Key("kernels", "table", "the kernel paths this target's flags must select, as the runtime reports them: "
        "a name, or a table of space-separated /proc/cpuinfo flags to name (the first whose flags the "
        "build machine has; none: scalar) for -march=native", "tests/targets_under_test.py", default={},
        keys=(Key("float", "kernel", "cb_kernels_isa(): float activations (f32, f16 models)"),
              Key("int8", "kernel", "cb_kernels_q8_isa(): the integer matmuls (int8, int8c)"))),
    Key("family", "string", "firmware family: startup code, entry point, stack roots (firmware.FAMILIES)",
        "toolchain/firmware.py", required=(IMAGE,)),
    Key("stack_bytes", "integer", "stack reserved by the linker script; the link fails when the computed "
        "bound exceeds it", "toolchain/firmware.py", required=(IMAGE,)),
    Key("qemu_clock_hz", "integer", "the QEMU machine's SysTick clock: with -icount, ticks become "
        "instructions (0: not given; the image then reports SysTick cycles)", "toolchain/firmware.py", default=0),
    Key("memory", "tables", "the part's memory map; budgets and the size audit use it",
        "toolchain/firmware.py", required=("firmware",), default=(), keys=_region_keys(True)),
    Key("placement", "table", "the region of each output section", "toolchain/firmware.py",
        required=(IMAGE,), default={},
        keys=tuple(Key(p, "string", _PLACE_DOC[p], required=("*",)) for p in PLACEMENT)
        + tuple(Key(p, "string", _PLACE_DOC[p]) for p in CLASS_PLACEMENT)),
    Key("qemu_memory", "tables", "the map of the QEMU machine that boots the image, when not the part's: "
        "the same regions, moved", "toolchain/firmware.py", default=(), keys=_region_keys(False)),
    Key("qemu_placement", "table", "placement of the QEMU image where it differs from placement",
        "toolchain/firmware.py", default={},
        keys=tuple(Key(p, "string", _PLACE_DOC[p]) for p in PLACEMENT + CLASS_PLACEMENT)),
    Key("budget", "table", "flash and RAM the image may take (bytes or size strings)", "toolchain/size/audit.py",
        required=("firmware",), default={},
        keys=(Key("flash", "size", "flash bytes", required=("*",)), Key("ram", "size", "RAM bytes", required=("*",)))),
    Key("partitions", "table", "flash partitions written on their own (`scons PARTITION=model`: the weights in "
        "the `model` partition, the application image without them)", "toolchain/partition.py", default={},
        keys=(Key("model", "table", "the model partition: the blob, linked at its origin, that the application "
                  "validates at boot", keys=PARTITION_KEYS),)),
)

BY_NAME = {k.name: k for k in SCHEMA}


def _type_error(where: str, key: Key, value: Any) -> SchemaError:
    want = {"string": "a string", "integer": "a non-negative integer", "boolean": "true or false",
            "size": "a size (bytes, or a string such as \"512K\")", "strings": "a list of strings",
            "kernel": "a kernel name or a table of CPU flags to kernel names", "table": "a table",
            "tables": "a list of tables"}[key.type]
    return SchemaError(f"{where}{key.name} must be {want}, not {value!r}")


def _value(where: str, key: Key, value: Any) -> Any:
    t = key.type
    if t == "string":
        ok = isinstance(value, str)
    elif t == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    elif t == "boolean":
        ok = isinstance(value, bool)
    elif t == "size":
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise _type_error(where, key, value)
        try:
            value = parse_bytes(value)
        except ValueError:
            raise _type_error(where, key, value) from None
        ok = value >= 0
    elif t == "strings":
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        value = tuple(value) if ok else value
    elif t == "kernel":
        ok = isinstance(value, str) or (isinstance(value, dict) and all(isinstance(v, str) for v in value.values()))
    elif t == "table":
        if not isinstance(value, dict):
            raise _type_error(where, key, value)
        return _table(f"{where}{key.name}.", key.keys, value)
    else:  # tables
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise _type_error(where, key, value)
        return tuple(_table(f"{where}{key.name}[{i}].", key.keys, v) for i, v in enumerate(value))
    if not ok:
        raise _type_error(where, key, value)
    if key.choices and value not in key.choices:
        raise SchemaError(f"{where}{key.name} = {value!r}: use one of {', '.join(map(repr, key.choices))}")
    return value


def _unknown(where: str, name: str, known: list[str]) -> SchemaError:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"
    return SchemaError(f"{where}unknown key {name!r}{hint}")


def _table(where: str, keys: tuple[Key, ...], data: dict) -> dict:
    """A nested table: its keys checked, nothing filled in (absent keys stay absent)."""
    by_name = {k.name: k for k in keys}
    out = {}
    for name, value in data.items():
        if name not in by_name:
            raise _unknown(where, name, list(by_name))
        out[name] = _value(where, by_name[name], value)
    missing = [k.name for k in keys if "*" in k.required and k.name not in data]
    if missing:
        raise SchemaError(f"{where.rstrip('.')}: missing key {missing[0]!r}")
    return out


def validate(data: dict, path: str | Path) -> dict[str, Any]:
    """The file's values for every key of SCHEMA (defaults filled in), or SchemaError naming path."""
    where = f"{path}: "
    out = {}
    for name, value in data.items():
        if name not in BY_NAME:
            raise _unknown(where, name, list(BY_NAME))
        out[name] = _value(where, BY_NAME[name], value)
    kind = out.get("kind")
    if kind is None:
        raise SchemaError(f"{where}missing key 'kind' (one of {', '.join(KINDS)})")
    for key in SCHEMA:
        if kind in key.required and key.name not in out:
            raise SchemaError(f"{where}missing key {key.name!r} ({key.doc})")
    return {k.name: out.get(k.name, k.default) for k in SCHEMA}


def missing_for_image(given: frozenset[str] | set[str]) -> list[str]:
    """The keys a firmware image needs that a file does not give."""
    return [k.name for k in SCHEMA if IMAGE in k.required and k.name not in given]


# --- targets/SCHEMA.md ---------------------------------------------------------------------------

SCHEMA_MD = Path(__file__).resolve().parent.parent / "targets" / "SCHEMA.md"


def _required(key: Key) -> str:
    names = {"linux": "linux", "firmware": "firmware", IMAGE: "firmware image", "*": "yes"}
    return ", ".join(names[r] for r in key.required) or "—"


def _default(key: Key) -> str:
    if key.required and not key.default and key.default is not False:
        return "—"
    if isinstance(key.default, bool):
        return "`true`" if key.default else "`false`"
    if key.default in ((), {}, None):
        return "`[]`" if key.type in ("strings", "tables") else "none" if key.default is None else "`{}`"
    return f'`"{key.default}"`' if isinstance(key.default, str) else f"`{key.default}`"


def _doc(key: Key) -> str:
    choices = f" One of {', '.join(f'`{c}`' for c in key.choices)}." if key.choices else ""
    return key.doc + "." + choices


def render_markdown() -> str:
    lines = [
        "# Target files",
        "",
        "<!-- generated from toolchain/target_schema.py by `python -m colibri.toolchain.target_schema --write`;",
        "     tests/test_targets.py fails when this file differs -->",
        "",
        "One TOML file per target in `targets/`; its name (without `.toml`) is the target's name. Every file is",
        "checked against this schema when it is loaded: a key of the wrong type, a missing required key or an",
        "unknown key (with the closest known one: \"did you mean 'cflags'?\") is one line naming the file, and",
        "`colibri targets` lists such a file as broken beside the others. `colibri targets --check` also checks",
        "the firmware memory maps (overlapping regions, placement into unknown regions, budgets beyond the",
        "regions, the QEMU map's sizes) and that each target's compiler and runner are installed.",
        "",
        "Required: `linux`/`firmware` for targets of that kind; `firmware image` for a firmware target that is",
        "built into an image or booted (every file in `targets/`; a board file given to `colibri size --target`",
        "needs only its memory map and budget).",
        "",
        "| key | type | required | default | read by | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for key in SCHEMA:
        reader = f"`{key.reader}`" if key.reader else ""
        lines.append(f"| `{key.name}` | {key.type} | {_required(key)} | {_default(key)} | {reader} | {_doc(key)} |")
    for key in SCHEMA:
        if not key.keys:
            continue
        shape = "each table of the list" if key.type == "tables" else "the table"
        lines += ["", f"## `{key.name}`", "", f"Keys of {shape}:", "", "| key | type | required | meaning |",
                  "|---|---|---|---|"]
        for sub in key.keys:
            lines.append(f"| `{sub.name}` | {sub.type} | {'yes' if sub.required else 'no'} | {_doc(sub)} |")
        for sub in (s for s in key.keys if s.keys):  # a table of tables ([partitions.model])
            lines += ["", f"## `{key.name}.{sub.name}`", "", "Keys of the table:", "",
                      "| key | type | required | meaning |", "|---|---|---|---|"]
            lines += [f"| `{k.name}` | {k.type} | {'yes' if k.required else 'no'} | {_doc(k)} |" for k in sub.keys]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render_markdown()
    if argv == ["--write"]:
        SCHEMA_MD.write_text(text)
        return 0
    if argv == ["--check"]:
        if not SCHEMA_MD.is_file() or SCHEMA_MD.read_text() != text:
            print(f"{SCHEMA_MD}: out of date: run python -m colibri.toolchain.target_schema --write", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
