"""A firmware target's images of one model, in build/<target>/<key>/ (what they are: toolchain/firmware.py).

`env.ColibriFirmware(target, name, key, gen, out)`: compiles the runtime, the model and the firmware
application (each C object with its .su and .ci, recorded in compile_commands.json), renders the
linker scripts and links the part's image and, when QEMU needs its own, the QEMU twin. With a table of
prompts (`PROMPTS=file.json`, toolchain/prompts.py) also <key>-prompts-qemu.elf: the same objects, with
common/prompts.c and the generated prompts.h in place of common/main.c.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..csources import OPT_CFLAGS, PREFIX_MAP, RUNTIME_DIR, RUNTIME_SRC, SPECIALISED_DEFINES
from ..firmware import (
    COMMON_SRC,
    FAMILIES,
    FW_DIR,
    PROMPTS_APP,
    Firmware,
    _link_action,
    firmware_spec,
    link_config,
    render_linker_script,
)
from ..targets import Target, TargetError
from .compiledb import Objects
from .files import copy, write_text
from .launcher import PREFIX as LAUNCHER_PREFIX
from .safe import dir_node, escape_all, file_node, flag_path

# One object plus its stack usage (.su) and call graph (.ci), built, cached and cleaned together.
C_COM = f"{LAUNCHER_PREFIX} $CC -o ${{TARGETS[0]}} -c $CFLAGS $CCFLAGS $_CCCOMCOM $SOURCES"


def _compile(env, objs: Objects, stem: str, src, defines: tuple[str, ...] = ()):
    from SCons.Scanner.C import CScanner  # type: ignore[import-not-found]
    from SCons.Script import Action  # type: ignore[import-not-found]

    e = env.Clone()
    e.Append(CPPDEFINES=list(defines))
    o = objs.objdir / stem
    nodes = e.Command([file_node(e, f"{o}{ext}") for ext in (".o", ".su", ".ci")], src,
                      Action(C_COM, "$CCCOMSTR"), source_scanner=CScanner())  # CCCOMSTR unset: the command
    objs.record(e, nodes, src, C_COM)
    return nodes[0]


def _assemble(env, objs: Objects, stem: str, src, asflags: list[str]):
    asflags = asflags + env["COLIBRI_AS_MAPS"]
    o = env.Object(file_node(env, objs.objdir / f"{stem}.o"), src, ASPPFLAGS=asflags)
    objs.record(env, o, src, "$ASPPCOM", ASPPFLAGS=asflags)
    return o[0]


def _envs(env, t: Target, gen: dict):
    """The application's environment (-Os, the firmware headers) and the runtime's (specialised)."""
    cflags = [OPT_CFLAGS["firmware"] if f == OPT_CFLAGS["linux"] else f for f in env["CCFLAGS"]]
    # the assembler's debug info (startup code under -g) is mapped as the C objects' is
    maps = ["$(", *(f for f in cflags if f.startswith(PREFIX_MAP)), "$)"]  # outside the signature, as in CCFLAGS
    fenv = env.Clone(CCFLAGS=cflags + ["-fstack-usage", "-fcallgraph-info=su"],
                     CPPPATH=env["CPPPATH"] + [gen["model.h"].dir, dir_node(env, FW_DIR / "common")],
                     ASPPFLAGS=escape_all(t.cflags), COLIBRI_AS_MAPS=maps)
    return fenv, fenv.Clone(CPPDEFINES=list(SPECIALISED_DEFINES))


def _objects(fenv, runtime_env, fw: Firmware, gen: dict, objs: Objects) -> tuple[list, list, list]:
    """Runtime and model objects; the application objects of the part's image; those of the QEMU image."""
    from ..csources import TEXT_SRC  # the text runtime too: an image whose main calls none of it links none of it

    t, fam = fw.target, FAMILIES[fw.family]
    runtime = [_compile(runtime_env, objs, Path(s).stem, file_node(fenv, RUNTIME_DIR / "src" / s))
               for s in RUNTIME_SRC + TEXT_SRC]
    blob = _assemble(fenv, objs, "model_blob", gen["model_blob.S"],
                     escape_all(t.cflags) + ["-Xassembler", f"-I{flag_path(gen['model.h'].dir)}"])
    fenv.Depends(blob, gen["model.bin"])
    model = runtime + [_compile(runtime_env, objs, "model", gen["model.c"]), blob]
    app = [_compile(fenv, objs, Path(s).stem, file_node(fenv, FW_DIR / s)) for s in COMMON_SRC]
    board = {}  # family sources: the QEMU image may need its own build of them
    for s in fam["sources"]:
        src = file_node(fenv, FW_DIR / s)
        # -g for an assembly source: a compile unit for the audit to attribute _start to
        board[s] = (_assemble(fenv, objs, Path(s).stem, src, escape_all(t.cflags) + ["-g"]) if s.endswith(".S")
                    else _compile(fenv, objs, Path(s).stem, src))
    qemu_board = dict(board)
    if fw.insn_per_tick is not None:  # Cortex-M under -icount: report SysTick ticks as instructions
        s = fam["sources"][0]
        qemu_board[s] = _compile(fenv, objs, f"{Path(s).stem}_qemu", file_node(fenv, FW_DIR / s),
                                 (f"COLIBRI_FW_INSN_PER_TICK_NUM={fw.insn_per_tick.numerator}u",
                                  f"COLIBRI_FW_INSN_PER_TICK_DEN={fw.insn_per_tick.denominator}u"))
    return model, app + list(board.values()), app + list(qemu_board.values())


def _link(fenv, fw: Firmware, name: str, variant, stem: str, objs: list, manifest: list, out: Path) -> list:
    """One image: its linker script, the link (checks and audit in toolchain/firmware.link_image)."""
    from SCons.Script import Action, Value  # type: ignore[import-not-found]

    ld = write_text(fenv, out / f"{stem}.ld", render_linker_script(fw, variant))
    exts = (".elf", ".map") + ((".bin", ".hex", ".size.json") if variant.name == "part" else ())
    cfg = json.dumps(link_config(fw, name, variant), sort_keys=True)
    lenv = fenv.Clone()
    lenv["COLIBRI_FW"] = cfg  # read by the action as it is (never substituted); the Value is its signature
    return lenv.Command([file_node(fenv, out / f"{stem}{ext}") for ext in exts], objs + ld + manifest + [Value(cfg)],
                        Action(_link_action, "LINK   $TARGET"))


def _prompts_image(fenv, fw: Firmware, name: str, key: str, objs: Objects, model: list, qemu_app: list,
                   manifest: list, out: Path, prompts_h: str) -> list:
    """<key>-prompts-qemu.elf: the QEMU image with the prompts application (prompts.h beside it)."""
    header = write_text(fenv, out / "prompts.h", prompts_h)
    penv = fenv.Clone()
    penv.Append(CPPPATH=[dir_node(fenv, out)])
    app = _compile(penv, objs, Path(PROMPTS_APP).stem, file_node(fenv, FW_DIR / PROMPTS_APP))
    penv.Depends(app, header)
    app_objs = [app] + qemu_app[1:]  # qemu_app: COMMON_SRC's objects first, common/main.c the first of them
    return header + _link(fenv, fw, name, fw.qemu_variant, f"{key}-prompts-qemu", model + app_objs, manifest, out)


def firmware_outputs(env, t: Target, name: str, key: str, gen: dict, out: Path, prompts_h: str | None = None) -> list:
    """The firmware images of one model for one target: <key>.elf (and <key>-qemu.elf), where name is the
    model's C-safe name and key its outputs' (layout.py); with prompts_h (toolchain/prompts.render_header)
    also <key>-prompts-qemu.elf."""
    from SCons.Script import Exit  # type: ignore[import-not-found]

    try:
        fw = firmware_spec(t)
    except TargetError as e:
        print(f"colibri: {e}", file=sys.stderr)
        Exit(2)
        raise
    fenv, runtime_env = _envs(env, t, gen)
    objs = Objects(out / "obj")
    model, part_app, qemu_app = _objects(fenv, runtime_env, fw, gen, objs)
    # beside the image, where `colibri size` looks for it; a source of the link, whose report uses it
    manifest = copy(fenv, out / "manifest.json", gen["manifest.json"])
    part = _link(fenv, fw, name, fw.part, key, model + part_app, manifest, out)
    outputs = part + manifest + [objs.database(fenv, out / "compile_commands.json")]
    if fw.qemu is not None or qemu_app != part_app:
        qemu = _link(fenv, fw, name, fw.qemu_variant, f"{key}-qemu", model + qemu_app, manifest, out)
        fenv.Depends(qemu, part[0])  # a part that does not fit stops the build before QEMU's twin
        outputs += qemu
    if prompts_h is not None:
        outputs += _prompts_image(fenv, fw, name, key, objs, model, qemu_app, manifest, out, prompts_h)
    return outputs


def generate(env) -> None:
    env.AddMethod(firmware_outputs, "ColibriFirmware")


def exists(env) -> bool:  # noqa: ARG001
    return True
