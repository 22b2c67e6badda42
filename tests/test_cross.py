"""Every Linux target: built by SCons, run under QEMU (or natively), checked against the numpy reference."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.reference import Reference
from colibri.codegen.spec import canonical_names
from colibri.toolchain.targets import load_target

from blobread import header as blob_header
from blobread import weights as blob_weights
from conftest import BIN, CROSS_SHAPE, ROOT, require_target, scons, synth
from targets_under_test import cross, one_per_arch

CROSS = cross()
ELF_MACHINE = {"x86_64": "Advanced Micro Devices X86-64", "aarch64": "AArch64", "arm": "ARM",
               "riscv64": "RISC-V"}
PROMPT = [3, 17, 42]
N_GEN = 16
SHARED_PROGRAM_OBJECTS = ("demo_common", "colibri_run", "colibri_demo_dl")  # the programs' model-independent objects
USABLE = [t for t in CROSS if not load_target(t).missing()]  # the targets whose compiler is installed


@pytest.fixture(scope="module")
def cross_builds(cross_ckpt, build_model) -> dict[str, str]:
    """Every usable Linux target's build of the cross checkpoint, f32 and int8c, each in one SCons run:
    {quant: what that run printed} (test_all_targets_in_one_run_and_null_build reads the int8c run's)."""
    return {quant: build_model.many(cross_ckpt, quant, USABLE)[1] for quant in ("int8c", "f32")}


@pytest.fixture(scope="module")
def references(cross_ckpt):
    c = open_checkpoint(cross_ckpt)
    return c.spec, {n: c.get(n) for n in canonical_names(c.spec)}


def _run(target: str, program, *args: str) -> list[str]:
    res = subprocess.run([str(BIN / "colibri"), "run", "--target", target, str(program), "--", *args],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{target} {program}: exit {res.returncode}\n{res.stderr}"
    return res.stdout.splitlines()


def _parse(lines: list[str]) -> tuple[list[int], np.ndarray]:
    tokens = next(line for line in lines if line.startswith("tokens: "))
    logits = next(line for line in lines if line.startswith("logits: "))
    return ([int(t) for t in tokens[8:].split(",")],
            np.array([float(v) for v in logits[8:].split(",")], dtype=np.float32))


@pytest.mark.parametrize("quant", ["f32", "int8c"])
@pytest.mark.parametrize("target", CROSS)
def test_target_matches_reference(target, quant, cross_ckpt, references, build_model, cross_builds):
    require_target(target)
    out = build_model(cross_ckpt, quant, target)
    spec, src = references
    weights = src if quant == "f32" else blob_weights(out / "model.bin")
    ref = Reference(spec, weights, max_seq=256)
    want_logits = ref.forward(PROMPT)
    ref.reset()
    want_tokens = ref.generate(PROMPT, N_GEN)
    args = ("--tokens", ",".join(map(str, PROMPT)), "--generate", str(N_GEN), "--print-logits")
    static = _parse(_run(target, out / "colibri_demo", *args))
    dl = _parse(_run(target, out / "colibri_demo_dl", str(out / f"libcolibri_{out.name}.so"), *args))
    bound = 1e-4 * float(np.max(np.abs(want_logits)))
    for how, (tokens, logits) in (("colibri_demo", static), ("colibri_demo_dl", dl)):
        assert tokens == want_tokens, f"{target} {how}: tokens differ from the reference"
        assert float(np.max(np.abs(logits - want_logits))) <= bound, f"{target} {how}: logits off"
    assert np.array_equal(static[1], dl[1])


def _readelf(*args) -> str:
    return subprocess.run(["readelf", "-W", *map(str, args)], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("target", CROSS)
def test_shared_objects_are_hardened(target, cross_ckpt, build_model, cross_builds):
    require_target(target)
    out = build_model(cross_ckpt, "int8c", target)
    arch = load_target(target).arch
    for so in (out / f"libcolibri_{out.name}.so", out / "libcolibri.so"):
        header = _readelf("-h", so)
        assert ELF_MACHINE[arch] in header, f"{so.name}: machine is not {arch}"
        defined = [f[7] for f in map(str.split, _readelf("--dyn-syms", so).splitlines())
                   if len(f) >= 8 and f[0].endswith(":") and f[0][:-1].isdigit() and f[6] != "UND"
                   and f[4] in ("GLOBAL", "WEAK")]  # local section symbols are not exports
        assert defined and all(d.startswith("colibri_") for d in defined), f"{so.name}: exports {defined}"
        segments = _readelf("-l", so)
        assert "GNU_RELRO" in segments
        stack = next(line for line in segments.splitlines() if "GNU_STACK" in line)
        assert "RWE" not in stack, f"{so.name}: executable stack"
        dynamic = _readelf("-d", so)
        assert "BIND_NOW" in dynamic or "(FLAGS)" in dynamic and "NOW" in dynamic
        assert "TEXTREL" not in dynamic
        assert f"[{so.name}.1]" in dynamic, f"{so.name}: SONAME without the ABI major"


def test_pkg_config_app_builds_and_runs_on_target(cross_ckpt, build_model, cross_builds, tmp_path):
    require_target("rpi4")
    out = build_model(cross_ckpt, "int8c", "rpi4")
    app = tmp_path / "app.c"
    app.write_text(
        '#include <stdio.h>\n#include "model.h"\n'
        "int main(void) { colibri_ctx *ctx; int32_t t[3] = {3, 17, 42}; static float lg[COLIBRI_VOCAB];\n"
        "  colibri_status s = colibri_model_open(&ctx); if (s) { puts(colibri_strerror(s)); return 1; }\n"
        "  s = colibri_forward(ctx, t, 3, lg, COLIBRI_VOCAB); int best = 0;\n"
        "  for (int i = 1; i < COLIBRI_VOCAB; i++) if (lg[i] > lg[best]) best = i;\n"
        '  printf("%d %d\\n", (int)s, best); return (int)s; }\n')
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", f"colibri_{out.name}"], capture_output=True,
                           text=True, check=True, env={**os.environ, "PKG_CONFIG_PATH": str(out)}).stdout.split()
    exe = tmp_path / "app"
    subprocess.run(["aarch64-linux-gnu-gcc", "-std=c11", "-Wall", "-Werror", str(app), "-o", str(exe), *flags],
                   check=True)
    lines = _run("rpi4", exe)
    status, best = map(int, lines[0].split())
    demo = _run("rpi4", out / "colibri_demo", "--tokens", "3,17,42", "--generate", "1")
    assert status == 0 and demo[0] == f"tokens: {best}"


def test_missing_compiler_names_the_package(cross_ckpt, tmp_path):
    tdir = tmp_path / "targets"
    tdir.mkdir()
    (tdir / "ghost.toml").write_text('description = "a board whose compiler is not installed"\nkind = "linux"\n'
                                     'arch = "aarch64"\ncc = "ghost-linux-gnu-gcc"\n'
                                     'packages = ["gcc-ghost-linux-gnu"]\n')
    res = subprocess.run([str(BIN / "scons"), "-C", str(ROOT), "-Q", f"BUILD={tmp_path / 'b'}", "TARGET=ghost",
                          f"MODEL={cross_ckpt}"], capture_output=True, text=True,
                         env={**os.environ, "COLIBRI_TARGETS_DIR": str(tdir)})
    assert res.returncode != 0
    lines = [line for line in res.stderr.splitlines() if line.startswith("colibri:")]
    assert len(lines) == 1 and "ghost-linux-gnu-gcc" in lines[0] and "gcc-ghost-linux-gnu" in lines[0]
    assert not (tmp_path / "b" / "ghost").exists()


def test_all_targets_in_one_run_and_null_build(cross_ckpt, cross_builds, build_model, tmp_path):
    """One scons run for every target (the int8c run of cross_builds, the first build of the cross
    checkpoint in the session) exports the model once; a second model compiles only what depends on the
    model; a rerun is a null build. On the session's shared build root, whose model-independent objects
    other tests have built (or this one builds: the assertions hold either way)."""
    usable = USABLE
    build = build_model.root
    ckpt = cross_ckpt
    exports = [line for line in cross_builds["int8c"].splitlines() if line.startswith(f"model {ckpt.name}:")]
    assert len(exports) == 1, "the model must be exported once for all targets"
    for t in usable:
        assert (build / t / ckpt.name / "colibri_demo").is_file()
        assert (build / t / ckpt.name / "compile_commands.json").is_file()
    # a second model of one target in the same build directory compiles only what depends on the model;
    # its obj/ holds the same shared objects, with their stack files, as the first's
    other = synth(tmp_path / "other" / "otherm", **{**CROSS_SHAPE, "seed": 22})
    compiled = [line.split()[-1] for line in scons(f"MODEL={other}", f"TARGET={usable[0]}", build=build).stdout
                .splitlines() if line.startswith("CC ")]
    assert compiled and not [c for c in compiled if "/generic/" in c or Path(c).stem in SHARED_PROGRAM_OBJECTS]
    first, second = build / usable[0] / ckpt.name / "obj", build / usable[0] / "otherm" / "obj"
    for obj in sorted((first / "generic").glob("*.os")) + [first / f"{o}.o" for o in SHARED_PROGRAM_OBJECTS]:
        assert (second / obj.relative_to(first)).read_bytes() == obj.read_bytes(), obj.name
        assert (second / obj.relative_to(first)).with_suffix(".su").is_file(), obj.name
    assert scons(f"MODEL={ckpt}", f"TARGET={','.join(usable)}", "--question", build=build,
                 check=False).returncode == 0


def test_scalar_builds_agree_bit_for_bit_across_targets(cross_ckpt, build_model):
    """Own exp/sin/cos and no FMA contraction: scalar kernels give the same bits on every ISA."""
    runs = {}
    targets = one_per_arch(CROSS)
    for target in targets:
        require_target(target)
    outs = build_model.many(cross_ckpt, "int8c", targets, "KERNELS=scalar", only=("colibri_demo",))[0]
    for target, out in outs.items():
        lines = _run(target, out / "colibri_demo", "--tokens", "3,17,42", "--generate", "8", "--print-logits")
        runs[target] = [line for line in lines if line.startswith(("tokens: ", "logits: "))]
    first = next(iter(runs.values()))
    for target, lines in runs.items():
        assert lines == first, f"{target} differs from x86_64 in the printed logits"


Q8_SHAPE = dict(layers=2, hidden=64, ffn=96, heads=4, kv_heads=2, experts=4, top_k=2, vocab=75, seed=23)


def test_integer_matmuls_give_the_same_bits_everywhere(tmp_path_factory, build_model):
    """int8c with integer matmuls (format 1.2): every target's SIMD build, a scalar build and a blob in the
    other layout print the same logits, bit for bit (exact integer sums, fixed float steps)."""
    ckpt = synth(tmp_path_factory.mktemp("q8") / "q8m", **Q8_SHAPE)
    args = ("--tokens", "3,17,42", "--generate", "8", "--print-logits")
    runs = {}
    for target in ["host", *CROSS]:
        require_target(target)
    for extra, targets in (((), ["host", *CROSS]), (("KERNELS=scalar",), ["host"])):
        outs = build_model.many(ckpt, "int8c", targets, *extra, only=("colibri_demo",))[0]
        for target, out in outs.items():
            lines = _run(target, out / "colibri_demo", *args)
            runs[f"{target} {' '.join(extra)}"] = [line for line in lines if line.startswith(("tokens: ", "logits: "))]
    host = build_model(ckpt, "int8c", "host")
    rows = tmp_path_factory.mktemp("q8rows")
    subprocess.run([str(BIN / "colibri"), "export", str(ckpt), "-o", str(rows), "--layout", "rows", "--no-predict"],
                   check=True, capture_output=True)
    assert blob_header((rows / "model.bin").read_bytes())["layout"] == 1
    assert blob_header((host / "model.bin").read_bytes())["layout"] == 2
    lines = _run("host", host / "colibri_run", str(rows / "model.bin"), *args)
    runs["host, rows layout"] = [line for line in lines if line.startswith(("tokens: ", "logits: "))]
    first = runs["host "]
    assert len(first) == 2 and first[1].count(",") >= Q8_SHAPE["vocab"] - 1
    for name, lines in runs.items():
        assert lines == first, f"{name} differs from the host build in the printed logits"


def test_f16_matrices_in_an_integer_blob_give_the_same_bits_everywhere(tmp_path_factory, build_model):
    """int8c with --attn-quant f16:1: the f16 embedding and first-layer attention run float kernels whose
    sums have one order on every ISA (cb_scores_f16's), so every target's SIMD build and a scalar build
    print the same logits, bit for bit, as for an all-integer blob."""
    ckpt = synth(tmp_path_factory.mktemp("q8h") / "q8h", **Q8_SHAPE)
    args = ("--tokens", "3,17,42", "--generate", "8", "--print-logits")
    for target in ["host", *CROSS]:
        require_target(target)
    runs = {}
    for extra, targets in (((), ["host", *CROSS]), (("KERNELS=scalar",), ["host"])):
        outs = build_model.many(ckpt, "int8c", targets, "ATTN_QUANT=f16:1", *extra, only=("colibri_demo",))[0]
        for target, out in outs.items():
            lines = _run(target, out / "colibri_demo", *args)
            runs[f"{target} {' '.join(extra)}"] = [line for line in lines if line.startswith(("tokens: ", "logits: "))]
    first = runs["host "]
    assert len(first) == 2 and first[1].count(",") >= Q8_SHAPE["vocab"] - 1
    for name, lines in runs.items():
        assert lines == first, f"{name} differs from the host build in the printed logits"


def _checkout(where):
    """A clone of this repository whose `colibri` package is the clone's own (through a path shim)."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(where)], check=True)
    shim = where.parent / f"{where.name}-shim" / "colibri"
    shim.mkdir(parents=True)
    for pkg, src in (("codegen", "codegen"), ("toolchain", "toolchain"), ("runtime", "toolchain/binding")):
        (shim / pkg).symlink_to(where / src)
    return {**os.environ, "PYTHONPATH": str(shim.parent)}


def test_cache_dir_serves_another_checkout(cross_ckpt, tmp_path):
    cache = tmp_path / "cache"
    runs = []
    for name in ("a", "b"):
        env = _checkout(tmp_path / name)
        res = subprocess.run([str(BIN / "scons"), "-Q", "-j2", f"MODEL={cross_ckpt}", f"CACHE={cache}"],
                             cwd=tmp_path / name, capture_output=True, text=True, env=env)
        assert res.returncode == 0, res.stderr
        runs.append(res.stdout)
    compiled = [line for line in runs[1].splitlines() if line.startswith(("CC ", "AS ", "LINK "))]
    assert "Retrieved" in runs[1] and not compiled, f"the second checkout rebuilt: {compiled}"
