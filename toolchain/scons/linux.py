"""A Linux target's outputs of one model, in build/<target>/<key>/: libraries, programs, headers, pkg-config.

`env.ColibriLinux(target, key, gen, out, static_exe)`: `key` names the model's outputs in this build
directory (libcolibri_<key>.a/.so, colibri_<key>.pc; toolchain/scons/layout.py), `gen` the export's nodes
by file name. What does not depend on the model (the generic runtime's objects, the programs' own
objects) is compiled once per target directory, in build/<target>/.shared/obj/ (a model's key never starts
with a dot), and copied into each model's obj/ with the stack files beside it: every model of the target
in one build directory shares those compiles, and each output directory holds what it always held.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..csources import RUNTIME_DIR, RUNTIME_SRC, SPECIALISED_DEFINES, TEXT_SRC, abi_major, package_version
from ..size.command import post_link
from ..targets import Target
from .files import copy
from .safe import escape_all, file_node, flag_path

DEMO_COMMON = "demo/demo_common.c"
SOFLAGS = ["-Wl,-z,relro,-z,now", "-Wl,-z,noexecstack", "-Wl,--gc-sections"]
EXE_LINKFLAGS = ["-Wl,--gc-sections"]  # every program; the statically linked ones add STATIC_EXE
STATIC_EXE = ["-static"]
DEMO_LIBS = ["m", "pthread"]
SHARED_DIR = ".shared"  # build/<target>/<this>/obj: the target's model-independent objects
STACK_SUFFIXES = (".su", ".ci")  # what -fstack-usage (and GCC's -fcallgraph-info) leave beside an object


def _symlink_action(target, source, env):  # noqa: ARG001 - SCons action signature
    dst = Path(str(target[0]))
    dst.unlink(missing_ok=True)
    dst.symlink_to(Path(str(source[0])).name)
    return 0


def _copy_object_action(target, source, env):  # noqa: ARG001
    """The object and the stack files beside it (`colibri size` reads them from the model's obj/)."""
    src, dst = Path(str(source[0])), Path(str(target[0]))
    shutil.copyfile(src, dst)
    for suffix in STACK_SUFFIXES:
        if src.with_suffix(suffix).is_file():
            shutil.copyfile(src.with_suffix(suffix), dst.with_suffix(suffix))
        else:
            dst.with_suffix(suffix).unlink(missing_ok=True)
    return 0


class SharedObjects:
    """Objects that do not depend on the model: compiled once in the target's shared directory,
    recorded in the model's compile database, copied to the model's obj/ under the name they had there."""

    def __init__(self, env, objs, out: Path):
        self.objs = objs
        self.compiled = env.ColibriObjects(out.parent / SHARED_DIR / "obj")

    def __call__(self, env, stem: str, source, shared: bool = False) -> list:
        from SCons.Script import Action  # type: ignore[import-not-found]

        nodes = self.compiled(env, stem, source, shared=shared)
        self.objs.entries += self.compiled.entries
        self.compiled.entries.clear()
        dst = file_node(env, self.objs.objdir / f"{stem}{Path(str(nodes[0])).suffix}")
        copied = env.Command(dst, nodes, Action(_copy_object_action, "COPY   $TARGET"))
        if shared:  # what SharedObject() marks: a shared library takes only position-independent objects
            copied[0].attributes.shared = 1
        return copied


def _pkgconfig_action(target, source, env):  # noqa: ARG001
    name = source[0].read()
    Path(str(target[0])).write_text(
        "prefix=${pcfiledir}\nincludedir=${prefix}/include\nlibdir=${prefix}\n\n"
        f"Name: colibri_{name}\nDescription: colibri MoE runtime with the model {name} linked in\n"
        f"Version: {package_version()}\nCflags: -I${{includedir}}\n"
        f"Libs: -L${{libdir}} -Wl,-rpath,${{libdir}} -lcolibri_{name}\n"
    )
    return 0


def _shared_lib(env, out: Path, lib: str, objs: list, soflags: list[str]) -> list:
    """lib<lib>.so with SONAME lib<lib>.so.<ABI major>, and that name as a link to it."""
    from SCons.Script import Action  # type: ignore[import-not-found]

    soname = f"lib{lib}.so.{abi_major()}"
    so = env.SharedLibrary(file_node(env, out / f"lib{lib}.so"), objs,
                           SHLINKFLAGS=soflags + [f"-Wl,-soname,{soname}"])
    link = env.Command(file_node(env, out / soname), so, Action(_symlink_action, "LN     $TARGET"))
    return [so, link]


def _libraries(env, t: Target, name: str, gen: dict, out: Path, objs, common) -> tuple[list, list, list, list]:
    """The model's static and shared library and the generic shared runtime; their objects."""
    inc = gen["model.h"].dir
    spec_env = env.Clone(CPPDEFINES=list(SPECIALISED_DEFINES), CPPPATH=env["CPPPATH"] + [inc])
    gen_env = env.Clone(CPPDEFINES=["COLIBRI_BUILDING"])
    src = RUNTIME_DIR / "src"
    spec_objs = [objs(spec_env, f"spec/{Path(s).stem}", src / s, shared=True) for s in RUNTIME_SRC]
    generic_objs = [common(gen_env, f"generic/{Path(s).stem}", src / s, shared=True) for s in RUNTIME_SRC]
    text_spec = [objs(spec_env, f"spec/{Path(s).stem}", src / s, shared=True) for s in TEXT_SRC]
    text_generic = [common(gen_env, f"generic/{Path(s).stem}", src / s, shared=True) for s in TEXT_SRC]
    model_objs = [objs(spec_env, "model", gen["model.c"], shared=True),
                  objs(spec_env, "model_blob", gen["model_blob.S"], shared=True,
                       ASPPFLAGS=escape_all(t.cflags) + ["-Xassembler", f"-I{flag_path(inc)}"])]
    env.Depends(model_objs[1], gen["model.bin"])
    # -Xlinker, -Xassembler: one argument each, where -Wl,/-Wa, would split a path at its commas
    soflags = ["-shared", "-Xlinker", f"--version-script={flag_path(file_node(env, RUNTIME_DIR / 'colibri.map'))}",
               *SOFLAGS]
    # the text runtime is in the archive too: colibri_demo's text prompts; a program that calls none of it
    # links none of it (an archive member is linked only when referenced)
    lib_a = spec_env.StaticLibrary(file_node(env, out / f"libcolibri_{name}.a"), spec_objs + text_spec + model_objs)
    lib_so = _shared_lib(spec_env, out, f"colibri_{name}", spec_objs + text_spec + model_objs, soflags)
    generic_so = _shared_lib(gen_env, out, "colibri", generic_objs + text_generic, soflags)
    return lib_a, lib_so, generic_so, generic_objs


def _programs(env, gen: dict, out: Path, objs, common, lib_a, generic_objs, static_exe: bool) -> list:
    """colibri_demo (the model linked in), colibri_run (any blob), colibri_demo_dl (dlopen); only
    colibri_demo.c includes model.h, the other programs' objects are the target's shared ones."""
    demo_src = RUNTIME_DIR / "demo"
    exe_flags = STATIC_EXE if static_exe else []
    demo_env = env.Clone(CPPPATH=env["CPPPATH"] + [gen["model.h"].dir],
                         LINKFLAGS=env["LINKFLAGS"] + exe_flags + EXE_LINKFLAGS)
    demo_common = common(env, "demo_common", RUNTIME_DIR / DEMO_COMMON)
    demo = demo_env.Program(file_node(env, out / "colibri_demo"),
                            [objs(demo_env, "colibri_demo", demo_src / "colibri_demo.c"), demo_common, lib_a],
                            LIBS=DEMO_LIBS)
    run = demo_env.Program(file_node(env, out / "colibri_run"),
                           [common(env, "colibri_run", demo_src / "colibri_run.c"), demo_common] + generic_objs,
                           LIBS=DEMO_LIBS)
    dl_env = env.Clone(LINKFLAGS=env["LINKFLAGS"] + ["-Wl,--gc-sections"])  # dlopen needs a dynamic program
    demo_dl = dl_env.Program(file_node(env, out / "colibri_demo_dl"),
                             [common(dl_env, "colibri_demo_dl", demo_src / "colibri_demo_dl.c"), demo_common],
                             LIBS=["dl", "pthread"])
    return [demo, run, demo_dl]


def linux_outputs(env, t: Target, name: str, gen: dict, out: Path, static_exe: bool) -> list:
    """Everything a Linux target builds of one model."""
    from SCons.Script import Action, Value  # type: ignore[import-not-found]

    objs = env.ColibriObjects(out / "obj")
    common = SharedObjects(env, objs, out)
    lib_a, lib_so, generic_so, generic_objs = _libraries(env, t, name, gen, out, objs, common)
    demo, run, demo_dl = _programs(env, gen, out, objs, common, lib_a, generic_objs, static_exe)
    headers = [copy(env, out / "include/colibri.h", file_node(env, RUNTIME_DIR / "include/colibri.h")),
               copy(env, out / "include/model.h", gen["model.h"]),
               copy(env, out / "include/colibri_sample.h", file_node(env, RUNTIME_DIR / "include/colibri_sample.h"))]
    pc = env.Command(file_node(env, out / f"colibri_{name}.pc"), Value(name),
                     Action(_pkgconfig_action, "GEN    $TARGET"))
    files = [copy(env, out / "model.bin", gen["model.bin"]), copy(env, out / "manifest.json", gen["manifest.json"])]
    for linked in (lib_a, lib_so[0], demo):  # one flash/RAM line per artifact a user ships
        env.AddPostAction(linked, Action(post_link, None))
    return [lib_a, lib_so, generic_so, headers, pc, demo, demo_dl, run, *files,
            objs.database(env, out / "compile_commands.json")]


def generate(env) -> None:
    env.AddMethod(linux_outputs, "ColibriLinux")


def exists(env) -> bool:  # noqa: ARG001
    return True

