"""The build graph behind SConstruct: export once, compile for many targets.

Generated sources go to build/gen/<model>/<quant>[-rows]/, everything a target
builds to build/<target>/<model>/ (build/<target>-<sanitizers>/<model>/ with
SANITIZE). SConstruct only calls build_all(); the rules live here.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from SCons.Script import (  # type: ignore[import-not-found]
    COMMAND_LINE_TARGETS,
    Action,
    CacheDir,
    Default,
    Environment,
    Exit,
    SConsignFile,
    Value,
)

from .size.command import post_link
from .targets import ROOT, Target, TargetError, all_targets, load_target

ABI_MAJOR = 1  # COLIBRI_ABI_VERSION in colibri.h
RUNTIME_SRC = ("colibri.c", "kernels.c", "kernels_q8.c", "cbmath.c")
DEMO_COMMON = "demo/demo_common.c"
DEFAULT_MODEL = "firmware_examples/models/adder"  # the trained demo model (firmware_examples/models/README.md)
EXPORT_INPUTS = ("config.json", "colibri.json", "model.safetensors.index.json")
QUIET = {"CCCOM": "CC", "SHCCCOM": "CC", "ASPPCOM": "AS", "SHASPPCOM": "AS", "LINKCOM": "LINK",
         "SHLINKCOM": "LINK", "ARCOM": "AR", "RANLIBCOM": "RANLIB"}
WARN = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"]
# Identical arithmetic on every target: no fused multiply-add contraction, no errno from sqrt.
FLOAT = ["-ffp-contract=off", "-fno-math-errno"]
COMMON_CFLAGS = WARN + FLOAT + ["-O2", "-g", "-fvisibility=hidden", "-ffunction-sections", "-fdata-sections"]


def top_relative(path: str | Path) -> str:
    """A path as command lines should spell it: relative to the top directory when inside it.

    SCons writes its own node paths that way; raw flag strings must follow, or the same build
    in another checkout has other command lines and CACHE=dir never hits."""
    rel = os.path.relpath(Path(path).absolute(), ROOT)
    return str(path) if rel.startswith("..") else rel


def _fail(message: str) -> None:
    print(f"colibri: {message}", file=sys.stderr)
    Exit(2)


def _targets(arg: str) -> list[Target]:
    try:
        if arg == "all":
            return [t for t in all_targets() if t.name != "host" and t.kind == "linux"] + [
                t for t in all_targets() if t.kind == "firmware"
            ]
        return [load_target(n.strip()) for n in arg.split(",") if n.strip()]
    except TargetError as e:
        _fail(str(e))
        raise


def _export_action(target, source, env):  # noqa: ARG001 - SCons action signature
    from colibri.codegen.errors import ExportError
    from colibri.codegen.export import ExportOptions, export

    opts = json.loads(env["COLIBRI_EXPORT_OPTS"])
    try:
        export(env["COLIBRI_CKPT"], env["COLIBRI_GEN"], ExportOptions(**opts), report=print)
    except ExportError as e:
        print(f"colibri: error: {e}", file=sys.stderr)
        return 2
    return 0


def _activations(arg: str) -> bool:
    if arg not in ("int8", "float"):
        _fail(f"ACTIVATIONS={arg}: expected int8 or float")
    return arg == "int8"


def gen_dir(quant: str, layout: str) -> str:
    """build/gen/<model>/<this>: the quantization, and the layout when it is not the Linux one."""
    return quant if layout == "tiled16" else f"{quant}-{layout}"


def _export(env, ckpt: Path, gen: Path, opts: dict):
    """The codegen Builder: the checkpoint files, the options and the exporter's own code are its sources
    (a newer exporter may write another format or plan)."""
    files = sorted(str(p) for p in ckpt.iterdir() if p.name in EXPORT_INPUTS or p.suffix == ".safetensors")
    codegen = sorted(str(p) for p in (ROOT / "codegen").rglob("*") if p.suffix in (".py", ".j2"))
    outs = [str(gen / n) for n in ("model.h", "model.c", "model_blob.S", "model.bin", "manifest.json")]
    env.Command(outs, files + codegen + [Value(json.dumps(opts, sort_keys=True))],
                Action(_export_action, f"EXPORT {ckpt.name} ({opts['quant']}) -> {gen}"),
                COLIBRI_CKPT=str(ckpt), COLIBRI_GEN=str(gen), COLIBRI_EXPORT_OPTS=json.dumps(opts))
    return {Path(o).name: o for o in outs}


def _target_env(base, t: Target, sanitize: list[str]):
    missing = t.missing()
    if missing:
        _fail(f"target {t.name}: {', '.join(missing)} not found; install it with: {t.install_hint()}")
    # .su (and with GCC .ci call graph) files beside the objects give `colibri size` its stack bound
    stack = ["-fstack-usage"] + (["-fcallgraph-info=su"] if t.cc_argv[0].endswith("gcc") else [])
    env = base.Clone(
        CC=t.cc, AR=t.tool("ar"), RANLIB=t.tool("ranlib"),
        CCFLAGS=COMMON_CFLAGS + stack + list(t.cflags), LINKFLAGS=list(t.linkflags),
        CPPPATH=[str(ROOT / "runtime_c/include")], COLIBRI_TARGET=t.name,
    )
    if sanitize:
        flag = f"-fsanitize={','.join(sanitize)}"
        env.Append(CCFLAGS=[flag, "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"], LINKFLAGS=[flag])
    return env


def _shared_lib(env, out: Path, lib: str, objs: list, soflags: list[str]) -> list:
    """lib<lib>.so with SONAME lib<lib>.so.<ABI major>, and that name as a link to it."""
    soname = f"lib{lib}.so.{ABI_MAJOR}"
    so = env.SharedLibrary(str(out / f"lib{lib}"), objs, SHLINKFLAGS=soflags + [f"-Wl,-soname,{soname}"])
    link = env.Command(str(out / soname), so, Action(_symlink_action, "LN     $TARGET"))
    return [so, link]


def _symlink_action(target, source, env):  # noqa: ARG001
    dst = Path(str(target[0]))
    dst.unlink(missing_ok=True)
    dst.symlink_to(Path(str(source[0])).name)
    return 0


def _pkgconfig_action(target, source, env):  # noqa: ARG001
    name = env["COLIBRI_MODEL"]
    Path(str(target[0])).write_text(
        "prefix=${pcfiledir}\nincludedir=${prefix}/include\nlibdir=${prefix}\n\n"
        f"Name: colibri_{name}\nDescription: colibri MoE runtime with the model {name} linked in\n"
        f"Version: 0.1.0\nCflags: -I${{includedir}}\nLibs: -L${{libdir}} -Wl,-rpath,${{libdir}} -lcolibri_{name}\n"
    )
    return 0


class _Objects:
    """Compiles sources to objects and records each command for compile_commands.json.

    SCons' own compilation_db tool rebuilds its output on every run; recording the
    commands here keeps a null build doing nothing."""

    def __init__(self, objdir: Path):
        self.objdir = objdir
        self.entries: list[dict] = []

    def __call__(self, env, stem: str, source: str, shared: bool = False, **overrides) -> list:
        builder = env.SharedObject if shared else env.Object
        nodes = builder(str(self.objdir / stem), source, **overrides)
        com = "$ASPPCOM" if source.endswith(".S") else ("$SHCCCOM" if shared else "$CCCOM")
        cmd = env.Override(overrides).subst(com, target=nodes, source=env.File(source))
        self.entries.append({"directory": str(ROOT), "file": source, "output": str(nodes[0]), "command": cmd})
        return nodes

    def database(self, env, path: Path):
        text = json.dumps(self.entries, indent=1, sort_keys=True) + "\n"
        return env.Command(str(path), Value(text), Action(_write_value_action, "GEN    $TARGET"))


def _copy_action(target, source, env):  # noqa: ARG001
    shutil.copyfile(str(source[0]), str(target[0]))
    return 0


COPY = Action(_copy_action, "COPY   $TARGET")


def _write_value_action(target, source, env):  # noqa: ARG001
    Path(str(target[0])).write_text(source[0].read())
    return 0


def _linux_outputs(env, t: Target, name: str, gen: dict, out: Path, static_exe: bool) -> list:
    objs = _Objects(out / "obj")
    inc = str(Path(gen["model.h"]).parent)
    spec_env = env.Clone(CPPDEFINES=["COLIBRI_BUILDING", "COLIBRI_SPECIALISED"], CPPPATH=env["CPPPATH"] + [inc])
    gen_env = env.Clone(CPPDEFINES=["COLIBRI_BUILDING"])
    src = ROOT / "runtime_c"
    spec_objs = [objs(spec_env, f"spec/{Path(s).stem}", str(src / "src" / s), shared=True) for s in RUNTIME_SRC]
    generic_objs = [objs(gen_env, f"generic/{Path(s).stem}", str(src / "src" / s), shared=True)
                    for s in RUNTIME_SRC]
    model_objs = [objs(spec_env, "model", gen["model.c"], shared=True),
                  objs(spec_env, "model_blob", gen["model_blob.S"], shared=True,
                       ASPPFLAGS=list(t.cflags) + [f"-Wa,-I{top_relative(inc)}"])]
    env.Depends(model_objs[1], gen["model.bin"])
    soflags = ["-shared", f"-Wl,--version-script={top_relative(src / 'colibri.map')}",
               "-Wl,-z,relro,-z,now", "-Wl,-z,noexecstack", "-Wl,--gc-sections"]
    lib_a = spec_env.StaticLibrary(str(out / f"libcolibri_{name}"), spec_objs + model_objs)
    lib_so = _shared_lib(spec_env, out, f"colibri_{name}", spec_objs + model_objs, soflags)
    generic_so = _shared_lib(gen_env, out, "colibri", generic_objs, soflags)
    headers = [env.Command(str(out / "include" / h), path, COPY)
               for h, path in (("colibri.h", str(src / "include/colibri.h")), ("model.h", gen["model.h"]))]
    pc = env.Command(str(out / f"colibri_{name}.pc"), Value(name), Action(_pkgconfig_action, "GEN    $TARGET"),
                     COLIBRI_MODEL=name)
    exe_flags = ["-static"] if static_exe else []
    demo_env = env.Clone(CPPPATH=env["CPPPATH"] + [inc], LINKFLAGS=env["LINKFLAGS"] + exe_flags + ["-Wl,--gc-sections"])
    common = objs(demo_env, "demo_common", str(src / DEMO_COMMON))
    demo = demo_env.Program(str(out / "colibri_demo"),
                            [objs(demo_env, "colibri_demo", str(src / "demo/colibri_demo.c")), common, lib_a],
                            LIBS=["m", "pthread"])
    run = demo_env.Program(str(out / "colibri_run"),
                           [objs(demo_env, "colibri_run", str(src / "demo/colibri_run.c")), common] + generic_objs,
                           LIBS=["m", "pthread"])
    # dlopen needs a dynamically linked program
    dl_env = env.Clone(LINKFLAGS=env["LINKFLAGS"] + ["-Wl,--gc-sections"])
    demo_dl = dl_env.Program(str(out / "colibri_demo_dl"),
                             [objs(dl_env, "colibri_demo_dl", str(src / "demo/colibri_demo_dl.c")), common],
                             LIBS=["dl", "pthread"])
    blob = env.Command(str(out / "model.bin"), gen["model.bin"], COPY)
    manifest = env.Command(str(out / "manifest.json"), gen["manifest.json"], COPY)
    compile_db = objs.database(env, out / "compile_commands.json")
    for linked in (lib_a, lib_so[0], demo):  # one flash/RAM line per artifact a user ships
        env.AddPostAction(linked, Action(post_link, None))
    return [lib_a, lib_so, generic_so, headers, pc, demo, demo_dl, run, blob, manifest, compile_db]


def build_all(arguments: dict) -> None:
    target_arg = arguments.get("TARGET", "host")
    model_arg = arguments.get("MODEL", "")
    from colibri.codegen.quantize import DEFAULT_QUANT, QUANTS

    quant = arguments.get("QUANT", DEFAULT_QUANT)
    if quant not in QUANTS:
        _fail(f"QUANT={quant}: expected one of {', '.join(QUANTS)}")
    sanitize = [s for s in arguments.get("SANITIZE", "").split(",") if s]
    kernels = arguments.get("KERNELS", "simd")  # scalar: -DCOLIBRI_SCALAR, out to build/<target>-scalar/
    if kernels not in ("simd", "scalar"):
        _fail(f"KERNELS={kernels}: expected simd or scalar")
    ckpt = Path(model_arg).absolute() if model_arg else ROOT / DEFAULT_MODEL
    if model_arg and not (ckpt / "config.json").is_file():
        _fail(f"{model_arg}: not a checkpoint directory (no config.json)")
    from colibri.codegen.emit import c_identifier

    name = c_identifier(ckpt.name)
    try:
        opts = {
            "quant": quant,
            "max_seq": int(arguments.get("MAX_SEQ", 0)),
            "group_size": int(arguments.get("GROUP_SIZE", 0)),
            "outlier_frac": float(arguments["OUTLIER_FRAC"]) if "OUTLIER_FRAC" in arguments else None,
            "prefill_block": int(arguments.get("PREFILL_BLOCK", 0)),
            "int8_activations": _activations(arguments.get("ACTIVATIONS", "int8")),
        }
    except ValueError as e:
        _fail(f"bad build option: {e}")
    build = Path(arguments.get("BUILD", str(ROOT / "build"))).absolute()
    if arguments.get("CACHE"):
        CacheDir(arguments["CACHE"])
    # the signature database lives with the outputs, so two build roots never share (or race on) one
    build.mkdir(parents=True, exist_ok=True)
    SConsignFile(str(build / ".sconsign"))
    base = Environment(ENV={"PATH": os.environ.get("PATH", "")}, tools=["default"])
    if arguments.get("VERBOSE", "0") in ("0", ""):  # VERBOSE=1 shows full command lines
        base.Replace(**{f"{com}STR": f"{verb:<6} $TARGET" for com, verb in QUIET.items()})
    gens: dict[str, dict] = {}  # one export per layout the targets' kernels want
    outputs = []
    for t in _targets(target_arg):
        if t.layout not in gens:
            gens[t.layout] = _export(base, ckpt, build / "gen" / name / gen_dir(quant, t.layout),
                                     {**opts, "layout": t.layout})
        gen = gens[t.layout]
        suffix = f"-{'-'.join(sanitize)}" if sanitize else ""
        suffix += "-scalar" if kernels == "scalar" else ""
        out = build / f"{t.name}{suffix}" / name
        env = _target_env(base, t, sanitize)
        if kernels == "scalar":
            env.Append(CCFLAGS=["-DCOLIBRI_SCALAR"])
        if t.kind == "firmware":
            if sanitize:
                _fail(f"target {t.name}: SANITIZE is for Linux targets, not firmware")
            from .firmware import firmware_outputs

            # no threads on a microcontroller, and the stack bound must be static: no parallel hook
            env.Append(CCFLAGS=["-DCOLIBRI_NO_PARALLEL"])
            outputs += firmware_outputs(env, t, name, gen, out)
            continue
        if t.kind != "linux":
            _fail(f"target {t.name}: kind {t.kind!r} is not built by this version")
        outputs += _linux_outputs(env, t, name, gen, out, static_exe=not sanitize)
    if not COMMAND_LINE_TARGETS:
        Default(outputs)
