"""The build graph behind SConstruct: export once, compile for many targets.

build_all() reads the command line's options, takes the build directory's lock, names the model's
outputs (toolchain/scons/layout.py) and asks the SCons tools in toolchain/scons/ for each target's
part of the graph. Every path reaches SCons as a node and every other user string escaped
(toolchain/scons/safe.py); commands run without a shell.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from SCons.Script import (  # type: ignore[import-not-found]
    COMMAND_LINE_TARGETS,
    Default,
    Environment,
    Exit,
)

from .csources import COMMON_CFLAGS, GCC_DEBUG_CFLAGS, RUNTIME_DIR, prefix_map_flags
from .scons import compiledb, export, firmware, launcher, linux, multimodel, partition, safe
from .scons.layout import (
    OUTPUT_LINE,
    LayoutError,
    export_defaults,
    gen_dir,
    model_name,
    option_suffix,
    target_dir,
)
from .scons.lock import hold_build_lock
from .scons.safe import dir_node, escape, escape_all, shown
from .targets import ROOT, Target, TargetError, all_targets, load_target

DEFAULT_MODEL = "firmware_examples/models/adder"  # the trained demo model (firmware_examples/models/README.md)
# each adds a builder method (env.ColibriExport, ...)
TOOLS = (safe, launcher, compiledb, export, linux, firmware, partition, multimodel)
QUIET = {"CCCOM": "CC", "SHCCCOM": "CC", "ASPPCOM": "AS", "SHASPPCOM": "AS", "LINKCOM": "LINK",
         "SHLINKCOM": "LINK", "ARCOM": "AR", "RANLIBCOM": "RANLIB"}


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


def _activations(arg: str) -> bool:
    if arg not in ("int8", "float"):
        _fail(f"ACTIVATIONS={arg}: expected int8 or float")
    return arg == "int8"


def _attn_quant(arg: str | None, quant: str) -> str | None:
    """ATTN_QUANT, None when it is QUANT's (the same export, so the same build directory)."""
    from colibri.codegen.stream import parse_attn_quant

    if arg is not None:
        try:
            parse_attn_quant(arg)
        except ValueError as e:
            _fail(f"ATTN_QUANT: {e}")
    return None if arg == quant else arg


def _kv(arg: str) -> str:
    from colibri.codegen.format import KV_DTYPES

    if arg not in KV_DTYPES:
        _fail(f"KV={arg}: expected one of {', '.join(KV_DTYPES)}")
    return arg


def _partition(arg: str) -> str:
    from .partition import PARTITION_NAMES

    if arg and arg not in PARTITION_NAMES:
        _fail(f"PARTITION={arg}: expected {' or '.join(PARTITION_NAMES)}")
    return arg


def _generic(arg: str, part: str) -> bool:
    """GENERIC=1: the application's runtime reads the dimensions from the partition's blob (any model
    within the arena it reserved), not from model.h; only with PARTITION=model."""
    if arg not in ("0", "1"):
        _fail(f"GENERIC={arg}: expected 0 or 1")
    if arg == "1" and not part:
        _fail("GENERIC=1: only with PARTITION=model (a model linked in is the build's own)")
    return arg == "1"


def _prompts(arg: str) -> str | None:
    """PROMPTS=file.json: the C table of its prompts (toolchain/prompts.py), None without the option."""
    from .prompts import PromptsError, load, render_header

    if not arg:
        return None
    try:
        return render_header(load(Path(arg)))
    except PromptsError as e:
        _fail(str(e))
        raise


def _calib(arg: str) -> str | None:
    """CALIB=file: its absolute path (the export reads and checks its contents), None without the option."""
    from colibri.codegen.calibset import WHAT

    if not arg:
        return None
    path = Path(arg).absolute()
    if not path.is_file():
        _fail(f"CALIB={shown(path)}: no such file ({WHAT})")
    return str(path)


def _max_seq(arg: str) -> int | str:
    return "auto" if arg == "auto" else int(arg)


def _auto_max_seq(t: Target, ckpt: Path, o: dict) -> int:
    """MAX_SEQ=auto on a firmware target: the largest max_seq whose arena fits the RAM left in the
    arena's region after everything else placed there (printed)."""
    from colibri.codegen.checkpoint import open_checkpoint
    from colibri.codegen.errors import ExportError
    from colibri.codegen.export import MAX_SEQ_LIMIT
    from colibri.codegen.layout import uses_q8
    from colibri.codegen.plan import largest_max_seq, plan_arena
    from colibri.codegen.stream import matrix_quants

    from .firmware import CLASS_KEYS, arena_rooms, firmware_spec

    if t.kind != "firmware":
        _fail(f"MAX_SEQ=auto: target {t.name} is not a firmware target (give MAX_SEQ=<positions>)")
    try:
        spec = open_checkpoint(ckpt).spec
        rooms = arena_rooms(firmware_spec(t))
    except (ExportError, TargetError) as e:
        _fail(str(e))
        raise
    q8 = o["int8_activations"] and any(uses_q8(spec, qn, o["group_size"])
                                       for qn in matrix_quants(o["quant"], o["attn_quant"]))
    block = o["prefill_block"] or None
    n = largest_max_seq(spec, [(classes, room) for classes, room, _ in rooms], MAX_SEQ_LIMIT, block, q8,
                        o["max_prefill_block"], o["kv"])
    if not n:
        _fail(f"MAX_SEQ=auto: target {t.name}: not even one position's arena fits "
              + "; ".join(f"the {room:,} B left in {why} ({', '.join(c)})" for c, room, why in rooms))
    plan = plan_arena(spec, n, block, q8, o["max_prefill_block"], o["kv"])
    seen = set()
    for classes, room, why in rooms:  # each memory once (the part's map and QEMU's may name the same)
        if (classes, room) in seen:
            continue
        seen.add((classes, room))
        what = ("arena", plan.arena_bytes) if len(classes) == len(CLASS_KEYS) else (
            "+".join(classes), sum(plan.class_bytes(c) for c in classes))
        print(f"MAX_SEQ=auto for {t.name}: max_seq {n}, {what[0]} {what[1]:,} B of the {room:,} B left in {why} "
              f"(KV cache {o['kv']})")
    return n


def _options(arguments: dict) -> dict:
    """The export options of the command line (the exporter's defaults for those not given)."""
    d = export_defaults()
    try:
        return {
            "quant": arguments.get("QUANT", d["quant"]),
            "max_seq": _max_seq(arguments.get("MAX_SEQ", str(d["max_seq"]))),
            "group_size": int(arguments.get("GROUP_SIZE", d["group_size"])),
            # None: the quantization's own default (quantize.default_outlier_frac)
            "outlier_frac": float(arguments["OUTLIER_FRAC"]) if "OUTLIER_FRAC" in arguments else d["outlier_frac"],
            "attn_quant": _attn_quant(arguments.get("ATTN_QUANT", d["attn_quant"]),
                                      arguments.get("QUANT", d["quant"])),
            "prefill_block": int(arguments.get("PREFILL_BLOCK", d["prefill_block"])),
            "int8_activations": _activations(arguments.get("ACTIVATIONS", "int8")),
            "kv": _kv(arguments.get("KV", d["kv"])),
            # CALIB=file: a calibration set for the quantizer (--calib); its absolute path keys the build
            "calib": _calib(arguments.get("CALIB", "")) or d["calib"],
        }
    except ValueError as e:
        _fail(f"bad build option: {e}")
        raise


def _base_env(arguments: dict):
    env = Environment(ENV={"PATH": os.environ.get("PATH", "")}, tools=["default"])
    for tool in TOOLS:
        tool.generate(env)
    try:  # CC_LAUNCHER=ccache|distcc|..., DISTCC=1: every C compile runs through it (toolchain/scons/launcher.py)
        launcher.use(env, launcher.parse(arguments))
    except launcher.LauncherError as e:
        _fail(str(e))
        raise
    if arguments.get("CACHE"):
        # env.CacheDir() substitutes the path in a mode that no escaping survives (`$$(` loses its
        # parenthesis): set what it sets, then let SCons create the directory as CacheDir() would.
        env._CacheDir_path = str(Path(arguments["CACHE"]).absolute())
        env.get_CacheDir()
    if arguments.get("VERBOSE", "0") in ("0", ""):  # VERBOSE=1 shows full command lines
        env.Replace(**{f"{com}STR": f"{verb:<6} $TARGET" for com, verb in QUIET.items()})
    return env


def _target_env(base, t: Target, sanitize: list[str], scalar: bool):
    missing = t.missing()
    if missing:
        _fail(f"target {t.name}: {', '.join(missing)} not found; install it with: {t.install_hint()}")
    # .su (and with GCC .ci call graph) files beside the objects give `colibri size` its stack bound
    stack = ["-fstack-usage"] + (["-fcallgraph-info=su"] if t.cc_argv[0].endswith("gcc") else [])
    env = base.Clone(
        CC=escape(t.cc), AR=escape(t.tool("ar")), RANLIB=escape(t.tool("ranlib")),
        CCFLAGS=list(COMMON_CFLAGS) + stack + escape_all(t.cflags), LINKFLAGS=escape_all(t.linkflags),
        CPPPATH=[dir_node(base, RUNTIME_DIR / "include")], COLIBRI_TARGET=t.name,
    )
    if sanitize:
        flag = f"-fsanitize={','.join(sanitize)}"
        env.Append(CCFLAGS=[flag, "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"], LINKFLAGS=[flag])
    if scalar:
        env.Append(CCFLAGS=["-DCOLIBRI_SCALAR"])
    env.Append(CCFLAGS=t.cpp_defines())  # what the target declares: threads, largest prefill block
    return env


def _checkpoint(arguments: dict) -> Path:
    model_arg = arguments.get("MODEL", "")
    ckpt = Path(model_arg).absolute() if model_arg else ROOT / DEFAULT_MODEL
    if model_arg and not (ckpt / "config.json").is_file():
        _fail(f"{model_arg}: not a checkpoint directory (no config.json)")
    return ckpt


def _build_dir(arguments: dict) -> Path:
    """The build directory, locked for this run, with its signature database: two build roots never
    share one. (SCons.SConsign.File: SConsignFile() would substitute the path, twice.)"""
    import SCons.SConsign  # type: ignore[import-not-found]

    build = Path(arguments.get("BUILD", str(ROOT / "build"))).absolute()
    try:
        build.mkdir(parents=True, exist_ok=True)
        hold_build_lock(build)
    except OSError as e:
        _fail(f"{shown(build)}: cannot build there: {e.strerror or e}")
        raise
    SCons.SConsign.File(str(build / ".sconsign"))
    return build


def _checkpoints(arguments: dict) -> list[Path]:
    """MODEL=a,b: the checkpoints of an image of several models; one (the default) when MODEL names one
    directory (a comma in its name included)."""
    model_arg = arguments.get("MODEL", "")
    if "," not in model_arg or (Path(model_arg) / "config.json").is_file():
        return [_checkpoint(arguments)]
    return [_checkpoint({"MODEL": m}) for m in model_arg.split(",")]


def _build_multi(arguments: dict, ckpts: list[Path]) -> None:
    """The graph of `MODEL=a,b`: each model exported once per weight layout of the targets, then one image
    per firmware target with them all."""
    from colibri.codegen.emit import c_identifier

    from .multimodel import ARENA_MODES, MultiModelError, check_names, image_name

    arena = arguments.get("ARENA", "shared")
    if arena not in ARENA_MODES:
        _fail(f"ARENA={arena}: expected one of {', '.join(ARENA_MODES)}")
    for option in ("PARTITION", "SANITIZE", "PROMPTS"):
        if arguments.get(option):
            _fail(f"{option}: not with MODEL=a,b (several models in one image)")
    opts = _options(arguments)
    if opts["max_seq"] == "auto":
        _fail("MAX_SEQ=auto: one model at a time (give MAX_SEQ=<positions> with MODEL=a,b)")
    cnames = [c_identifier(c.name) for c in ckpts]
    try:
        check_names(cnames, [shown(c) for c in ckpts])
    except MultiModelError as e:
        _fail(str(e))
    targets = _targets(arguments.get("TARGET", "host"))
    build = _build_dir(arguments)
    try:
        keys = [model_name(build, c, n) + option_suffix(opts, export_defaults())
                for c, n in zip(ckpts, cnames, strict=True)]
    except LayoutError as e:
        _fail(str(e))
        raise
    base = _base_env(arguments)
    gens: dict[tuple, dict] = {}
    outputs = []
    kernels = arguments.get("KERNELS", "simd")
    for t in targets:
        if t.kind != "firmware":
            _fail(f"MODEL=a,b: target {t.name} is {t.kind}: several models in one image are built for firmware "
                  "targets")
        t_opts = {**opts, "layout": t.weight_layout, "max_prefill_block": t.max_prefill_block}
        for c, k in zip(ckpts, keys, strict=True):
            if (k, t.weight_layout, t.max_prefill_block) not in gens:
                gens[(k, t.weight_layout, t.max_prefill_block)] = base.ColibriExport(
                    c, build / "gen" / k / gen_dir(opts["quant"], t.weight_layout, t.max_prefill_block), t_opts)
        out = build / target_dir(t.name, [], kernels == "scalar") / image_name(keys, arena)
        env = _target_env(base, t, [], kernels == "scalar")
        env.Append(CCFLAGS=(list(GCC_DEBUG_CFLAGS) if t.cc_argv[0].endswith("gcc") else [])
                   + ["$(", *escape_all(prefix_map_flags(ROOT, build)), "$)"])
        outputs += env.ColibriMulti(t, cnames, [gens[(k, t.weight_layout, t.max_prefill_block)] for k in keys],
                                    out, arena)
        print(OUTPUT_LINE.format(target=t.name, ckpt=",".join(shown(c) for c in ckpts), out=shown(out)))
    if not COMMAND_LINE_TARGETS:
        Default(outputs)


def build_all(arguments: dict) -> None:
    sanitize = [s for s in arguments.get("SANITIZE", "").split(",") if s]
    kernels = arguments.get("KERNELS", "simd")  # scalar: -DCOLIBRI_SCALAR, out to build/<target>-scalar/
    if kernels not in ("simd", "scalar"):
        _fail(f"KERNELS={kernels}: expected simd or scalar")
    ckpts = _checkpoints(arguments)
    if len(ckpts) > 1:  # MODEL=a,b: one firmware image holding them (toolchain/multimodel.py)
        _build_multi(arguments, ckpts)
        return
    if arguments.get("ARENA"):
        _fail(f"ARENA={arguments['ARENA']}: only with MODEL=a,b (a single model has an arena of its own)")
    ckpt = _checkpoint(arguments)
    part = _partition(arguments.get("PARTITION", ""))
    generic = _generic(arguments.get("GENERIC", "0"), part)
    prompts_h = _prompts(arguments.get("PROMPTS", ""))
    if prompts_h is not None and part:
        _fail("PROMPTS: not with PARTITION (the prompts image links its model in)")
    opts = _options(arguments)
    targets = _targets(arguments.get("TARGET", "host"))
    for t in targets if prompts_h is not None else ():
        if t.kind != "firmware":
            _fail(f"PROMPTS: target {t.name} is not a firmware target (colibri_demo takes its prompt as arguments)")
    build = _build_dir(arguments)
    from colibri.codegen.emit import c_identifier

    try:
        name = model_name(build, ckpt, c_identifier(ckpt.name))
    except LayoutError as e:
        _fail(str(e))
        raise
    key = name + option_suffix(opts, export_defaults())
    base = _base_env(arguments)
    gens: dict[tuple, dict] = {}  # one export per weight layout, prefill limit (and auto max_seq) of the targets
    outputs = []
    for t in targets:
        if t.kind not in ("linux", "firmware"):
            _fail(f"target {t.name}: kind {t.kind!r} is not built by this version")
        if sanitize and t.kind == "firmware":
            _fail(f"target {t.name}: SANITIZE is for Linux targets, not firmware")
        t_opts = {**opts, "layout": t.weight_layout, "max_prefill_block": t.max_prefill_block}
        auto = opts["max_seq"] == "auto"
        if auto:
            t_opts["max_seq"] = _auto_max_seq(t, ckpt, t_opts)
        export_key = (t.weight_layout, t.max_prefill_block, t_opts["max_seq"])
        if export_key not in gens:
            gen = gen_dir(opts["quant"], *export_key[:2]) + (f"-seq{t_opts['max_seq']}" if auto else "")
            gens[export_key] = base.ColibriExport(ckpt, build / "gen" / key / gen, t_opts)
        out = build / target_dir(t.name, sanitize, kernels == "scalar") / key
        env = _target_env(base, t, sanitize, kernels == "scalar")
        # objects independent of who compiles them and where (csources.py); the maps' paths are outside the
        # build signature ($( $)): the same objects wherever the checkout is, so CACHE=dir serves another one
        env.Append(CCFLAGS=(list(GCC_DEBUG_CFLAGS) if t.cc_argv[0].endswith("gcc") else [])
                   + ["$(", *escape_all(prefix_map_flags(ROOT, build)), "$)"])
        if part and t.kind != "firmware":
            _fail(f"PARTITION={part}: target {t.name} is not a firmware target")
        if part:  # the application image and the model partition's (toolchain/partition.py)
            if generic:
                out = out.with_name(f"{key}-generic")
            outputs += env.ColibriPartition(t, name, out.name, gens[export_key], out, generic=generic)
        elif t.kind == "firmware":
            outputs += env.ColibriFirmware(t, name, key, gens[export_key], out, prompts_h)
        else:
            outputs += env.ColibriLinux(t, key, gens[export_key], out, static_exe=not sanitize)
        print(OUTPUT_LINE.format(target=t.name, ckpt=shown(ckpt), out=shown(out)))
    if not COMMAND_LINE_TARGETS:
        Default(outputs)
