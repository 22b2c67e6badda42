"""Memory regions of every kind: a model bigger than internal flash with its weights in memory-mapped QSPI
flash and its KV cache in SDRAM (targets/stm32h7-qspi.toml), the arena split across memories by class
(colibri_init_regions), the size audit per region, and the target files that place a class where it
cannot live."""

from __future__ import annotations

import ctypes
import json
import re
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from test_firmware import _boot, _expected_tokens, _run_output

from colibri.codegen import format as fmt
from colibri.toolchain.targets import load_target

from cbuild import RUNTIME_SRC, compile_c
from conftest import BIN, ROOT, output_dirs, require_target, scons, synth

QSPI = "stm32h7-qspi"
# About 5 MB of int8c weights: more than the 2 MiB of internal flash, well within the 8 MiB of QSPI.
BIG = dict(layers=4, hidden=256, ffn=128, heads=8, kv_heads=2, experts=8, top_k=2, vocab=2048, seed=5)
BIG_RUN = {"prompt": [3, 17, 42], "generate": 8}
TINY = dict(layers=2, hidden=32, ffn=32, heads=4, kv_heads=2, experts=4, top_k=2, vocab=40, seed=7)
TINY_MAX_SEQ = 24
OK, E_NULL, E_ARENA_ALIGN, E_ARENA_SMALL, E_BAD_PLAN, E_ARG = 0, 1, 11, 12, 13, 18
KV, ACT, SCRATCH = 0, 1, 2  # colibri_class


def _region(target: str, name: str) -> tuple[int, int]:
    """(origin, length) of a region of the part's map, from the target file itself."""
    r = next(r for r in load_target(target).memory if r["name"] == name)
    return r["origin"], r["length"]


def _readelf_sections(elf: Path, target: str) -> dict[str, tuple[int, int]]:
    """{section: (address, size)} as the target's binutils' readelf -S prints them."""
    readelf = load_target(target).tool("readelf")
    out = subprocess.run([readelf, "-S", "-W", str(elf)], capture_output=True, text=True, check=True).stdout
    rows = re.findall(r"^\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]{8})\s+[0-9a-f]+\s+([0-9a-f]+)", out, re.M)
    return {name: (int(addr, 16), int(size, 16)) for name, addr, size in rows}


# --- the QSPI model: one export and build for the session ----------------------------------------


@pytest.fixture(scope="module")
def big_ckpt(tmp_path_factory) -> Path:
    ckpt = synth(tmp_path_factory.mktemp("qspi") / "qspi_model", **BIG)
    (ckpt / "colibri.json").write_text(json.dumps(BIG_RUN))
    return ckpt


@pytest.fixture(scope="module")
def qspi_build(big_ckpt, build_model) -> Path:
    require_target(QSPI)
    return build_model(big_ckpt, "int8c", QSPI)


def test_qspi_model_boots_with_the_reference_tokens(big_ckpt, qspi_build):
    out = qspi_build
    blob = next((out.parent.parent / "gen" / out.name).glob("int8c*/model.bin")).stat().st_size
    assert 3 * 2**20 <= blob <= 6 * 2**20 and blob > _region(QSPI, "FLASH")[1], blob  # cannot fit internal flash
    res = _boot(QSPI, out / f"{out.name}.elf")
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.stdout}\n{res.stderr}"
    tokens, _, _, _ = _run_output(res)
    assert len(tokens) == BIG_RUN["generate"]
    assert tokens == _expected_tokens(big_ckpt, out, "int8c")


def test_size_reports_weights_in_qspi_and_kv_in_sdram_as_readelf_does(qspi_build):
    out = qspi_build
    elf = out / f"{out.name}.elf"
    res = subprocess.run([str(BIN / "colibri"), "size", "--json", str(elf)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    memory = {m["name"]: m for m in json.loads(res.stdout)["memory"]}
    sections = _readelf_sections(elf, QSPI)
    for region, kind, cls, section in (("QSPI", "xip-flash", "model", ".rodata.model"),
                                       ("SDRAM", "ext-ram", "kv_cache", ".bss.colibri_kv"),
                                       ("AXI_SRAM", "ram", "activations", ".bss.colibri_arena"),
                                       ("AXI_SRAM", "ram", "scratch", ".bss.colibri_scratch")):
        origin, length = _region(QSPI, region)
        addr, size = sections[section]
        assert origin <= addr and addr + size <= origin + length, f"{section} at {addr:#x} is not in {region}"
        row = memory[region]
        assert row["region_kind"] == kind
        assert row["classes"].get(cls) == size, (region, row["classes"])
        # nothing else claims the class: each class is in the one region the target places it in
        assert all(cls not in m["classes"] for name, m in memory.items() if name != region), cls
    assert memory["QSPI"]["used"] == sections[".rodata.model"][1]
    assert memory["SDRAM"]["used"] == sections[".bss.colibri_kv"][1]
    # the QEMU twin: the same sections in mps2-an500's RAM at 0x60000000
    twin = _readelf_sections(out / f"{out.name}-qemu.elf", QSPI)
    qemu = {r["name"]: r for r in load_target(QSPI).qemu_memory}
    for region, section in (("QSPI", ".rodata.model"), ("SDRAM", ".bss.colibri_kv")):
        assert twin[section][0] == qemu[region]["origin"] and twin[section][1] == sections[section][1]


def test_a_model_too_big_for_a_region_names_the_region_and_the_class(big_ckpt, tmp_path):
    """The QSPI model on the plain stm32h7: its weights overflow the internal flash and its KV cache the
    AXI SRAM, and the line says which class overflowed which region."""
    require_target("stm32h7")
    res = scons(f"MODEL={big_ckpt}", "QUANT=int8c", "TARGET=stm32h7", build=tmp_path / "build", check=False)
    assert res.returncode != 0
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if "overflow" in ln]
    assert len(lines) == 1, lines
    # nor does its KV cache fit the 512 KiB of AXI SRAM beside the activations and scratch
    m = re.fullmatch(r"colibri: stm32h7: model qspi_model does not fit: FLASH overflowed by (\d+) bytes "
                     r"\(region 2097152 bytes, flash budget 2097152\): model \(\.rodata\.model\); "
                     r"AXI_SRAM overflowed by (\d+) bytes \(region 524288 bytes, ram budget 1048576\): "
                     r"kv_cache \(\.bss\.colibri_kv\)", lines[0])
    assert m, lines[0]
    blob = next((out_gen := tmp_path / "build" / "gen" / "qspi_model").glob("int8c*/model.bin")).stat().st_size
    assert 0 < blob - 2097152 < int(m.group(1)) < blob - 2097152 + 64 * 1024  # weights + code - flash
    h = next(out_gen.glob("int8c*/model.h")).read_text()
    arena = int(re.search(r"#define COLIBRI_ARENA_SIZE (\d+)u", h).group(1))
    assert int(m.group(2)) == arena - 524288
    out = output_dirs(res)["stm32h7"]
    assert not list(out.glob("*.elf"))


# --- target files that place a class where it cannot live ----------------------------------------


def test_max_seq_auto_fills_each_memory_its_classes_are_placed_in(big_ckpt, tmp_path):
    """MAX_SEQ=auto on stm32h7-qspi: the KV cache in SDRAM and the activations and scratch in AXI SRAM each
    within their own region, and one more position overflows one of them (not: the whole arena within the
    arena's region, which would leave the 8 MiB SDRAM almost empty). `scons -n`: the choice is made and
    printed before anything is built."""
    from colibri.codegen.checkpoint import open_checkpoint
    from colibri.codegen.plan import plan_arena

    require_target(QSPI)
    res = scons(f"MODEL={big_ckpt}", f"TARGET={QSPI}", "MAX_SEQ=auto", "-n", build=tmp_path / "b")
    lines = [line for line in res.stdout.splitlines() if line.startswith(f"MAX_SEQ=auto for {QSPI}: ")]
    (n,) = {int(re.search(r"max_seq (\d+),", line).group(1)) for line in lines}
    assert any("SDRAM" in line and "kv_cache" in line for line in lines), lines
    kv_room, act_room = _region(QSPI, "SDRAM")[1], _region(QSPI, "AXI_SRAM")[1]

    def fits(max_seq: int) -> bool:
        plan = plan_arena(open_checkpoint(big_ckpt).spec, max_seq, None, True, 32, "f32").to_json()["classes"]
        return (plan["kv_cache"]["bytes"] <= kv_room
                and plan["activations"]["bytes"] + plan["scratch"]["bytes"] <= act_room)

    assert fits(n) and not fits(n + 1), n
    assert n * 2 * BIG["layers"] * BIG["kv_heads"] * (BIG["hidden"] // BIG["heads"]) * 4 > kv_room // 2, (
        "the KV cache should fill most of the SDRAM")


def _edit_qspi(tmp_path: Path, old: str, new: str) -> Path:
    text = (ROOT / "targets" / f"{QSPI}.toml").read_text()
    edited, n = re.subn(old, new, text, flags=re.M)
    assert n == 1, old
    d = tmp_path / "targets"
    d.mkdir()
    (d / "board.toml").write_text(edited)
    return d


def _colibri(*args: str, targets_dir: Path) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([str(BIN / "colibri"), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLIBRI_TARGETS_DIR": str(targets_dir)})


@pytest.mark.parametrize("old, new, says", [
    (r'^kv_cache = "SDRAM"', 'kv_cache = "HYPERRAM"', r"placement kv_cache = 'HYPERRAM': no such region"),
    (r'^model = "QSPI"', 'model = "SDRAM"',
     r"placement model = 'SDRAM' is ext-ram, not flash or xip-flash \(the weights are read in place and the "
     r"startup does not copy them into RAM\)"),
    (r'^kv_cache = "SDRAM"', 'kv_cache = "QSPI"', r"placement kv_cache = 'QSPI' is xip-flash, not ram or ext-ram"),
    (r'^activations = "AXI_SRAM"', 'activations = "FLASH"',
     r"placement activations = 'FLASH' is flash, not ram or ext-ram"),
    (r'^stack = "DTCM"', 'stack = "SDRAM"', r"placement stack = 'SDRAM' is ext-ram, not ram \(boot code uses it"),
    (r'^vectors = "FLASH"', 'vectors = "QSPI"', r"placement vectors = 'QSPI' is xip-flash, not flash or ram"),
    (r'^kind = "ext-ram"', 'kind = "psram"', r"memory\[7\]\.kind = 'psram': use one of 'flash', 'xip-flash', "),
])
def test_a_class_placed_where_it_cannot_live_is_one_line_naming_the_file_and_key(old, new, says, tmp_path):
    d = _edit_qspi(tmp_path, old, new)
    res = _colibri("targets", "--check", targets_dir=d)
    assert res.returncode == 2, res.stderr
    errors = res.stderr.splitlines()
    assert len(errors) == 1 and re.match(r"colibri: (\S*/)?targets/board\.toml: ", errors[0]), res.stderr
    assert re.search(says, errors[0]), errors[0]
    assert "Traceback" not in res.stderr


def test_a_build_for_a_misplaced_class_stops_before_writing(tmp_path):
    d = _edit_qspi(tmp_path, r'^scratch = "AXI_SRAM"', 'scratch = "NOWHERE"')
    build = tmp_path / "build"
    argv = [str(BIN / "scons"), "-C", str(ROOT), "-Q", f"BUILD={build}", "TARGET=board"]
    import os

    res = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "COLIBRI_TARGETS_DIR": str(d)})
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == ["colibri: targets/board.toml: part placement scratch = 'NOWHERE': no such region"], res.stderr
    assert not list(build.glob("board/*/*.elf"))


def test_existing_targets_keep_one_arena_region():
    """A target that names no class places all three where its arena is (every file before regions)."""
    from colibri.toolchain.firmware import firmware_spec

    fw = firmware_spec(load_target("stm32h7"))
    assert {fw.part.place[k] for k in ("kv_cache", "activations", "scratch")} == {"AXI_SRAM"}
    assert fw.qemu_variant.place["kv_cache"] == fw.qemu_variant.place["arena"]


# --- the ABI: colibri_init_regions on the generic runtime -----------------------------------------


class Region(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _aligned(nbytes: int, offset: int = 0) -> tuple[np.ndarray, int]:
    """A zeroed buffer and a 64-byte aligned address in it (plus offset)."""
    raw = np.zeros(nbytes + 128, np.uint8)
    addr = raw.ctypes.data
    return raw, addr + (-addr % 64) + offset


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """The generic runtime as a shared library, and a tiny int8c export (integer matmuls: xq in scratch)."""
    d = tmp_path_factory.mktemp("regions")
    so = compile_c(d / "libcolibri_test.so", RUNTIME_SRC, ["-shared", "-fPIC", "-DCOLIBRI_BUILDING"])
    lib = ctypes.CDLL(str(so))
    ckpt = synth(d / "tiny", **TINY)
    subprocess.run([str(BIN / "colibri"), "export", str(ckpt), "-o", str(d / "gen"), "--quant", "int8c",
                    "--max-seq", str(TINY_MAX_SEQ)], check=True, capture_output=True)
    return lib, (d / "gen" / "model.bin").read_bytes(), (d / "gen" / "model.h").read_text(), d / "gen"


def _blob(raw: bytes) -> tuple[np.ndarray, int]:
    buf, addr = _aligned(len(raw))
    ctypes.memmove(addr, raw, len(raw))
    return buf, addr


def _init_regions(lib, blob: bytes, lens: list[int], shift: tuple[int, int, int] = (0, 0, 0), n: int = 3):
    keep, baddr = _blob(blob)
    regions = (Region * 3)()
    for c in range(3):
        buf, addr = _aligned(lens[c], shift[c])
        keep = (keep, buf)
        regions[c] = Region(addr, lens[c])
    ctx = ctypes.c_void_p()
    st = lib.colibri_init_regions(ctypes.byref(ctx), regions, ctypes.c_size_t(n), ctypes.c_void_p(baddr),
                                  ctypes.c_size_t(len(blob)))
    return st, ctx, keep, regions


def _logits(lib, ctx, tokens: list[int], vocab: int) -> np.ndarray:
    out = np.zeros(vocab, np.float32)
    toks = (ctypes.c_int32 * len(tokens))(*tokens)
    st = lib.colibri_forward(ctx, toks, ctypes.c_size_t(len(tokens)), out.ctypes.data_as(ctypes.c_void_p),
                             ctypes.c_size_t(vocab))
    assert st == OK, st
    return out


def test_region_bytes_are_model_h_and_the_kv_cache_is_what_the_shape_says(runtime):
    lib, blob, model_h, _ = runtime
    _, baddr = keep = _blob(blob)
    need = (ctypes.c_size_t * 3)()
    assert lib.colibri_region_bytes(ctypes.c_void_p(baddr), ctypes.c_size_t(len(blob)), need, ctypes.c_size_t(3)) == OK
    h = dict(re.findall(r"^#define (COLIBRI_\w+) (\d+)u", model_h, re.M))
    assert list(need) == [int(h["COLIBRI_KV_BYTES"]), int(h["COLIBRI_ACT_BYTES"]), int(h["COLIBRI_SCRATCH_BYTES"])]
    head_dim = TINY["hidden"] // TINY["heads"]
    kv = 2 * TINY["layers"] * TINY_MAX_SEQ * TINY["kv_heads"] * head_dim * 4  # f32 keys and values
    assert need[KV] == -(-kv // 64) * 64
    assert sum(need) == int(h["COLIBRI_ARENA_SIZE"])  # the classes side by side are the one arena
    assert lib.colibri_region_bytes(ctypes.c_void_p(baddr), ctypes.c_size_t(len(blob)), need, ctypes.c_size_t(2)) \
        == E_ARG
    del keep


def test_regions_compute_what_one_arena_computes(runtime):
    lib, blob, _, _ = runtime
    need = (ctypes.c_size_t * 3)()
    _, baddr = keep = _blob(blob)
    assert lib.colibri_region_bytes(ctypes.c_void_p(baddr), ctypes.c_size_t(len(blob)), need, ctypes.c_size_t(3)) == OK
    arena_bytes = ctypes.c_size_t()
    assert lib.colibri_arena_bytes(ctypes.c_void_p(baddr), ctypes.c_size_t(len(blob)), ctypes.byref(arena_bytes)) == OK
    _, aaddr = arena = _aligned(arena_bytes.value)
    one = ctypes.c_void_p()
    assert lib.colibri_init(ctypes.byref(one), ctypes.c_void_p(aaddr), arena_bytes, ctypes.c_void_p(baddr),
                            ctypes.c_size_t(len(blob))) == OK
    st, split, held, _ = _init_regions(lib, blob, list(need))
    assert st == OK
    prompt = [1, 5, 9, 2]
    a, b = _logits(lib, one, prompt, TINY["vocab"]), _logits(lib, split, prompt, TINY["vocab"])
    assert np.array_equal(a, b)
    for t in (int(a.argmax()), 7, 3):  # decode steps: the KV cache in its own region
        a, b = _logits(lib, one, [t], TINY["vocab"]), _logits(lib, split, [t], TINY["vocab"])
        assert np.array_equal(a, b)
    del keep, arena, held


def test_init_regions_refuses_each_bad_region_with_its_code(runtime):
    lib, blob, _, _ = runtime
    need = (ctypes.c_size_t * 3)()
    _, baddr = keep = _blob(blob)
    assert lib.colibri_region_bytes(ctypes.c_void_p(baddr), ctypes.c_size_t(len(blob)), need, ctypes.c_size_t(3)) == OK
    lens = list(need)
    for cls in (KV, ACT, SCRATCH):
        short = lens.copy()
        short[cls] -= 1
        assert _init_regions(lib, blob, short)[0] == E_ARENA_SMALL, cls
        shift = [0, 0, 0]
        shift[cls] = 8
        assert _init_regions(lib, blob, [n + 8 for n in lens], tuple(shift))[0] == E_ARENA_ALIGN, cls
    assert _init_regions(lib, blob, lens, n=2)[0] == E_ARG
    st, ctx, held, regions = _init_regions(lib, blob, lens)
    assert st == OK
    regions[SCRATCH] = Region(regions[ACT].ptr, lens[SCRATCH])  # two classes in one place
    again = ctypes.c_void_p()
    assert lib.colibri_init_regions(ctypes.byref(again), regions, ctypes.c_size_t(3), ctypes.c_void_p(baddr),
                                    ctypes.c_size_t(len(blob))) == E_ARG
    regions[SCRATCH] = Region(None, lens[SCRATCH])
    assert lib.colibri_init_regions(ctypes.byref(again), regions, ctypes.c_size_t(3), ctypes.c_void_p(baddr),
                                    ctypes.c_size_t(len(blob))) == E_NULL
    assert again.value is None
    del keep, held


def test_init_regions_refuses_a_plan_whose_classes_interleave(runtime):
    """The scores (scratch) moved onto the gate buffer (activations, never live with them): a valid plan
    for one arena, which colibri_init takes, but no class range of its own for colibri_init_regions."""
    lib, blob, _, gen = runtime
    b = bytearray(blob)
    field = next(f for f in fmt.HEADER if f.name == "buffer_offset").offset
    names = [buf.name for buf in fmt.BUFFERS]
    plan = {p["name"]: p for p in json.loads((gen / "manifest.json").read_text())["arena"]["buffers"]}
    scores = plan["scores"]

    def free_at_step_3(off: int) -> bool:
        return all(off + scores["bytes"] <= p["offset"] or p["offset"] + p["bytes"] <= off for p in plan.values()
                   if p["name"] != "scores" and p["live_steps"][0] <= 3 <= p["live_steps"][1])

    # an offset inside the activations' range (below the KV cache), free of everything live with the scores
    kv_start = min(plan["key_cache"]["offset"], plan["value_cache"]["offset"])
    spot = next(p["offset"] for p in sorted(plan.values(), key=lambda p: p["offset"])
                if p["offset"] + scores["bytes"] <= kv_start and free_at_step_3(p["offset"]))
    struct.pack_into("<Q", b, field + 8 * names.index("scores"), spot)
    struct.pack_into("<I", b, 8, zlib.crc32(bytes(b[12:])))
    moved = bytes(b)
    arena_bytes = ctypes.c_size_t()
    _, baddr = keep = _blob(moved)
    assert lib.colibri_arena_bytes(ctypes.c_void_p(baddr), ctypes.c_size_t(len(moved)), ctypes.byref(arena_bytes)) \
        == OK
    _, aaddr = arena = _aligned(arena_bytes.value)
    ctx = ctypes.c_void_p()
    assert lib.colibri_init(ctypes.byref(ctx), ctypes.c_void_p(aaddr), arena_bytes, ctypes.c_void_p(baddr),
                            ctypes.c_size_t(len(moved))) == OK
    need = (ctypes.c_size_t * 3)()
    assert lib.colibri_region_bytes(ctypes.c_void_p(baddr), ctypes.c_size_t(len(moved)), need, ctypes.c_size_t(3)) \
        == E_BAD_PLAN
    assert _init_regions(lib, moved, [arena_bytes.value] * 3)[0] == E_BAD_PLAN
    del keep, arena
