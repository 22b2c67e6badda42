"""The codegen builder: one checkpoint, one set of export options -> build/gen/<key>/<quant>[-layout]/.

Its sources are exactly the files the export reads (codegen/inputs.py), the exporter's own code and
the options (a Value node); the checkpoint directory is config.json's, the output directory the
targets', so no path travels through a construction variable or a command string.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .safe import escape, file_node, shown

OUTPUTS = ("model.h", "model.c", "model_blob.S", "model.bin", "manifest.json")


def _export_action(target, source, env):  # noqa: ARG001 - SCons action signature
    from colibri.codegen.errors import ExportError
    from colibri.codegen.export import ExportOptions, export

    ckpt = Path(str(source[0])).parent  # config.json's directory
    opts = json.loads(source[-1].read())
    try:
        export(ckpt, Path(str(target[0])).parent, ExportOptions(**opts), report=print)
    except ExportError as e:
        print(f"colibri: error: {e}", file=sys.stderr)
        return 2
    return 0


def colibri_export(env, ckpt: Path, gen: Path, opts: dict) -> dict[str, object]:
    """The export's output nodes by file name."""
    from SCons.Script import Action, Value  # type: ignore[import-not-found]

    from colibri.codegen.inputs import export_inputs, exporter_sources
    from colibri.codegen.stream import has_int4, has_int16

    inputs = export_inputs(ckpt, opts.get("prune_experts"), opts.get("calib"))
    sources = [file_node(env, p) for p in inputs + exporter_sources()]
    outs = [file_node(env, gen / n) for n in OUTPUTS]
    message = escape(f"EXPORT {shown(ckpt.name)} ({opts['quant']}) -> {shown(gen)}")
    env.Command(outs, sources + [Value(json.dumps(opts, sort_keys=True))], Action(_export_action, message))
    return {**dict(zip(OUTPUTS, outs, strict=True)), "int4": has_int4(opts["quant"], opts.get("attn_quant")),
            "int16": has_int16(opts["quant"], opts.get("attn_quant"))}


def generate(env) -> None:
    env.AddMethod(colibri_export, "ColibriExport")


def exists(env) -> bool:  # noqa: ARG001
    return True
