"""Where a build's outputs go, keyed by what makes them differ.

    build/gen/<key>/<quant>[-<layout>]/     one export (layout: when not the Linux targets' tiled16)
    build/<target>[-<sanitizers>][-scalar]/<key>/   what a target builds from it

<key> is the model's name (its checkpoint directory's name made C-safe), then, when the export options
are not all the defaults, `-<quant>` and, when more than the quantization differs, a short hash of the
options: `adder`, `adder-f32`, `adder-int8c-1b2c3d4e`. A second checkpoint whose name makes the same C
name (`a-b` after `a_b`, `runs/y/final` after `runs/x/final`) gets `<name>_<hash of its absolute path>`;
build/models.json records which checkpoint owns each name, first come first served.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

REGISTRY = "models.json"
EXPORT_DEFAULTS_SKIP = ("layout",)  # per target, not per build: in the gen directory's name instead


class LayoutError(Exception):
    """The build directory's registry cannot be used: one line for the user."""


def _hash(text: str, n: int) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:n]


def _load_registry(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise LayoutError(f"{path}: not a colibri model registry ({e}); remove it to start afresh") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise LayoutError(f"{path}: not a colibri model registry (expected an object of name -> checkpoint path)")
    return data


def model_name(build: Path, ckpt: Path, c_name: str) -> str:
    """The checkpoint's name in this build directory: its C-safe name if no other checkpoint holds it,
    else that name with a hash of the checkpoint's absolute path. Call with the build lock held."""
    reg_path = build / REGISTRY
    registry = _load_registry(reg_path)
    owner = os.fsdecode(ckpt.resolve())
    candidates = [c_name] + [f"{c_name}_{_hash(owner, n)}" for n in (8, 16, 64)]
    for name in candidates:
        if registry.get(name, owner) == owner:
            break
    else:  # a 256-bit collision
        raise LayoutError(f"{reg_path}: no free name for {owner}")
    if registry.get(name) != owner:
        registry[name] = owner
        tmp = reg_path.with_name(f".{REGISTRY}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(registry, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(reg_path)
    return name


def option_suffix(opts: dict, defaults: dict) -> str:
    """'' for the default export options, else -<quant>[-<hash of the other options>]. An option left to the
    quantization's own default (outlier_frac None) and the same value spelt out name the same export."""
    from colibri.codegen.quantize import default_outlier_frac

    def resolved(o: dict) -> dict:
        return {**o, "outlier_frac": default_outlier_frac(opts["quant"])} if o.get("outlier_frac") is None else o

    opts, defaults = resolved(opts), resolved(defaults)
    differs = {k: v for k, v in opts.items() if k not in EXPORT_DEFAULTS_SKIP and defaults.get(k) != v}
    if not differs:
        return ""
    others = {k: v for k, v in differs.items() if k != "quant"}
    tail = f"-{_hash(json.dumps(others, sort_keys=True), 8)}" if others else ""
    return f"-{opts['quant']}{tail}"


def export_defaults() -> dict:
    """The exporter's own defaults (codegen/export.py ExportOptions), the reference for option_suffix."""
    from colibri.codegen.export import ExportOptions

    return {f.name: f.default for f in dataclasses.fields(ExportOptions)
            if f.default is not dataclasses.MISSING}


def gen_dir(quant: str, layout: str, max_block: int) -> str:
    """build/gen/<key>/<this>: the quantization, then the layout and the largest prefill block the
    target's runtime takes, each where it is not the default one (tiled16, 128)."""
    from colibri.codegen.layout import DEFAULT_LAYOUT
    from colibri.codegen.plan import MAX_PREFILL_BLOCK

    return quant + (f"-{layout}" if layout != DEFAULT_LAYOUT else "") + (
        f"-pb{max_block}" if max_block != MAX_PREFILL_BLOCK else "")


OUTPUT_LINE = "colibri: {target}: {ckpt} -> {out}"  # printed per target by every build, null builds too


def output_dirs(stdout: str) -> dict[str, Path]:
    """{target: output directory} from a build's standard output (its OUTPUT_LINE per target)."""
    dirs = {}
    for line in stdout.splitlines():
        if line.startswith("colibri: ") and " -> " in line:
            target, _, rest = line[len("colibri: "):].partition(": ")
            dirs[target] = Path(rest.rpartition(" -> ")[2])
    return dirs


def target_dir(target: str, sanitize: list[str], scalar: bool) -> str:
    """build/<this>/<key>: the target, its sanitizers, and -scalar for KERNELS=scalar."""
    return target + "".join(f"-{s}" for s in sanitize) + ("-scalar" if scalar else "")
