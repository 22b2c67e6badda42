"""`scons MODEL=a,b`: several models in one firmware image (what it is: toolchain/multimodel.py).

`env.ColibriMulti(target, names, gens, out, arena)`: the generic runtime and the board code once, per model
its model.c, model_blob.S and run_model.c (obj/<name>/, each against its own model.h, -DCOLIBRI_MULTI_MODEL),
the generated models_main.c, linked as firmware.py links one model's image (its checks and audit).
"""

from __future__ import annotations

import sys
from pathlib import Path

from .. import multimodel
from ..firmware import FW_DIR, firmware_spec
from ..multimodel import arena_bytes, render_main
from ..targets import Target, TargetError
from .compiledb import Objects
from .files import copy
from .firmware import _assemble, _compile, _envs, _link, _objects
from .safe import escape_all, file_node, flag_path

RUN_SOURCE = "common/run_model.c"
NOT_LINKED = ("model.o", "model_blob.o", "main.o")  # one model's: each model has its own, main is generated


def _main_action(target, source, env):  # SCons action signature
    names = env["COLIBRI_MODELS"].split(",")  # C identifiers (codegen.emit.c_identifier)
    manifests = [Path(str(s)) for s in source if str(s).endswith(".manifest.json")]
    arenas = ({n: arena_bytes(m) for n, m in zip(names, manifests, strict=True)}
              if env["COLIBRI_ARENA"] == "shared" else None)
    Path(str(target[0])).write_text(render_main(names, arenas))
    return 0


def multi_outputs(env, t: Target, names: list[str], gens: list[dict], out: Path, arena: str) -> list:
    """<a>+<b>.elf (and the QEMU twin) of several models for one firmware target; names: their C names."""
    from SCons.Script import Action, Exit, Value  # type: ignore[import-not-found]

    try:
        fw = firmware_spec(t)
    except TargetError as e:
        print(f"colibri: {e}", file=sys.stderr)
        Exit(2)
        raise
    fenv, _ = _envs(env, t, gens[0])
    common_path = [p for p in fenv["CPPPATH"] if p != gens[0]["model.h"].dir]
    fenv.Replace(CPPPATH=common_path)
    # dimensions from each blob; the int4 and int16 kernels only if a blob has such matrices (runtime_c/src/kernels.h)
    kernels = [f"COLIBRI_{k.upper()}=0" for k in ("int4", "int16") if not any(g[k] for g in gens)]
    generic = fenv.Clone(CPPDEFINES=["COLIBRI_BUILDING", *kernels])
    objs = Objects(out / "obj")
    model, part_app, qemu_app = _objects(fenv, generic, fw, gens[0], objs)
    runtime = [o for o in model if o.name not in NOT_LINKED]
    part_app = [o for o in part_app if o.name not in NOT_LINKED]
    qemu_app = [o for o in qemu_app if o.name not in NOT_LINKED]
    defines = ("COLIBRI_MULTI_MODEL",) + (("COLIBRI_SHARED_ARENA",) if arena == "shared" else ())
    manifests = []
    for name, gen in zip(names, gens, strict=True):
        menv = generic.Clone(CPPPATH=[gen["model.h"].dir] + common_path)
        blob = _assemble(menv, objs, f"{name}/model_blob", gen["model_blob.S"],
                         escape_all(t.cflags) + ["-DCOLIBRI_MULTI_MODEL", "-Xassembler",
                                                 f"-I{flag_path(gen['model.h'].dir)}"])
        menv.Depends(blob, gen["model.bin"])
        runtime += [_compile(menv, objs, f"{name}/model", gen["model.c"], defines), blob,
                    _compile(menv, objs, f"{name}/run_model", file_node(menv, FW_DIR / RUN_SOURCE), defines)]
        manifests += copy(fenv, out / f"{name}.manifest.json", gen["manifest.json"])
    menv = fenv.Clone()
    menv["COLIBRI_MODELS"], menv["COLIBRI_ARENA"] = ",".join(names), arena
    # its sources: the manifests (the arenas), the names and arena mode, and the module that writes it
    main_c = menv.Command(file_node(fenv, out / "models_main.c"),
                          manifests + [file_node(fenv, Path(multimodel.__file__)), Value(f"{names} {arena}")],
                          Action(_main_action, "GEN    $TARGET"))
    runtime.append(_compile(fenv, objs, "models_main", main_c[0]))
    key = out.name  # <a>+<b>[-separate] (multimodel.image_name)
    part = _link(fenv, fw, key, fw.part, key, runtime + part_app, [], out)
    outputs = part + manifests + [objs.database(fenv, out / "compile_commands.json")]
    if fw.qemu is not None or qemu_app != part_app:
        qemu = _link(fenv, fw, key, fw.qemu_variant, f"{key}-qemu", runtime + qemu_app, [], out)
        fenv.Depends(qemu, part[0])
        outputs += qemu
    return outputs


def generate(env) -> None:
    env.AddMethod(multi_outputs, "ColibriMulti")


def exists(env) -> bool:  # noqa: ARG001
    return True
