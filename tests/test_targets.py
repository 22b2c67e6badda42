"""Target files against their schema (toolchain/target_schema.py): misspelt keys, wrong types and missing
keys are one line naming the file; `colibri targets` lists a broken file beside the others; `--check`
finds what is wrong with a memory map or a toolchain; what a target declares reaches the exporter and
the compiler."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.plan import prefill_block
from colibri.toolchain import target_schema
from colibri.toolchain.targets import SCHEMA_FIELDS, TargetError, all_targets, load_target

from conftest import BIN, ROOT, output_dirs, synth

TARGETS = ROOT / "targets"


def _colibri(*args: str, targets_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "colibri"), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLIBRI_TARGETS_DIR": str(targets_dir)})


def _board(tmp_path: Path, name: str, text: str) -> Path:
    d = tmp_path / "targets"
    d.mkdir(exist_ok=True)
    (d / f"{name}.toml").write_text(text)
    return d


def _edit(src: str, old: str, new: str) -> str:
    text = (TARGETS / f"{src}.toml").read_text()
    assert re.search(old, text, re.M), f"{old!r} not in targets/{src}.toml"
    return re.sub(old, new, text, count=1, flags=re.M)


def test_schema_md_is_generated_from_the_schema():
    assert (TARGETS / "SCHEMA.md").read_text() == target_schema.render_markdown(), (
        "targets/SCHEMA.md is out of date: python -m colibri.toolchain.target_schema --write")


def test_target_fields_are_the_schema_keys():
    assert SCHEMA_FIELDS == tuple(k.name for k in target_schema.SCHEMA)


def test_every_target_declares_what_codegen_and_the_tests_need():
    for t in all_targets():
        for key in ("weight_layout", "max_prefill_block", "threads", "kernels"):
            assert key in t.given, f"targets/{t.name}.toml does not declare {key}"
        assert set(t.kernels) == {"float", "int8"}, f"targets/{t.name}.toml: kernels needs float and int8"
        assert t.missing_for_image() == [], t.name


@pytest.mark.parametrize("target, old, new, key, hint", [
    ("stm32h7", r"^cflags =", "cflag =", "cflag", "cflags"),
    ("rpi4", r"^runner =", "runer =", "runer", "runner"),
    ("stm32h7", r"^qemu_memory =", "qemu_memroy =", "qemu_memroy", "qemu_memory"),
    ("rv32imac", r"^length = 0x80000", "lenght = 0x80000", "lenght", "length"),  # inside [[memory]]
    ("stm32h7", r"^arena =", "arina =", "arina", "arena"),  # inside [placement]
])
def test_misspelt_key_is_refused_with_the_close_match(target, old, new, key, hint, tmp_path):
    d = _board(tmp_path, "board", _edit(target, old, new))
    with pytest.raises(TargetError) as e:
        load_target("board", d)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(d / "board.toml")), msg
    assert f"unknown key {key!r} (did you mean {hint!r}?)" in msg, msg


@pytest.mark.parametrize("old, new, says", [
    (r"^cflags = .*$", 'cflags = "-mcpu=cortex-m7"', "cflags must be a list of strings"),
    (r"^threads = false", 'threads = "no"', "threads must be true or false"),
    (r"^max_prefill_block = 32", "max_prefill_block = 64", "max_prefill_block = 64: use one of 32, 128"),
    (r"^weight_layout = .*$", 'weight_layout = "columns"', "weight_layout = 'columns': use one of"),
    (r"^kind = .*$", 'kind = "rtos"', "kind = 'rtos': use one of 'linux', 'firmware'"),
    (r"^stack_bytes = \d+", "stack_bytes = -1", "stack_bytes must be a non-negative integer"),
    (r"^flash = 2097152", 'flash = "two megs"', "budget.flash must be a size"),
    (r"^cc = .*$", "", "missing key 'cc'"),
    (r"^\[\[memory\]\]", "[[memoria]]", "unknown key 'memoria' (did you mean 'memory'?)"),
    (r"^kind = \"flash\"", "", "memory[0]: missing key 'kind'"),
])
def test_wrong_type_or_missing_key_is_one_line(old, new, says, tmp_path):
    d = _board(tmp_path, "board", _edit("stm32h7", old, new))
    with pytest.raises(TargetError) as e:
        load_target("board", d)
    assert "\n" not in str(e.value) and str(e.value).startswith(str(d / "board.toml")), str(e.value)
    assert says in str(e.value), str(e.value)


def test_firmware_image_needs_its_keys(tmp_path):
    """A board file without family/placement is a memory map for `colibri size`; building it is refused."""
    from colibri.toolchain.firmware import firmware_spec

    d = _board(tmp_path, "board", _edit("stm32h7", r"^family = .*$", ""))
    t = load_target("board", d)
    assert t.missing_for_image() == ["family"]
    with pytest.raises(TargetError, match=r"missing key 'family' \(needed to build a firmware image\)"):
        firmware_spec(t)


def test_colibri_targets_lists_a_broken_file_beside_the_others(tmp_path):
    d = _board(tmp_path, "host", (TARGETS / "host.toml").read_text())
    _board(tmp_path, "stm32h7", (TARGETS / "stm32h7.toml").read_text())
    _board(tmp_path, "bad", 'description = "unterminated\nkind = "linux"\n')
    _board(tmp_path, "typo", _edit("rpi4", r"^runner =", "runer ="))
    res = _colibri("targets", targets_dir=d)
    assert res.returncode == 2, res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines()}
    assert set(rows) == {"bad", "host", "stm32h7", "typo"}, res.stdout
    assert rows["host"].split()[1] == "linux" and rows["stm32h7"].split()[1] == "firmware"
    assert rows["bad"].split()[1] == "broken" and rows["typo"].split()[1] == "broken"
    errors = res.stderr.splitlines()
    assert len(errors) == 2 and "Traceback" not in res.stderr, res.stderr
    assert errors[0].startswith(f"colibri: {d / 'bad.toml'}: ") and "did you mean 'runner'" in errors[1], errors


def test_colibri_targets_check_passes_on_the_repository_targets():
    res = _colibri("targets", "--check", targets_dir=TARGETS)
    problems = res.stderr.splitlines()
    # the only problems a checkout may have: tools this machine lacks
    assert all("not found; install it with: apt-get install" in p for p in problems), res.stderr
    assert res.returncode == (2 if problems else 0), res.stderr
    assert len(res.stdout.splitlines()) == len(list(TARGETS.glob("*.toml")))


@pytest.mark.parametrize("old, new, says", [
    (r"^origin = 0x00000000", "origin = 0x08100000", r"part map: regions FLASH \[0x8000000, 0x8200000\) and ITCM "
                                                     r"\[0x8100000, 0x8110000\) overlap"),
    (r"^arena = .*$", 'arena = "SRAM9"', r"part placement arena = 'SRAM9': no such region"),
    (r"^ram = 1048576", "ram = 4194304", r"budget.ram = 4194304 is more than the part's ram regions hold"),
    (r"^flash = 2097152", "flash = 4194304", r"budget.flash = 4194304 is more than the part's flash regions hold"),
    (r'\{ name = "DTCM", origin = 0x20000000, length = 0x20000 \}',
     '{ name = "DTCM", origin = 0x20000000, length = 0x10000 }', r"qemu_memory DTCM: length 0x10000, the part's is"),
    (r'\{ name = "AXI_SRAM", origin = 0x20020000,', '{ name = "AXI_SRAM", origin = 0x20010000,',
     r"qemu map: regions DTCM .* and AXI_SRAM .* overlap"),
    (r"^cc = .*$", 'cc = "ghost-none-eabi-gcc"', r"ghost-none-eabi-gcc not found; install it with: apt-get install"),
    (r"^runner = \[\"qemu-system-arm\"", 'runner = ["ghost-qemu"', r"ghost-qemu not found"),
])
def test_colibri_targets_check_finds_the_problem(old, new, says, tmp_path):
    d = _board(tmp_path, "board", _edit("stm32h7", old, new))
    assert _colibri("targets", targets_dir=d).returncode == 0  # it loads: only --check finds it
    res = _colibri("targets", "--check", targets_dir=d)
    assert res.returncode == 2, res.stderr
    errors = res.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith("colibri: targets/board.toml: "), res.stderr
    assert re.search(says, errors[0]), errors[0]


def test_what_a_target_declares_reaches_the_exporter_and_the_compiler(tmp_path):
    """A Linux target (threads = true) that declares max_prefill_block = 32: the export plans blocks of at
    most 32 tokens, every runtime object is compiled with -DCOLIBRI_MAX_PREFILL_BLOCK=32 (and without
    -DCOLIBRI_NO_PARALLEL: the two are independent), and that runtime refuses a blob planned for larger
    blocks. (threads = false is every firmware target's: their stack bound needs it.)"""
    shape = dict(layers=1, hidden=32, ffn=32, heads=2, kv_heads=2, experts=2, top_k=1, vocab=40, seed=5)
    ckpt = synth(tmp_path / "tiny", **shape)
    unconstrained = prefill_block(open_checkpoint(ckpt).spec, 256)
    assert unconstrained > 32, "the test needs a model whose default block is above 32"
    text = (TARGETS / "x86_64.toml").read_text()
    text, n = re.subn(r"^max_prefill_block = .*$", "max_prefill_block = 32", text, flags=re.M)
    assert n == 1 and "threads = true" in text
    d = _board(tmp_path, "small", text)
    build = tmp_path / "b"
    res = subprocess.run([str(BIN / "scons"), "-C", str(ROOT), "-Q", "-j2", f"BUILD={build}", "TARGET=small",
                          f"MODEL={ckpt}", "MAX_SEQ=256"], capture_output=True, text=True,
                         env={**os.environ, "COLIBRI_TARGETS_DIR": str(d)})
    assert res.returncode == 0, res.stdout + res.stderr
    out = output_dirs(res)["small"]  # MAX_SEQ is not the default: tiny-int8c-<hash of the options>
    assert out.parent == build / "small"
    assert json.loads((out / "manifest.json").read_text())["arena"]["prefill_block"] == 32
    runtime = [e for e in json.loads((out / "compile_commands.json").read_text())
               if e["file"].startswith("runtime_c/src/") or "/runtime_c/src/" in e["file"]]
    assert runtime
    for e in runtime:
        assert "-DCOLIBRI_MAX_PREFILL_BLOCK=32" in e["command"] and "-DCOLIBRI_NO_PARALLEL" not in e["command"], e
    wide = tmp_path / "wide"
    subprocess.run([str(BIN / "colibri"), "export", str(ckpt), "-o", str(wide), "--max-seq", "256", "--no-predict"],
                   check=True, capture_output=True)
    assert json.loads((wide / "manifest.json").read_text())["arena"]["prefill_block"] == unconstrained
    ok = subprocess.run([str(out / "colibri_run"), str(out / "model.bin"), "--tokens", "1,2,3", "--generate", "2"],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    refused = subprocess.run([str(out / "colibri_run"), str(wide / "model.bin"), "--tokens", "1,2,3", "--generate",
                              "2"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "tokens:" not in refused.stdout and "model.bin" in refused.stderr, (
        refused.stdout + refused.stderr)
