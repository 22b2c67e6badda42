"""`colibri project CKPT -o DIR --target T`: a folder that builds the model for T with CMake or Make alone.

The folder holds the export (model/), the runtime sources the build needs (runtime/, include/; see
sources.py), the example program (demo/ on Linux, firmware/ with its linker scripts on firmware
targets), CMakeLists.txt with colibri::<model>, cmake/toolchain.cmake, the find_package config, a
Makefile, library.json (PlatformIO), zephyr/ + Kconfig (a Zephyr module) and a README. Every flag comes
from where the SCons build takes it (csources.py, the target file, toolchain/scons/, toolchain/firmware.py);
every user string reaches a build file through escape.py. The content depends only on the inputs: no
path of this machine, no date, files in a fixed order.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jinja2

from colibri.codegen.export import ExportOptions, export

from ..csources import COMMON_CFLAGS, OPT_CFLAGS, RUNTIME_SRC, SPECIALISED_DEFINES, TEXT_SRC, abi_major, package_version
from ..firmware import LINK_FLAGS, LINK_LIBS, firmware_spec, render_linker_script
from ..scons.linux import DEMO_LIBS, EXE_LINKFLAGS, SOFLAGS, STATIC_EXE
from ..targets import Target
from . import escape, sources
from .output import MARKER, staged, write_marker

TEMPLATES = Path(__file__).resolve().parent / "templates"
EXPORT_FILES = ("model.h", "model.c", "model_blob.S", "model.bin")
PROCESSOR = {"x86_64": "x86_64", "aarch64": "aarch64", "arm": "arm", "riscv64": "riscv64", "riscv32": "riscv32"}


@dataclass
class ProjectResult:
    name: str
    out_dir: Path
    files: list[str]
    missing: list[str]  # programs of the target not installed here


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    env.filters.update(cq=escape.cmake_quoted, cmake_list=escape.cmake_list, mk_shell=escape.make_shell,
                       mk_words=escape.make_words, cq_comment=escape.text_line, mk_comment=escape.text_line,
                       md=escape.text_line)
    return env


def c_flags(t: Target) -> list[str]:
    """The C flags of every compile for this target, as the SCons build gives them (firmware: -Os)."""
    if t.kind == "firmware":
        return [OPT_CFLAGS["firmware"] if f == OPT_CFLAGS["linux"] else f for f in COMMON_CFLAGS]
    return list(COMMON_CFLAGS)


def _obj(src: str) -> dict:
    return {"src": src, "obj": str(Path(src).with_suffix(".o")), "asm": src.endswith(".S")}


def _images(t: Target, c_units: list[str], asm_units: list[str], name: str) -> tuple[list[dict], dict[str, str]]:
    """The firmware images (the part's, and QEMU's twin when SCons builds one) and their linker scripts."""
    fw = firmware_spec(t)
    units = c_units + asm_units
    images = [{"stem": name, "defines": [], "objects": [_obj(u) for u in units], "variant": fw.part}]
    if fw.qemu is not None or fw.insn_per_tick is not None:
        defines = [] if fw.insn_per_tick is None else [
            f"COLIBRI_FW_INSN_PER_TICK_NUM={fw.insn_per_tick.numerator}u",
            f"COLIBRI_FW_INSN_PER_TICK_DEN={fw.insn_per_tick.denominator}u"]
        objs = [{**_obj(u), "obj": f"qemu/{_obj(u)['obj']}"} for u in units]
        images.append({"stem": f"{name}-qemu", "defines": defines, "objects": objs, "variant": fw.qemu_variant})
    scripts = {f"firmware/{img['stem']}.ld": render_linker_script(fw, img["variant"]) for img in images}
    return images, scripts


def _context(t: Target, name: str, runtime_units: list[str], example_units: list[str]) -> dict:
    linux = t.kind == "linux"
    example_c = [u for u in example_units if u.endswith(".c")]
    example_asm = [u for u in example_units if u.endswith(".S")]
    version = package_version()
    ctx = {
        "name": name, "target": t.name, "description": t.description, "version": version,
        "version_cmake": ".".join(p for p in version.split(".")[:3] if p.isdigit()) or "0",
        "linux": linux, "abi": abi_major(), "cc": t.cc_argv,
        "c_flags": c_flags(t), "target_flags": list(t.cflags), "target_defines": t.cpp_defines(),
        "library_defines": list(SPECIALISED_DEFINES), "link_flags": list(t.linkflags),
        "runtime_units": runtime_units, "example_c": example_c, "example_asm": example_asm,
        "lib_objects": [_obj(u) for u in [*runtime_units, "model/model.c", "model/model_blob.S"]],
        "app_objects": [_obj(u) for u in example_c],
        "so_flags": SOFLAGS, "exe_flags": [*STATIC_EXE, *EXE_LINKFLAGS], "exe_libs": DEMO_LIBS,
        "interface_libs": DEMO_LIBS if linux else ["m"],
        "fw_link_first": LINK_FLAGS[0], "fw_link_rest": list(LINK_FLAGS[1:]), "fw_libs": list(LINK_LIBS),
        "example_what": "example program colibri_demo" if linux else "firmware images",
        "images": [], "packages": list(t.packages), "kind": t.kind,
        "cross": t.name != "host", "firmware": not linux, "system_name": "Linux" if linux else "Generic",
        "processor": PROCESSOR.get(t.arch, t.arch), "ar": t.tool("ar") if t.name != "host" else "",
        "emulator": (list(t.runner) + (["-L", t.sysroot] if t.sysroot else [])) if linux and t.runner else [],
        "family": t.family,
    }
    return ctx


def _write(d: Path, rel: str, data: bytes) -> None:
    p = d / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def generate(ckpt: str | Path, out: str | Path, t: Target, opts: ExportOptions,
             report=lambda line: None) -> ProjectResult:
    """Write the project folder of `ckpt` for `t` into `out` (missing, empty, or a previous project)."""
    out = Path(out)
    from .output import check_output

    check_output(out.absolute())  # before the export's minutes: refuse first
    missing = t.missing()
    with tempfile.TemporaryDirectory(prefix="colibri-project-") as tmp:
        res = export(ckpt, Path(tmp) / "gen", opts, report=report)
        name = res.name
        files: dict[str, bytes] = {f"model/{f}": (res.out_dir / f).read_bytes() for f in EXPORT_FILES}
    files.update({rel: src.read_bytes() for rel, src in sources.runtime_files().items()})
    example, example_units = sources.example_files(t)
    files.update({rel: src.read_bytes() for rel, src in example.items()})
    runtime_units = [f"runtime/{s}" for s in RUNTIME_SRC + TEXT_SRC]  # SCons's order: the same link, the same image
    ctx = _context(t, name, runtime_units, example_units)
    ctx["public_headers"] = sorted(rel for rel in files if rel.startswith("include/"))
    if t.kind == "firmware":
        c_units = [u for u in example_units if u.endswith(".c")]
        asm_units = [u for u in example_units if u.endswith(".S")]
        ctx["images"], scripts = _images(t, c_units, asm_units, name)
        files.update({k: v.encode() for k, v in scripts.items()})
    env = _env()
    rendered = {"CMakeLists.txt": "CMakeLists.txt.j2", "Makefile": "Makefile.j2",
                "cmake/toolchain.cmake": "toolchain.cmake.j2", f"cmake/colibri_{name}Config.cmake": "Config.cmake.j2",
                "zephyr/module.yml": "module.yml.j2", "zephyr/CMakeLists.txt": "zephyr.cmake.j2",
                "Kconfig": "Kconfig.j2"}
    for rel, tpl in rendered.items():
        files[rel] = env.get_template(tpl).render(**ctx).encode()
    files["library.json"] = (json.dumps(library_json(ctx), indent=2, sort_keys=True) + "\n").encode()
    ctx["files"] = sorted([*files, "README.md"])
    ctx["missing"] = missing
    files["README.md"] = env.get_template("README.md.j2").render(**ctx).encode()
    with staged(out) as d:
        for rel in sorted(files):
            _write(d, rel, files[rel])
        write_marker(d, list(files), {"model": name, "target": t.name, "version": ctx["version"]})
    return ProjectResult(name, out, sorted([*files, MARKER]), missing)


def pio_name(name: str) -> str:
    """The registry's slug form: a-z, digits, single dashes, at most 50 characters."""
    slug = "-".join(p for p in re.split(r"[^a-z0-9]+", f"colibri-{name}".lower()) if p)
    return slug[:50].rstrip("-")


def library_json(ctx: dict) -> dict:
    """The PlatformIO library manifest (library.json): the runtime and the model as one library."""
    flags = [*ctx["target_defines"], *(f"-D{d}" for d in ctx["library_defines"]), "-Iinclude", "-Imodel"]
    return {
        "name": pio_name(ctx["name"]),
        "version": ctx["version"],
        "description": f"The colibri MoE runtime with the model {ctx['name']} linked in "
                       f"(exported for {escape.text_line(ctx['target'])})",
        "keywords": ["colibri", "moe", "llm", "inference"],
        "license": "MIT",
        "frameworks": "*",
        "platforms": "*",
        "headers": [*(h.split("/", 1)[1] for h in ctx["public_headers"]), "model.h"],
        "build": {
            "srcDir": ".",
            "includeDir": "include",
            "srcFilter": ["-<*>", "+<runtime/*.c>", "+<model/model.c>", "+<model/model_blob.S>"],
            "flags": flags,
            "libArchive": True,
        },
        "export": {"include": ["include", "model", "runtime", "library.json", "README.md"]},
    }

