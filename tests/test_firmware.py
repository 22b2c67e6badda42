"""Firmware images: built by SCons for each microcontroller target, booted under QEMU,
checked token for token against the numpy reference, and audited (flash, RAM, stack)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.reference import Reference
from colibri.codegen.spec import canonical_names
from colibri.toolchain import firmware
from colibri.toolchain.scons.layout import gen_dir
from colibri.toolchain.size.audit import Options as SizeOptions
from colibri.toolchain.size.audit import audit as size_audit
from colibri.toolchain.size.command import summary_line
from colibri.toolchain.size.stack import analysis_files
from colibri.toolchain.targets import load_target

from blobread import weights as blob_weights
from conftest import BIN, ROOT, output_dirs, scons, synth
from targets_under_test import firmware as firmware_targets

FW_TARGETS = firmware_targets()
ADDER = ROOT / "firmware_examples/models/adder"  # the trained demo model
# Small enough for every budget in f32 too (about 200 KB of weights).
SMALL = dict(layers=2, hidden=48, ffn=64, heads=4, kv_heads=2, experts=4, top_k=2, vocab=131, seed=21, dtype="f32")
# The default shape with five layers: about 2.3 MB of f32 weights, more than the STM32H7's 2 MiB of flash.
OVER_BUDGET = dict(layers=5, hidden=64, ffn=128, heads=8, kv_heads=2, experts=4, top_k=2, vocab=320, seed=3,
                   dtype="f32")


def _missing(target: str) -> list[str]:
    return load_target(target).missing()


def _needs(target: str):
    missing = _missing(target)
    return pytest.mark.skipif(bool(missing), reason=f"{target}: {', '.join(missing)} not installed")


@pytest.fixture(scope="module")
def small_ckpt(tmp_path_factory) -> Path:
    return synth(tmp_path_factory.mktemp("fw") / "fw_small", **SMALL)


def _gen_dir(build: Path, target: str, model: str, quant: str) -> Path:
    """The export a firmware build used: the weight layout and prefill limit its target declares
    (build/gen/<m>/<q>-rows-pb32)."""
    t = load_target(target)
    return build / "gen" / model / gen_dir(quant, t.weight_layout, t.max_prefill_block)


def _gen(out: Path, quant: str) -> Path:
    return _gen_dir(out.parent.parent, out.parent.name, out.name, quant)


def _model_h(out: Path, quant: str) -> dict[str, str]:
    text = (_gen(out, quant) / "model.h").read_text()
    return dict(re.findall(r"^#define (COLIBRI_\w+) (.*?)\s*(?:/\*.*)?$", text, re.M))


def _boot(target: str, elf: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """`colibri run --target T <model>.elf`: the part's ELF, which the runner maps to its QEMU twin."""
    return subprocess.run([str(BIN / "colibri"), "run", "--target", target, str(elf)], capture_output=True,
                          text=True, timeout=timeout)


def _expected_tokens(ckpt: Path, out: Path, quant: str) -> list[int]:
    h = _model_h(out, quant)
    prompt = [int(t) for t in h["COLIBRI_DEFAULT_PROMPT"].strip("{} ").split(",")]
    n = int(h["COLIBRI_DEFAULT_GENERATE"])
    max_seq = int(h["COLIBRI_MAX_SEQ"])
    c = open_checkpoint(ckpt)
    if quant == "f32":
        w = {name: c.get(name) for name in canonical_names(c.spec)}
    else:  # exactly the weights the C runtime computes with
        w = blob_weights(_gen(out, quant) / "model.bin")
    return Reference(c.spec, w, max_seq=max_seq).generate(prompt, n)


def _run_output(res: subprocess.CompletedProcess) -> tuple[list[int], str, int, int]:
    lines = res.stdout.splitlines()
    assert len(lines) == 3, f"unexpected output:\n{res.stdout}\n{res.stderr}"
    assert lines[0].startswith("tokens: "), lines[0]
    tokens = [int(t) for t in lines[0].removeprefix("tokens: ").split(",") if t]
    m = re.fullmatch(r"(cycles|instructions): (\d+)", lines[1])
    assert m, lines[1]
    s = re.fullmatch(r"stack: (\d+)", lines[2])
    assert s, lines[2]
    return tokens, m.group(1), int(m.group(2)), int(s.group(1))


@pytest.mark.parametrize("quant", ["f32", "int8c"])
@pytest.mark.parametrize("target", [pytest.param(t, marks=_needs(t)) for t in FW_TARGETS])
def test_boots_and_matches_reference(target, quant, small_ckpt, build_model):
    out = build_model(small_ckpt, quant, target)
    name = out.name
    for ext in (".elf", ".bin", ".hex", ".map", ".size.json"):
        assert (out / f"{name}{ext}").is_file(), f"{name}{ext} missing"
    res = _boot(target, out / f"{name}.elf")
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.stdout}\n{res.stderr}"
    tokens, unit, count, stack_used = _run_output(res)
    assert tokens == _expected_tokens(small_ckpt, out, quant), f"{target} {quant}: greedy tokens differ"
    assert unit == "instructions" and count > 0  # all three QEMU images count instructions (-icount)
    audit = json.loads((out / f"{name}.size.json").read_text())
    # the measured high-water mark stays within the static bound, which is within the reservation
    assert 0 < stack_used <= audit["image_stack"]["bytes"] <= audit["image_stack"]["reserved"]


@pytest.mark.parametrize("target", [pytest.param(t, marks=_needs(t)) for t in FW_TARGETS])
def test_demo_model_adds_on_every_microcontroller(target, build_model):
    """The trained demo model's built-in prompt (<BOS>123+456=, byte vocabulary) on each firmware target:
    the digits of the sum, then EOS."""
    prompt = json.loads((ADDER / "colibri.json").read_text())["prompt"]
    eos = json.loads((ADDER / "config.json").read_text())["eos_token_id"]
    a, b = bytes(t for t in prompt if t < 256).decode().removesuffix("=").split("+")
    out = build_model(ADDER, "int8c", target)
    res = _boot(target, out / "adder.elf")
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.stdout}\n{res.stderr}"
    tokens, _, _, _ = _run_output(res)
    assert tokens == [*str(int(a) + int(b)).encode(), eos], f"{target}: {tokens}"


@pytest.mark.parametrize("case", ["gqa_top2", "top1_tied_bf16"])
@pytest.mark.parametrize("target", [pytest.param(t, marks=_needs(t)) for t in FW_TARGETS])
def test_golden_shapes_int8c(target, case, golden_ckpts, build_model):
    """Odd sizes, GQA, head_dim != hidden/heads, top-1 routing, a tied lm_head."""
    ckpt = golden_ckpts[case]
    out = build_model(ckpt, "int8c", target)
    res = _boot(target, out / f"{out.name}.elf")
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.stdout}\n{res.stderr}"
    tokens, _, _, _ = _run_output(res)
    assert tokens == _expected_tokens(ckpt, out, "int8c"), f"{target} {case}: greedy tokens differ"


@pytest.mark.parametrize("target", [pytest.param(t, marks=_needs(t)) for t in FW_TARGETS])
def test_map_and_elf_agree_on_placement(target, small_ckpt, build_model):
    out = build_model(small_ckpt, "int8c", target)
    fw = firmware.firmware_spec(load_target(target))
    regions = {r.name: r for r in fw.part.regions}
    text = (out / f"{out.name}.map").read_text()
    # the map's own memory configuration is the part's map
    config = text[text.index("Memory Configuration"):text.index("Linker script and memory map")]
    for r in regions.values():
        assert re.search(rf"^{r.name}\s+0x0*{r.origin:x}\s+0x0*{r.length:x}", config, re.M | re.I), r.name
    with open(out / f"{out.name}.elf", "rb") as f:
        elf = ELFFile(f)
        symbols = {s.name: s for s in elf.get_section_by_name(".symtab").iter_symbols()}
        for section, symbol, kind, place in ((".rodata.model", "colibri_blob_data", "flash", "model"),
                                             (".bss.colibri_arena", "colibri_arena", "ram", "arena")):
            m = re.search(rf"^{re.escape(section)}\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)", text, re.M)
            assert m, f"{section} not in the map"
            map_addr, map_size = int(m.group(1), 16), int(m.group(2), 16)
            sec = elf.get_section_by_name(section)
            assert (sec["sh_addr"], sec["sh_size"]) == (map_addr, map_size), section
            region = regions[fw.part.place[place]]
            assert region.kind == kind and region.holds(map_addr, map_size), f"{section} outside {region.name}"
            sym = symbols[symbol]
            assert map_addr <= sym["st_value"] and sym["st_value"] + sym["st_size"] <= map_addr + map_size
        blob_size = (_gen(out, "int8c") / "model.bin").stat().st_size
        assert symbols["colibri_blob_data"]["st_size"] == blob_size
        assert elf.get_section_by_name(".bss.colibri_arena")["sh_type"] == "SHT_NOBITS"
        # only .data is copied to RAM at boot: no other loadable bytes live at a RAM address
        ram = [r for r in regions.values() if r.kind == "ram"]
        for seg in elf.iter_segments():
            if seg["p_type"] == "PT_LOAD" and seg["p_filesz"]:
                assert not any(r.holds(seg["p_paddr"]) for r in ram), f"segment loads into RAM at {seg['p_paddr']:#x}"
        data = [s.name for s in elf.iter_sections() if s["sh_flags"] & 2 and s["sh_flags"] & 1
                and s["sh_type"] == "SHT_PROGBITS" and s["sh_size"]]
        assert set(data) <= {".data", ".tdata"}, data


@pytest.mark.skipif(bool(_missing("stm32h7")), reason="arm-none-eabi toolchain or QEMU missing")
def test_stm32h7_runtime_text_size(small_ckpt, build_model):
    out = build_model(small_ckpt, "int8c", "stm32h7")
    audit = json.loads((out / f"{out.name}.size.json").read_text())
    # the build's report is `colibri size`'s own on the objects it linked, plus the image's stack bound
    part_objs = [o for o in sorted((out / "obj").glob("*.o")) if not o.stem.endswith("_qemu")]
    assert {k: v for k, v in audit.items() if k != "image_stack"} == size_audit(
        out / f"{out.name}.elf", SizeOptions(stack_files=analysis_files(part_objs)))
    flash = {c["key"]: c["flash"] for c in audit["categories"]}
    runtime_text = sum(s["bytes"] for s in audit["symbols"] if s["category"] == "runtime" and s["section"] == ".text")
    code = flash["runtime"] + flash["generated"] + flash["app"]
    objects = [str(out / "obj" / f"{s}.o") for s in ("blob", "forward", "kernels", "kernels_q8", "cbmath")]
    size = subprocess.run(["arm-none-eabi-size", *objects], capture_output=True, text=True, check=True).stdout
    objects_text = sum(int(line.split()[0]) for line in size.splitlines()[1:])
    print(f"\nstm32h7 -Os: runtime .text {runtime_text} B in the image ({objects_text} B in the objects"
          f" before --gc-sections); code without weights and libc {code} B "
          f"(runtime {flash['runtime']}, generated {flash['generated']}, startup+main {flash['app']}); "
          f"libc {flash['libc']} B; weights {flash['weights']} B; unattributed {flash['unattributed']} B")
    assert 0 < runtime_text <= objects_text
    # 12,445 B with the blob schema's bound checks and the per-check CB_BAD sites; the int4 dispatch and
    # the f16/int8 KV cache paths took the runtime alone to 12,856 B, linked even into an int8c/f32-KV image
    # (to win back: a specialised build could drop them). The arena across memories (colibri_init_regions, its
    # class ranges and checks, which model.c calls in place of colibri_init) adds about 500 B, to 14,594 B.
    # The parameters section, sliding windows, gpt-oss's sinks/biases/clamped SwiGLU and DeepSeek's MLA and
    # group-limited routing (their blob checks and forward paths, linked even into this plain-MoE image: a
    # specialised build could drop what its model's flags exclude) took it to 18,138 B. A specialised build
    # leaves the int4 kernels out when its blob has no int4 tensor (model.h COLIBRI_INT4): 17,660 B. Past 18.5 KiB it
    # has grown by more than that.
    assert code < 18.5 * 1024, "runtime + startup over 18.5 KiB at -Os"
    assert flash["weights"] == (_gen(out, "int8c") / "model.bin").stat().st_size
    assert audit["budget"]["flash"]["ok"] and audit["budget"]["ram"]["ok"]
    assert audit["budget"]["flash"]["limit"] == 2097152 and audit["budget"]["ram"]["limit"] == 1048576


@pytest.mark.skipif(bool(_missing("stm32h7")), reason="arm-none-eabi toolchain or QEMU missing")
def test_over_budget_model_fails_naming_region_and_overflow(tmp_path):
    ckpt = synth(tmp_path / "too_big", **OVER_BUDGET)
    build = tmp_path / "build"
    res = scons(f"MODEL={ckpt}", "QUANT=f32", "TARGET=stm32h7", build=build, check=False)
    assert res.returncode != 0
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if "overflow" in ln]
    assert len(lines) == 1, lines  # one line, not the linker's own
    m = re.fullmatch(r"colibri: stm32h7: model too_big does not fit: FLASH overflowed by (\d+) bytes "
                     r"\(region 2097152 bytes, flash budget 2097152\): model \(\.rodata\.model\)", lines[0])
    assert m, lines[0]
    out = output_dirs(res)["stm32h7"]  # build/stm32h7/too_big-f32: not the default options
    assert out.parent == build / "stm32h7"
    blob = (_gen(out, "f32") / "model.bin").stat().st_size
    assert 0 < blob - 2097152 < int(m.group(1)) < blob - 2097152 + 64 * 1024  # weights + code - budget
    left = [p.name for p in out.iterdir() if p.suffix in (".elf", ".bin", ".hex", ".map")] if out.is_dir() else []
    assert not left, f"image left behind: {left}"


@pytest.mark.skipif(bool(_missing("stm32h7")), reason="arm-none-eabi toolchain or QEMU missing")
def test_arena_over_its_sram_fails_naming_region(small_ckpt, tmp_path):
    """A KV cache for 4096 positions does not fit the 512 KiB AXI SRAM the arena is placed in."""
    build = tmp_path / "build"
    res = scons(f"MODEL={small_ckpt}", "QUANT=int8c", "TARGET=stm32h7", "MAX_SEQ=4096", build=build, check=False)
    assert res.returncode != 0
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if "overflow" in ln]
    assert len(lines) == 1, lines
    m = re.fullmatch(r"colibri: stm32h7: model fw_small does not fit: AXI_SRAM overflowed by (\d+) bytes "
                     r"\(region 524288 bytes, ram budget 1048576\): kv_cache \(\.bss\.colibri_kv\)", lines[0])
    assert m, lines[0]
    out = output_dirs(res)["stm32h7"]
    h = (_gen(out, "int8c") / "model.h").read_text()
    arena = int(re.search(r"#define COLIBRI_ARENA_SIZE (\d+)u", h).group(1))
    assert int(m.group(1)) == arena - 524288  # the arena alone fills that SRAM
    assert not list(out.glob("*.elf"))


@pytest.mark.skipif(bool(_missing("stm32h7")), reason="arm-none-eabi toolchain or QEMU missing")
def test_stack_reservation_below_bound_fails(small_ckpt, build_model, tmp_path):
    out = build_model(small_ckpt, "int8c", "stm32h7")
    fw = firmware.firmware_spec(load_target("stm32h7"))
    objs = sorted((out / "obj").glob("*.o"))
    objs = [o for o in objs if not o.stem.endswith("_qemu")]
    cfg = firmware.link_config(fw, out.name, fw.part)
    bound = firmware.stack_bound(cfg, objs)
    assert bound["forward"]["path"][0] == "colibri_forward" and bound["forward"]["bytes"] > 0
    assert bound["bytes"] <= fw.stack_bytes
    cfg["stack_bytes"] = bound["bytes"] - 8
    outs = [tmp_path / f"x{ext}" for ext in (".elf", ".map", ".bin", ".hex", ".size.json")]
    with pytest.raises(firmware.FirmwareError, match=rf"needs {bound['bytes']} bytes of stack .* reserves"):
        firmware.link_image(cfg, outs, objs + [out / f"{out.name}.ld"])
    assert not any(p.exists() for p in outs)


@pytest.mark.skipif(bool(_missing("stm32h7")), reason="arm-none-eabi toolchain or QEMU missing")
def test_budget_check_and_summary_are_colibri_size(small_ckpt, build_model, tmp_path, capsys):
    """The link step prints `colibri size`'s one line for the part; a budget the linked image
    exceeds (regions that fit) fails in one line naming it and the overflow, nothing left behind."""
    out = build_model(small_ckpt, "int8c", "stm32h7")
    fw = firmware.firmware_spec(load_target("stm32h7"))
    cfg = firmware.link_config(fw, out.name, fw.part)
    objs = [o for o in sorted((out / "obj").glob("*.o")) if not o.stem.endswith("_qemu")]
    sources = objs + [out / f"{out.name}.ld", out / "manifest.json"]
    outs = [tmp_path / f"x{ext}" for ext in (".elf", ".map", ".bin", ".hex", ".size.json")]

    assert firmware._link_action(outs, sources, {"COLIBRI_FW": json.dumps(cfg)}) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"colibri size: {summary_line(outs[0], 'stm32h7')} · stack bound ")
    report = json.loads(outs[4].read_text())
    flash, ram = report["regions"]["flash"]["bytes"], report["regions"]["ram"]["bytes"]
    assert report["budget"]["flash"]["used"] == flash and report["image_stack"]["reserved"] == fw.stack_bytes
    # the stack section reads the linked objects' call graphs only: not the QEMU twin's startup_qemu.ci beside
    # them in obj/ (which a parallel build may still be writing), so the report is the same whatever ran beside
    assert report["stack"]["notes"] == []
    linked_ci = {str(o.with_suffix(".ci")) for o in objs if o.with_suffix(".ci").is_file()}
    assert set(report["stack"]["inputs"]) <= linked_ci and any("startup.ci" in p for p in report["stack"]["inputs"])
    assert (out / "obj" / "startup_qemu.ci").is_file()

    for key, used in (("flash", flash), ("ram", ram)):
        tight = {**cfg, f"{key}_budget": used - 100}
        assert firmware._link_action(outs, sources, {"COLIBRI_FW": json.dumps(tight)}) == 1
        err = capsys.readouterr().err.strip()
        assert err == (f"colibri: stm32h7: model {out.name} does not fit: {key} overflowed by 100 bytes "
                       f"(budget {used - 100})")
        assert not any(p.exists() for p in outs)


@pytest.mark.skipif(bool(_missing("stm32h7")), reason="arm-none-eabi toolchain or QEMU missing")
def test_exit_status_passes_through(small_ckpt, build_model, tmp_path):
    """A corrupted weight byte: the on-target CRC check fails and QEMU exits with the demo's status 3."""
    out = build_model(small_ckpt, "int8c", "stm32h7")
    elf = tmp_path / "corrupt-qemu.elf"
    shutil.copy(out / f"{out.name}-qemu.elf", elf)
    with open(elf, "r+b") as f:
        sec = ELFFile(f).get_section_by_name(".rodata.model")
        at = sec["sh_offset"] + sec["sh_size"] - 100
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))
    res = _boot("stm32h7", elf)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "CRC-32 mismatch" in res.stdout


def test_runner_boots_the_qemu_twin_with_semihosting(tmp_path):
    (tmp_path / "m.elf").write_bytes(b"")
    argv = firmware.qemu_argv(load_target("stm32h7"), str(tmp_path / "m.elf"))
    assert argv[:3] == ["qemu-system-arm", "-M", "mps2-an500"]
    assert argv[-2:] == ["-kernel", str(tmp_path / "m.elf")]  # no twin: the image itself
    (tmp_path / "m-qemu.elf").write_bytes(b"")
    argv = firmware.qemu_argv(load_target("stm32h7"), str(tmp_path / "m.elf"))
    assert argv[-1] == str(tmp_path / "m-qemu.elf")
    assert "-semihosting-config" in argv and "-icount" in argv


@pytest.mark.parametrize("target", FW_TARGETS)
def test_one_template_two_maps(target):
    fw = firmware.firmware_spec(load_target(target))
    part = firmware.render_linker_script(fw, fw.part)
    qemu = firmware.render_linker_script(fw, fw.qemu_variant)
    for r in fw.part.regions:
        assert f"ORIGIN = 0x{r.origin:08X}, LENGTH = 0x{r.length:08X}" in part
    for r in fw.qemu_variant.regions:
        assert f"ORIGIN = 0x{r.origin:08X}, LENGTH = 0x{r.length:08X}" in qemu
    body = re.compile(r"SECTIONS\n\{.*\n\}", re.S)
    strip = re.compile(r"> (\w+)")  # the bodies differ only in which region a section goes to
    assert strip.sub(">", body.search(part).group(0)) == strip.sub(">", body.search(qemu).group(0))
    flash = sum(r.length for r in fw.part.regions if r.kind == "flash")
    assert flash == fw.flash_budget, "the part's flash regions are its flash budget"
    assert fw.stack_bytes > 0 and fw.ram_budget > 0
