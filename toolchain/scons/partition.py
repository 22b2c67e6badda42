"""`scons PARTITION=model`: a firmware target's application image and its model partition's images
(what they are: toolchain/partition.py), in build/<target>/<key>/.

`env.ColibriPartition(target, name, key, gen, out)`: the runtime and the application as for
env.ColibriFirmware, with firmware_examples/common/partition.c in place of the generated model.c and
no model_blob.o, linked into the region below the partition; the blob copied and converted to Intel
HEX at the partition's address (and at the QEMU map's).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..firmware import FW_DIR, FirmwareError, _link_action, firmware_spec, link_config, render_linker_script
from ..partition import app_firmware, app_link_config, image_config, make_model_images, partition_spec
from ..targets import Target, TargetError
from .compiledb import Objects
from .files import copy, write_text
from .firmware import _compile, _envs, _objects
from .safe import file_node

SOURCE = "common/partition.c"
NOT_LINKED = ("model.o", "model_blob.o")  # the generated model.c and the .incbin'd blob: in the partition


def _link_app(fenv, fw, p, name: str, variant, stem: str, objs: list, manifest: list, out: Path) -> list:
    """One application image: firmware's link step with the partition's bounds and no weights."""
    from SCons.Script import Action, Value  # type: ignore[import-not-found]

    ld = write_text(fenv, out / f"{stem}.ld", render_linker_script(fw, variant))
    exts = (".elf", ".map") + ((".bin", ".hex", ".size.json") if variant.name == "part" else ())
    cfg = json.dumps(app_link_config(link_config(fw, name, variant), p, variant), sort_keys=True)
    lenv = fenv.Clone()
    lenv["COLIBRI_FW"] = cfg  # read by the action as it is (never substituted); the Value is its signature
    return lenv.Command([file_node(fenv, out / f"{stem}{ext}") for ext in exts], objs + ld + manifest + [Value(cfg)],
                        Action(_link_action, "LINK   $TARGET"))


def _images_action(target, source, env):  # SCons action signature
    cfg = json.loads(env["COLIBRI_PARTITION"])
    outs = [Path(str(t)) for t in target]
    try:
        make_model_images(cfg, Path(str(source[0])), outs)
    except (FirmwareError, OSError) as e:
        for o in outs:
            o.unlink(missing_ok=True)
        print(f"colibri: {cfg['target']}: model {cfg['model']} {e}", file=sys.stderr)
        return 1
    return 0


def partition_outputs(env, t: Target, name: str, key: str, gen: dict, out: Path, generic: bool = False) -> list:
    """<key>-app.* and <key>-model.* of one model for one firmware target; generic: the runtime compiled
    without the model's dimensions (GENERIC=1, in <key>-generic/), which runs any blob whose arena fits
    the one reserved (the build's model's)."""
    from SCons.Script import Action, Exit, Value  # type: ignore[import-not-found]

    try:
        fw = firmware_spec(t)
        p = partition_spec(fw)
    except TargetError as e:
        print(f"colibri: {e}", file=sys.stderr)
        Exit(2)
        raise
    app_fw = app_firmware(fw, p)
    fenv, runtime_env = _envs(env, t, gen)
    if generic:
        runtime_env = fenv.Clone(CPPDEFINES=["COLIBRI_BUILDING"])
    objs = Objects(out / "obj")
    model, part_app, qemu_app = _objects(fenv, runtime_env, fw, gen, objs)
    runtime = [o for o in model if o.name not in NOT_LINKED]
    runtime.append(_compile(runtime_env, objs, Path(SOURCE).stem, file_node(fenv, FW_DIR / SOURCE)))
    manifest = copy(fenv, out / "manifest.json", gen["manifest.json"])
    app = _link_app(fenv, app_fw, p, name, app_fw.part, f"{key}-app", runtime + part_app, manifest, out)
    outputs = app + manifest + [objs.database(fenv, out / "compile_commands.json")]
    if fw.qemu is not None or qemu_app != part_app:
        qemu = _link_app(fenv, app_fw, p, name, app_fw.qemu_variant, f"{key}-app-qemu", runtime + qemu_app,
                         manifest, out)
        fenv.Depends(qemu, app[0])
        outputs += qemu
    cfg = json.dumps(image_config(fw, p, name), sort_keys=True)
    images = [f"{key}-model.bin", f"{key}-model.hex"] + ([f"{key}-model-qemu.hex"] if fw.qemu is not None else [])
    ienv = fenv.Clone()
    ienv["COLIBRI_PARTITION"] = cfg
    outputs += ienv.Command([file_node(fenv, out / f) for f in images], [gen["model.bin"], Value(cfg)],
                            Action(_images_action, "IMAGE  $TARGET"))
    return outputs


def generate(env) -> None:
    env.AddMethod(partition_outputs, "ColibriPartition")


def exists(env) -> bool:  # noqa: ARG001
    return True
