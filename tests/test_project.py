"""`colibri project`: the folder builds with plain CMake and Make (no colibri, no Python on PATH), the
programs give the SCons build's tokens and the numpy reference's, find_package works from another project,
and the folder is reproducible, holds no path of this machine, and refuses bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.export import ExportOptions
from colibri.codegen.reference import Reference
from colibri.toolchain import csources
from colibri.toolchain.cli import runner_argv
from colibri.toolchain.project import escape
from colibri.toolchain.project.generate import generate
from colibri.toolchain.project.output import MARKER
from colibri.toolchain.targets import load_target

from blobread import weights as blob_weights
from conftest import BIN, ROOT, require_target, synth

TARGETS = ["host", "rpi4", "riscv64", "stm32h7", "cortex-m55"]
# The Makefile and the find_package consumer on one target of each path through the templates: native Linux
# (no toolchain tools), cross Linux (the target's ar, a static demo under QEMU), firmware (linker script,
# startup, QEMU boot). riscv64 and cortex-m55 fill the same template lines with other values (cc, flags,
# memory regions) that the CMake build of each, which takes them from the same variables, already runs.
EVERY_BUILD = {"host", "rpi4", "stm32h7"}
SMALL = dict(layers=1, hidden=32, ffn=32, heads=4, kv_heads=2, experts=2, top_k=1, vocab=64, seed=21)
MODEL = "proj_tiny"
CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"  # no venv: neither colibri nor its Python


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return synth(tmp_path_factory.mktemp("proj") / MODEL, **SMALL)


def clean_env(home: Path) -> dict[str, str]:
    env = {"PATH": CLEAN_PATH, "HOME": str(home), "LANG": "C"}
    assert shutil.which("colibri", path=CLEAN_PATH) is None
    return env


def project(ckpt: Path, out: Path, target: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "colibri"), "project", str(ckpt), "-o", str(out), "--target", target,
                           "--no-predict", *extra], capture_output=True, text=True)


def run(argv: list[str], cwd: Path | None = None, env: dict | None = None, timeout: float = 300):
    res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{' '.join(map(str, argv))} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def cmake_build(src: Path, build: Path, env: dict, toolchain: Path, *defs: str) -> None:
    run(["cmake", "-S", str(src), "-B", str(build), f"-DCMAKE_TOOLCHAIN_FILE={toolchain}", *defs], env=env)
    run(["cmake", "--build", str(build), "-j2"], env=env)


def tokens_of(target: str, program: Path) -> list[int]:
    res = run(runner_argv(target, str(program)))
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("tokens: "))
    return [int(t) for t in line.removeprefix("tokens: ").split(",") if t]


def reference_tokens(ckpt: Path, folder: Path) -> list[int]:
    """The numpy reference on exactly the weights in the folder's blob, with the prompt model.h bakes in."""
    h = dict(re.findall(r"^#define (COLIBRI_\w+) (.*?)\s*(?:/\*.*)?$", (folder / "model/model.h").read_text(), re.M))
    prompt = [int(t) for t in h["COLIBRI_DEFAULT_PROMPT"].strip("{} ").split(",")]
    c = open_checkpoint(ckpt)
    ref = Reference(c.spec, blob_weights(folder / "model/model.bin"), max_seq=int(h["COLIBRI_MAX_SEQ"]))
    return ref.generate(prompt, int(h["COLIBRI_DEFAULT_GENERATE"]))


def scons_program(build_model, ckpt: Path, target: str) -> Path:
    out = build_model(ckpt, "int8c", target)
    return out / ("colibri_demo" if load_target(target).kind == "linux" else f"{MODEL}.elf")


def size_regions(elf: Path, target: str) -> dict[str, int]:
    res = run([str(BIN / "colibri"), "size", str(elf), "--target", target, "--json", "--no-stack"])
    return {k: v["bytes"] for k, v in json.loads(res.stdout)["regions"].items()}


CONSUMER = """cmake_minimum_required(VERSION 3.16)
project(consumer C)
find_package(colibri_{name} REQUIRED)
add_executable(app demo/colibri_demo.c demo/demo_common.c)
target_link_libraries(app PRIVATE colibri::{name})
"""


FW_CONSUMER = """cmake_minimum_required(VERSION 3.16)
project(consumer C ASM)
find_package(colibri_{name} REQUIRED)
set(fw ${{colibri_{name}_DIR}}/../../../share/colibri_{name}/firmware)
add_executable(app {sources})
target_include_directories(app PRIVATE ${{fw}}/common)
target_link_options(app PRIVATE -nostartfiles -T ${{fw}}/{name}-qemu.ld)
target_link_libraries(app PRIVATE colibri::{name})
"""


@pytest.mark.parametrize("target", TARGETS)
def test_project_builds_and_runs_like_scons(target, ckpt, build_model, tmp_path):
    require_target(target)
    folder = tmp_path / "proj"
    res = project(ckpt, folder, target)
    assert res.returncode == 0, res.stderr
    env = clean_env(tmp_path)
    t = load_target(target)
    want = reference_tokens(ckpt, folder)
    scons_tokens = tokens_of(target, scons_program(build_model, ckpt, target))
    assert scons_tokens == want, f"{target}: the SCons build differs from the reference"

    build = tmp_path / "b"
    cmake_build(folder, build, env, folder / "cmake/toolchain.cmake")
    program = build / ("colibri_demo" if t.kind == "linux" else f"{MODEL}.elf")
    assert tokens_of(target, program) == want, f"{target}: the CMake build differs from the reference"
    if t.kind == "firmware":
        # the same objects and the same linker script as SCons: the same flash and RAM, region by region
        scons_regions = size_regions(scons_program(build_model, ckpt, target), target)
        assert size_regions(program, target) == scons_regions
    if target not in EVERY_BUILD:
        return

    mk = tmp_path / "mk"
    shutil.copytree(folder, mk)
    run(["make", "-j2"], cwd=mk, env=env)
    made = mk / "build" / ("colibri_demo" if t.kind == "linux" else f"{MODEL}.elf")
    assert tokens_of(target, made) == want, f"{target}: the Makefile build differs from the reference"

    if t.kind == "firmware":
        assert size_regions(made, target) == scons_regions
    prefix = tmp_path / "prefix"
    run(["cmake", "--install", str(build), "--prefix", str(prefix)], env=env)
    consumer = tmp_path / "consumer"
    if t.kind == "linux":
        (consumer / "demo").mkdir(parents=True)
        for f in ("colibri_demo.c", "demo_common.c", "demo_common.h"):
            shutil.copy(folder / "demo" / f, consumer / "demo" / f)
        (consumer / "CMakeLists.txt").write_text(CONSUMER.format(name=MODEL))
    else:  # the firmware application the folder installs, linked at QEMU's addresses against colibri::<model>
        consumer.mkdir()
        (consumer / "CMakeLists.txt").write_text(FW_CONSUMER.format(name=MODEL, sources=" ".join(
            f"${{fw}}/{u.removeprefix('firmware/')}" for u in json.loads((folder / MARKER).read_text())["files"]
            if u.startswith("firmware/") and u.endswith((".c", ".S")))))
    cmake_build(consumer, tmp_path / "cb", env, folder / "cmake/toolchain.cmake", f"-DCMAKE_PREFIX_PATH={prefix}")
    assert tokens_of(target, tmp_path / "cb" / "app") == want


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_folder_is_reproducible_and_has_no_machine_path(ckpt, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        res = project(ckpt, d, "stm32h7")
        assert res.returncode == 0, res.stderr
    ta, tb = _tree(a), _tree(b)
    assert ta == tb
    for rel, data in ta.items():
        for path in {str(ROOT), str(tmp_path), str(ckpt), os.path.expanduser("~"), "/work/", "/tmp/"}:
            assert path.encode() not in data, f"{rel} holds {path}"
    names = set(ta)
    assert {"CMakeLists.txt", "Makefile", "README.md", "cmake/toolchain.cmake", f"cmake/colibri_{MODEL}Config.cmake",
            "library.json", "zephyr/module.yml", "zephyr/CMakeLists.txt", "Kconfig", f"firmware/{MODEL}.ld",
            "firmware/cortex-m/startup.c", MARKER} <= names
    # only what the model and this target need: no demo of the Linux targets, no RISC-V startup, no tests
    assert not any(n.startswith(("demo/", "firmware/riscv/", "test/")) for n in names)
    assert {n for n in names if n.startswith("runtime/") and n.endswith(".c")} == {
        f"runtime/{s}" for s in csources.RUNTIME_SRC + csources.TEXT_SRC}  # the text runtime: text prompts


def _cmake_set(text: str, var: str) -> list[str]:
    m = re.search(rf"^set\({var} (.*)\)$", text, re.M)
    assert m, var
    return re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1))


def test_flags_are_the_scons_builds(ckpt, tmp_path):
    """The flags come from csources.py and the target file: a drift of either shows here."""
    for target in ("rpi4", "stm32h7"):
        t = load_target(target)
        d = tmp_path / target
        assert project(ckpt, d, target).returncode == 0
        cm = (d / "CMakeLists.txt").read_text()
        opt = csources.OPT_CFLAGS[t.kind]
        want = [opt if f == csources.OPT_CFLAGS["linux"] else f for f in csources.COMMON_CFLAGS]
        assert _cmake_set(cm, "COLIBRI_C_FLAGS") == want
        assert _cmake_set(cm, "COLIBRI_TARGET_FLAGS") == list(t.cflags)
        assert _cmake_set(cm, "COLIBRI_TARGET_DEFINES") == t.cpp_defines()
        assert _cmake_set(cm, "COLIBRI_LIBRARY_DEFINES") == list(csources.SPECIALISED_DEFINES)
        mk = (d / "Makefile").read_text()
        assert re.search(r"^C_FLAGS = (.*)$", mk, re.M).group(1).split() == want
        assert re.search(r"^CC = (.*)$", mk, re.M).group(1) == t.cc


HOSTILE = ['a b', '$HOME', '${x}', '$(id)', '`id`', 'q"uote', "it's", 'back\\slash', '#hash', '@ONLY@', 'a\tb',
           '%s', '-DX="1 2"', '*?[', 'é']


def test_cmake_quoting_round_trips(tmp_path):
    out = tmp_path / "out.json"
    script = "".join(f"set(v{i} {escape.cmake_quoted(s)})\nstring(APPEND j \"${{v{i}}}\\n\")\n"
                     for i, s in enumerate([*HOSTILE, "line\nbreak"]))
    (tmp_path / "s.cmake").write_text(script + f'file(WRITE {escape.cmake_quoted(str(out))} "${{j}}")\n')
    run(["cmake", "-P", str(tmp_path / "s.cmake")])
    assert out.read_text() == "".join(f"{s}\n" for s in [*HOSTILE, "line\nbreak"])
    with pytest.raises(ValueError):
        escape.cmake_list(["-Da;b"])


def test_make_quoting_round_trips(tmp_path):
    (tmp_path / "Makefile").write_text(f"WORDS = {escape.make_words(HOSTILE)}\nall:\n\t@printf '%s\\n' $(WORDS)\n")
    res = run(["make", "-s", "-C", str(tmp_path)])
    assert res.stdout.splitlines() == HOSTILE
    with pytest.raises(ValueError):
        escape.make_shell("a\nb")


def test_hostile_target_strings_reach_the_files_escaped(ckpt, tmp_path):
    t = dataclasses.replace(load_target("host"), description='evil"); message(FATAL_ERROR "x") #\n$(shell id)',
                            cflags=("-march=native", "-DQ=\"a b\"", "-D$(X)=1"))
    d = tmp_path / "p"
    generate(ckpt, d, t, ExportOptions(layout=t.weight_layout, predict=False))
    cm = (d / "CMakeLists.txt").read_text()
    assert _cmake_set(cm, "COLIBRI_TARGET_FLAGS") == ['-march=native', '-DQ=\\"a b\\"', '-D\\$(X)=1']
    env = clean_env(tmp_path)
    run(["cmake", "-S", str(d), "-B", str(tmp_path / "b"), f"-DCMAKE_TOOLCHAIN_FILE={d}/cmake/toolchain.cmake"],
        env=env)
    res = run(["make", "-n", "-C", str(d)], env=env)
    assert "'-D$(X)=1'" in res.stdout and "'-DQ=\"a b\"'" in res.stdout


# --- the PlatformIO and Zephyr files against their documented formats ---------------------------------
# PlatformIO, docs.platformio.org/en/latest/manifests/library-json: name (required, string, at most 50,
# a-z, digits and dashes, not starting or ending with one, no double dash, none of :;/,@<>), version
# (required, string, at most 20, semantic version), description (required, string, at most 255); keywords,
# frameworks, platforms, headers: string or array of strings; license: string; build: object with
# srcDir/includeDir (string), srcFilter and flags (string or array), libArchive (boolean); export: object
# with include/exclude (arrays of strings).
PIO_REQUIRED = {"name": (str, 50), "version": (str, 20), "description": (str, 255)}
PIO_STR_OR_LIST = ("keywords", "frameworks", "platforms", "headers")
PIO_BUILD = {"srcDir": str, "includeDir": str, "srcFilter": (str, list), "flags": (str, list), "libArchive": bool}
# Zephyr, scripts/zephyr_module.py METADATA_SCHEMA (pykwalify): a map; name: str; build: map with cmake
# (str: the folder holding CMakeLists.txt, from the module root), kconfig (str: a file from the module root),
# cmake-ext/kconfig-ext: bool, depends: seq of str. The module root is the folder holding zephyr/.
ZEPHYR_TOP = {"name": str, "build": dict}
ZEPHYR_BUILD = {"cmake": str, "kconfig": str, "cmake-ext": bool, "kconfig-ext": bool, "depends": list}


def check_library_json(m: dict) -> list[str]:
    problems = [f"{k}: missing" for k in PIO_REQUIRED if k not in m]
    for k, (typ, most) in PIO_REQUIRED.items():
        if k in m and (not isinstance(m[k], typ) or len(m[k]) > most):
            problems.append(f"{k}: not a string of at most {most}")
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", str(m.get("name", ""))):
        problems.append("name: not a slug")
    if not re.fullmatch(r"\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?", str(m.get("version", ""))):
        problems.append("version: not semantic")
    for k in PIO_STR_OR_LIST:
        v = m.get(k, "")
        if not (isinstance(v, str) or (isinstance(v, list) and all(isinstance(i, str) for i in v))):
            problems.append(f"{k}: not a string or list of strings")
    for k, typ in PIO_BUILD.items():
        if k in m.get("build", {}) and not isinstance(m["build"][k], typ):
            problems.append(f"build.{k}: wrong type")
    return problems


def check_module_yml(m, root: Path) -> list[str]:
    if not isinstance(m, dict):
        return ["not a map"]
    problems = [f"{k}: unknown" for k in m if k not in ZEPHYR_TOP]
    problems += [f"{k}: wrong type" for k, typ in ZEPHYR_TOP.items() if k in m and not isinstance(m[k], typ)]
    build = m.get("build", {})
    problems += [f"build.{k}: unknown" for k in build if k not in ZEPHYR_BUILD]
    problems += [f"build.{k}: wrong type" for k, typ in ZEPHYR_BUILD.items()
                 if k in build and not isinstance(build[k], typ)]
    if "cmake" not in build or not (root / build["cmake"] / "CMakeLists.txt").is_file():
        problems.append("build.cmake: no CMakeLists.txt there")
    if "kconfig" not in build or not (root / build["kconfig"]).is_file():
        problems.append("build.kconfig: no such file")
    return problems


def test_platformio_and_zephyr_files_follow_their_formats(ckpt, tmp_path):
    d = tmp_path / "p"
    assert project(ckpt, d, "stm32h7").returncode == 0
    lib = json.loads((d / "library.json").read_text())
    assert check_library_json(lib) == []
    for key in PIO_REQUIRED:  # the checker fails on a missing key
        assert check_library_json({k: v for k, v in lib.items() if k != key}) != []
    mod = yaml.safe_load((d / "zephyr/module.yml").read_text())
    assert check_module_yml(mod, d) == []
    assert check_module_yml({**mod, "build": {"kconfig": "Kconfig"}}, d) != []
    kconfig = (d / "Kconfig").read_text()
    assert re.search(rf"^config COLIBRI_{MODEL.upper()}\n\tbool ", kconfig, re.M)
    assert f"CONFIG_COLIBRI_{MODEL.upper()}" in (d / "zephyr/CMakeLists.txt").read_text()
    readme = (d / "README.md").read_text()
    assert "**Only validated**" in readme and "**were built**" in readme
    # the files the PlatformIO build would compile exist
    assert all((d / f).is_file() for f in lib["headers"] and ["include/colibri.h", "model/model.h"])


# --- bad input --------------------------------------------------------------------------------------------


def test_unknown_target_is_refused(ckpt, tmp_path):
    res = project(ckpt, tmp_path / "p", "no-such-board")
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1 and "no-such-board" in res.stderr
    assert not (tmp_path / "p").exists()


def test_output_rule(ckpt, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    res = project(ckpt, other, "host")
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1 and "refusing" in res.stderr
    assert [p.name for p in other.iterdir()] == ["keep.txt"] and (other / "keep.txt").read_text() == "mine"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert project(ckpt, empty, "host").returncode == 0
    assert project(ckpt, empty, "stm32h7").returncode == 0  # a previous project is replaced
    assert (empty / "firmware").is_dir() and not (empty / "demo").exists()
    (empty / "stray.c").write_text("")
    assert project(ckpt, empty, "host").returncode == 2  # a file the project did not write


def test_missing_compiler_still_writes_the_folder(ckpt, tmp_path):
    t = dataclasses.replace(load_target("rpi4"), cc="colibri-absent-linux-gnu-gcc", packages=("gcc-absent-pkg",))
    res = generate(ckpt, tmp_path / "p", t, ExportOptions(layout=t.weight_layout, predict=False))
    assert res.missing == ["colibri-absent-linux-gnu-gcc"]
    readme = (tmp_path / "p/README.md").read_text()
    assert "lacks colibri-absent-linux-gnu-gcc" in readme and "apt-get install gcc-absent-pkg" in readme
    assert (tmp_path / "p/CMakeLists.txt").is_file()


def test_the_issues_cmake_command_as_written(ckpt, tmp_path):
    """`cmake -S adder-stm32h7 -B b -DCMAKE_TOOLCHAIN_FILE=adder-stm32h7/cmake/toolchain.cmake` from the folder's
    parent: CMake alone looks for that relative path in b/ and in the folder (CMAKE_TOOLCHAIN_FILE's documented
    rule); the folder's CMakeLists.txt takes it from where cmake was started. With no toolchain file at
    all, the folder's own. The image boots to the reference's tokens."""
    require_target("stm32h7")
    folder = tmp_path / "adder-stm32h7"
    res = project(ckpt, folder, "stm32h7")
    assert res.returncode == 0, res.stderr
    env = clean_env(tmp_path)
    run(["cmake", "-S", "adder-stm32h7", "-B", "b", "-DCMAKE_TOOLCHAIN_FILE=adder-stm32h7/cmake/toolchain.cmake"],
        cwd=tmp_path, env=env)
    run(["cmake", "--build", "b", "-j2"], cwd=tmp_path, env=env)
    cache = (tmp_path / "b/CMakeCache.txt").read_text()
    assert f"CMAKE_TOOLCHAIN_FILE:FILEPATH={folder}/cmake/toolchain.cmake\n" in cache
    assert re.search(r"^CMAKE_C_COMPILER_AR:FILEPATH=.*arm-none-eabi-gcc-ar$", cache, re.M)  # the cross compiler
    assert tokens_of("stm32h7", tmp_path / "b" / f"{MODEL}.elf") == reference_tokens(ckpt, folder)
    run(["cmake", "-S", "adder-stm32h7", "-B", "b2"], cwd=tmp_path, env=env)  # configure only: the compiler
    cache = (tmp_path / "b2/CMakeCache.txt").read_text()
    assert f"CMAKE_TOOLCHAIN_FILE:FILEPATH={folder}/cmake/toolchain.cmake\n" in cache
    assert re.search(r"^CMAKE_C_COMPILER_AR:FILEPATH=.*arm-none-eabi-gcc-ar$", cache, re.M)  # the cross compiler


def test_add_subdirectory_keeps_the_consumers_toolchain(ckpt, tmp_path):
    """Inside a user's project the folder sets no toolchain: the consumer's (none here: its host compiler)."""
    require_target("host")
    folder = tmp_path / "colibri-host"
    res = project(ckpt, folder, "host")
    assert res.returncode == 0, res.stderr
    app = tmp_path / "app"
    app.mkdir()
    (app / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.16)\nproject(app C)\n"
                                        f"add_subdirectory({folder} colibri)\n")
    env = clean_env(tmp_path)
    run(["cmake", "-S", str(app), "-B", str(tmp_path / "b")], env=env)
    run(["cmake", "--build", str(tmp_path / "b"), "-j2"], env=env)
    cache = (tmp_path / "b/CMakeCache.txt").read_text()
    assert "CMAKE_TOOLCHAIN_FILE" not in cache
    assert list((tmp_path / "b").rglob(f"libcolibri_{MODEL}*.a")) or list((tmp_path / "b").rglob("*.a"))
