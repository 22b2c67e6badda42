"""Two models in one firmware image (`scons MODEL=a,b`): each gives its numpy reference's tokens, the size
audit's per-model weights equal each blob file's size, the C names do not collide (the link succeeds and
the symbol table holds both prefixes), one arena sized for the larger by default and one each with
ARENA=separate; a single-model build keeps its names."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.reference import Reference

from blobread import weights as blob_weights
from conftest import BIN, ROOT, output_dirs, require_target, scons, synth

TARGET = "stm32h7"
# two shapes (the second's arena the larger), adder-sized or smaller
MODELS = {"duo_a": dict(layers=2, hidden=32, ffn=48, heads=4, kv_heads=2, experts=4, top_k=2, vocab=96, seed=41),
          "duo_b": dict(layers=2, hidden=64, ffn=48, heads=4, kv_heads=2, experts=4, top_k=2, vocab=80, seed=42)}


@pytest.fixture(scope="module")
def duo(tmp_path_factory) -> dict:
    require_target(TARGET)
    base = tmp_path_factory.mktemp("duo")
    ckpts = {n: synth(base / n, **kw) for n, kw in MODELS.items()}
    build = base / "build"
    model = ",".join(str(c) for c in ckpts.values())
    outs = {arena: output_dirs(scons(f"MODEL={model}", f"TARGET={TARGET}", f"ARENA={arena}", build=build))[TARGET]
            for arena in ("shared", "separate")}
    return {"ckpts": ckpts, "build": build, "outs": outs}


def _gen(build: Path, name: str) -> Path:
    return next((build / "gen" / name).glob("*-rows-pb32"))


def _model_h(build: Path, name: str) -> dict[str, str]:
    text = (_gen(build, name) / "model.h").read_text()
    return dict(re.findall(r"^#define (COLIBRI_\w+) (.*?)\s*(?:/\*.*)?$", text, re.M))


def _reference(build: Path, ckpt: Path, name: str) -> list[int]:
    h = _model_h(build, name)
    prompt = [int(t) for t in h["COLIBRI_DEFAULT_PROMPT"].strip("{} ").split(",")]
    return Reference(open_checkpoint(ckpt).spec, blob_weights(_gen(build, name) / "model.bin"),
                     max_seq=int(h["COLIBRI_MAX_SEQ"])).generate(prompt, int(h["COLIBRI_DEFAULT_GENERATE"]))


def _symbols(elf: Path) -> dict[str, int]:
    with elf.open("rb") as f:
        return {s.name: s["st_size"] for s in ELFFile(f).get_section_by_name(".symtab").iter_symbols()}


@pytest.mark.parametrize("arena", ["shared", "separate"])
def test_both_models_give_their_references_tokens(duo, arena):
    out = duo["outs"][arena]
    assert out.name == {"shared": "duo_a+duo_b", "separate": "duo_a+duo_b-separate"}[arena]
    res = subprocess.run([str(BIN / "colibri"), "run", "--target", TARGET, str(out / f"{out.name}.elf")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    got = dict(re.findall(r"^tokens (\w+): ([\d,]*)$", res.stdout, re.M))
    assert list(got) == list(MODELS), res.stdout  # one after the other, in MODEL's order
    for name, ckpt in duo["ckpts"].items():
        assert [int(t) for t in got[name].split(",")] == _reference(duo["build"], ckpt, name), name


def test_two_int4c_models_fit_and_answer(duo, tmp_path):
    """Both models in int4c in one image: it links (its stack bound, int4 matmuls included, within the target's
    reserve: a larger int4 matmul frame once took it over) and each model's tokens are its reference's on its
    blob's weights (the int4 kernels in the generic runtime, COLIBRI_INT4 not 0)."""
    build = tmp_path / "b"
    model = ",".join(str(c) for c in duo["ckpts"].values())
    out = output_dirs(scons(f"MODEL={model}", f"TARGET={TARGET}", "QUANT=int4c", build=build))[TARGET]
    res = subprocess.run([str(BIN / "colibri"), "run", "--target", TARGET, str(out / f"{out.name}-qemu.elf")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    got = dict(re.findall(r"^tokens ([\w-]+): ([\d,]*)$", res.stdout, re.M))
    assert len(got) == len(MODELS), res.stdout
    for (name, ckpt), tokens in zip(duo["ckpts"].items(), got.values(), strict=True):
        assert _model_h(build, f"{name}-int4c")["COLIBRI_INT4"] == "1"
        assert [int(t) for t in tokens.split(",")] == _reference(build, ckpt, f"{name}-int4c"), name


def test_audit_weights_per_model_are_the_blobs(duo):
    out = duo["outs"]["shared"]
    res = subprocess.run([str(BIN / "colibri"), "size", "--json", str(out / f"{out.name}.elf")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    blobs = {n: (_gen(duo["build"], n) / "model.bin").stat().st_size for n in MODELS}
    assert {n: m["weights_bytes"] for n, m in report["models"].items()} == blobs
    for n, m in report["models"].items():
        assert m["weights"]["matches_manifest"] and sum(m["weights"]["by_kind"].values()) == blobs[n], n
    weights = next(c for c in report["categories"] if c["key"] == "weights")
    assert weights["bytes"] == sum(blobs.values())


def test_names_do_not_collide(duo):
    syms = _symbols(duo["outs"]["shared"] / "duo_a+duo_b.elf")
    for n in MODELS:
        assert f"colibri_{n}_open" in syms and f"colibri_{n}_blob_data" in syms, n
    assert "colibri_model_open" not in syms and "colibri_blob_data" not in syms
    nm = subprocess.run(["arm-none-eabi-nm", str(duo["outs"]["shared"] / "duo_a+duo_b.elf")], capture_output=True,
                        text=True, check=True).stdout
    assert {m for m in re.findall(r" colibri_(duo_[ab])_open$", nm, re.M)} == set(MODELS)


def test_shared_arena_is_the_larger_and_separate_both(duo):
    arenas = {n: int(_model_h(duo["build"], n)["COLIBRI_ARENA_SIZE"].rstrip("u")) for n in MODELS}
    assert arenas["duo_b"] > arenas["duo_a"]
    shared = _symbols(duo["outs"]["shared"] / "duo_a+duo_b.elf")["colibri_arena"]
    assert shared == max(arenas.values())
    with (duo["outs"]["separate"] / "duo_a+duo_b-separate.elf").open("rb") as f:
        arena = ELFFile(f).get_section_by_name(".bss.colibri_arena")
        assert arena is not None and arena.data_size >= sum(arenas.values())


def test_single_model_keeps_its_names(duo, tmp_path):
    """model.h declares both the model's own prefix and the stable names; the generated model.c defines
    colibri_model_open on top of colibri_<name>_open unless COLIBRI_MULTI_MODEL."""
    gen = _gen(duo["build"], "duo_a")
    h, c = (gen / "model.h").read_text(), (gen / "model.c").read_text()
    assert "colibri_status colibri_duo_a_open(colibri_ctx **ctx);" in h
    assert "colibri_status colibri_model_open(colibri_ctx **ctx);" in h
    obj = tmp_path / "model.o"
    for defines, want, absent in (([], {"colibri_model_open", "colibri_duo_a_open"}, set()),
                                  (["-DCOLIBRI_MULTI_MODEL"], {"colibri_duo_a_open"}, {"colibri_model_open"})):
        subprocess.run(["arm-none-eabi-gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-c",
                        f"-I{ROOT / 'runtime_c/include'}", *defines, str(gen / "model.c"), "-o", str(obj)],
                       check=True)
        nm = subprocess.run(["arm-none-eabi-nm", str(obj)], capture_output=True, text=True, check=True).stdout
        defined = set(re.findall(r" T (\w+)$", nm, re.M))
        assert want <= defined and not absent & defined, (defines, defined)
    assert "colibri_model_open" in c


@pytest.mark.parametrize("args, line", [
    (("ARENA=both",), "colibri: ARENA=both: expected one of shared, separate"),
    (("TARGET=x86_64",), "colibri: MODEL=a,b: target x86_64 is linux: several models in one image are built for "
                         "firmware targets"),
    (("PARTITION=model",), "colibri: PARTITION: not with MODEL=a,b (several models in one image)"),
])
def test_bad_options_one_line(duo, args, line, tmp_path):
    model = ",".join(str(c) for c in duo["ckpts"].values())
    res = scons(f"MODEL={model}", f"TARGET={TARGET}", *args, build=tmp_path, check=False)
    assert res.returncode == 2, res.stderr
    assert [ln for ln in res.stderr.splitlines() if ln.startswith("colibri:")] == [line], res.stderr


def test_arena_option_needs_two_models(duo, tmp_path):
    res = scons(f"MODEL={duo['ckpts']['duo_a']}", f"TARGET={TARGET}", "ARENA=separate", build=tmp_path, check=False)
    assert res.returncode == 2
    assert [ln for ln in res.stderr.splitlines() if ln.startswith("colibri:")] == [
        "colibri: ARENA=separate: only with MODEL=a,b (a single model has an arena of its own)"], res.stderr


def test_same_c_name_refused(duo, tmp_path):
    other = synth(tmp_path / "x" / "duo_a", **MODELS["duo_a"])
    res = scons(f"MODEL={duo['ckpts']['duo_a']},{other}", f"TARGET={TARGET}", build=tmp_path / "b", check=False)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("colibri:")]
    assert len(lines) == 1 and "are both named duo_a in C (colibri_duo_a_open)" in lines[0], res.stderr
