"""`scons PARTITION=model`: an application image without weights and the model partition's images, the
application booted under QEMU once per partition image (`-device loader`): two models of its shape run
with their numpy references' tokens, a model of another shape, a corrupt and an erased partition are
refused with their status, cleanly (exit status 3, never a fault); a blob larger than its partition is
refused at build time naming both sizes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.reference import Reference
from colibri.toolchain import firmware
from colibri.toolchain.partition import app_firmware, partition_spec
from colibri.toolchain.targets import TargetError, load_target

from blobread import weights as blob_weights
from conftest import BIN, ROOT, output_dirs, require_target, synth
from targets_under_test import firmware as firmware_targets

# adder-sized or smaller: the application's shape, a second model of that shape, one of another shape
SHAPE = dict(layers=2, hidden=32, ffn=48, heads=4, kv_heads=2, experts=4, top_k=2, vocab=96)
MODELS = {"part_a": dict(SHAPE, seed=31), "part_a2": dict(SHAPE, seed=32), "part_b": dict(SHAPE, vocab=80, seed=33),
          # another shape whose arena is larger than part_a's: refused by a generic application too
          "part_c": dict(SHAPE, hidden=64, vocab=80, seed=34),
          # part_b's shape, every lm_head row a negative multiple of one vector: at the steps where all the logits
          # are negative, an argmax over more than the model's vocabulary would pick an unwritten entry
          "part_d": dict(SHAPE, vocab=80, seed=35)}
TARGETS = [t for t in firmware_targets() if "model" in load_target(t).partitions]
# FORMAT.md: the CRC covers bytes [12, blob_bytes); a byte in the middle of the weights
STATUS = {"crc": 5, "bad_magic": 2, "mismatch": 14, "arena_small": 12}


def test_partition_targets():
    assert {"stm32h7", "rv32imac"} <= set(TARGETS), TARGETS


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("partition")
    out = {name: synth(base / name, **kw) for name, kw in MODELS.items()}
    from safetensors.numpy import load_file, save_file

    f = out["part_d"] / "model.safetensors"
    w = load_file(f)
    u = w["lm_head.weight"][0]
    w["lm_head.weight"] = -np.outer(1.0 + np.arange(80) / 80.0, u).astype(np.float32)
    save_file(w, f)
    return out


def _qemu_address(target: str) -> int:
    """The partition's address in the QEMU map, from the target file itself: the same offset in the QEMU
    region of that name."""
    data = tomllib.loads((ROOT / "targets" / f"{target}.toml").read_text())
    p = data["partitions"]["model"]
    part = {r["name"]: r for r in data["memory"]}[p["region"]]
    qemu = {r["name"]: r for r in data.get("qemu_memory", data["memory"])}[p["region"]]
    return qemu["origin"] + p["origin"] - part["origin"]


def _model_h(out: Path) -> dict[str, str]:
    gen = next((out.parent.parent / "gen" / out.name.removesuffix("-generic")).glob("*-rows-pb32"))
    return dict(re.findall(r"^#define (COLIBRI_\w+) (.*?)\s*(?:/\*.*)?$", (gen / "model.h").read_text(), re.M))


def _boot(target: str, app: Path, image: Path) -> subprocess.CompletedProcess:
    argv = firmware.qemu_argv(load_target(target), str(app)) + [
        "-device", f"loader,file={image},addr=0x{_qemu_address(target):08X}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def _tokens(res: subprocess.CompletedProcess) -> list[int]:
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.stdout}\n{res.stderr}"
    line = res.stdout.splitlines()[0]
    assert line.startswith("tokens: "), res.stdout
    return [int(t) for t in line.removeprefix("tokens: ").split(",") if t]


def _reference(ckpt: Path, image: Path, app: Path) -> list[int]:
    """The numpy reference's greedy tokens of the partition's model (its weights as the blob holds them)
    on the application's built-in prompt and length."""
    h = _model_h(app)
    prompt = [int(t) for t in h["COLIBRI_DEFAULT_PROMPT"].strip("{} ").split(",")]
    n, max_seq = int(h["COLIBRI_DEFAULT_GENERATE"]), int(h["COLIBRI_MAX_SEQ"])
    return Reference(open_checkpoint(ckpt).spec, blob_weights(image), max_seq=max_seq).generate(prompt, n)


def _refused(res: subprocess.CompletedProcess, status: int) -> None:
    """One line with the runtime's message and status, exit status 3 (main.c: colibri error), no fault."""
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert res.returncode == 3, f"exit {res.returncode}:\n{res.stdout}\n{res.stderr}"
    assert len(lines) == 1 and lines[0].startswith("colibri_firmware: part_a: "), res.stdout
    assert lines[0].endswith(f"(status {status})"), lines[0]


@pytest.fixture(scope="module")
def built(ckpts, build_model):
    """{target: (the application's output directory, {model: its partition image})}: the application of
    part_a once per target, the partition images of every model (their exports shared by the targets)."""
    out = {}
    for t in TARGETS:
        require_target(t)
        app = build_model(ckpts["part_a"], "int8c", t, "PARTITION=model")
        images = {}
        for name in MODELS:
            d = build_model(ckpts[name], "int8c", t, "PARTITION=model", only=(f"{name}-model.bin",))
            images[name] = d / f"{name}-model.bin"
        out[t] = (app, images)
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_outputs(target, built):
    app, images = built[target]
    names = {p.name for p in app.iterdir()}
    assert {f"part_a-app.{e}" for e in ("elf", "bin", "hex", "map", "size.json")} <= names
    assert {"part_a-model.bin", "part_a-model.hex"} <= names
    assert "part_a.elf" not in names  # no image with the weights linked in
    # the model image's .hex starts at the partition's address in the part's map (an extended linear
    # address record, then the low 16 bits in the first data record)
    origin = tomllib.loads((ROOT / "targets" / f"{target}.toml").read_text())["partitions"]["model"]["origin"]
    rec = (app / "part_a-model.hex").read_text().splitlines()
    assert rec[0] == f":02000004{origin >> 16:04X}{(-(6 + (origin >> 24) + (origin >> 16 & 0xFF))) & 0xFF:02X}"
    assert rec[1][3:7] == f"{origin & 0xFFFF:04X}"
    assert images["part_a"].read_bytes() == (app / "part_a-model.bin").read_bytes()
    # the application holds no weights: its flash is far below the blob's size
    blob = images["part_a"].stat().st_size
    report = json.loads((app / "part_a-app.size.json").read_text())
    assert report["weights"] is None
    assert not any(s["name"] == ".rodata.model" for s in report["sections"])
    assert blob > 0


@pytest.mark.parametrize("target", TARGETS)
def test_compatible_models_run(target, ckpts, built):
    app, images = built[target]
    got = {}
    for name in ("part_a", "part_a2"):
        got[name] = _tokens(_boot(target, app / "part_a-app.elf", images[name]))
        assert got[name] == _reference(ckpts[name], images[name], app), f"{target} {name}: greedy tokens differ"
    assert got["part_a"] != got["part_a2"], "the two models should not give the same tokens"


@pytest.mark.parametrize("target", TARGETS[:1])  # one target: the application's code is the same C
def test_generic_application_runs_any_model_in_its_arena(target, ckpts, built, build_model):
    """GENERIC=1: dimensions from the blob; a model of another shape runs, one needing more arena than the
    application reserved (part_a's) is refused."""
    _, images = built[target]
    app = build_model(ckpts["part_a"], "int8c", target, "PARTITION=model", "GENERIC=1")
    assert app.name == "part_a-generic"
    elf = app / "part_a-generic-app.elf"
    for name in ("part_a", "part_b", "part_d"):
        want = _reference(ckpts[name], images[name], app)
        assert _tokens(_boot(target, elf, images[name])) == want, name
        if name == "part_d":  # the step the application must take over the blob's vocabulary, not model.h's
            assert 0 in want, want
    _refused(_boot(target, elf, images["part_c"]), STATUS["arena_small"])


@pytest.mark.parametrize("target", TARGETS)
def test_refused_partitions(target, built, tmp_path):
    app, images = built[target]
    elf = app / "part_a-app.elf"
    _refused(_boot(target, elf, images["part_b"]), STATUS["mismatch"])  # another model's shape
    blob = bytearray(images["part_a"].read_bytes())
    blob[len(blob) // 2] ^= 0x01
    flipped = tmp_path / "flipped.bin"
    flipped.write_bytes(bytes(blob))
    _refused(_boot(target, elf, flipped), STATUS["crc"])
    erased = tmp_path / "erased.bin"
    erased.write_bytes(b"\xff" * 4096)
    _refused(_boot(target, elf, erased), STATUS["bad_magic"])


def test_partition_smaller_than_blob_refused(ckpts, tmp_path):
    """Refused when the images are made, naming both sizes; nothing left behind."""
    require_target("stm32h7")
    targets = tmp_path / "targets"
    shutil.copytree(ROOT / "targets", targets)
    text = (targets / "stm32h7.toml").read_text()
    (targets / "stm32h7.toml").write_text(text.replace("length = 0x100000 # 1 MiB, bank 2", "length = 0x1000"))
    build = tmp_path / "build"
    env = {**os.environ, "COLIBRI_TARGETS_DIR": str(targets)}

    def run(*args: str) -> subprocess.CompletedProcess:
        argv = [str(BIN / "scons"), "-C", str(ROOT), "-Q", f"BUILD={build}", f"MODEL={ckpts['part_a']}",
                "TARGET=stm32h7", "PARTITION=model", *args]
        return subprocess.run(argv, capture_output=True, text=True, env=env)

    out = output_dirs(run(str(build / "models.json")))["stm32h7"]
    res = run(str(out / "part_a-model.hex"))
    assert res.returncode != 0
    blob = (next((build / "gen" / "part_a").glob("*-rows-pb32")) / "model.bin").stat().st_size
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("colibri:")]
    assert lines == [f"colibri: stm32h7: model part_a blob of {blob:,} B does not fit partition 'model' of 4,096 B "
                     "(targets/stm32h7.toml [partitions.model])"], res.stderr
    assert not list(out.glob("part_a-model.*"))


def _fw(target: str, **partition):
    t = load_target(target)
    return firmware.firmware_spec(t.__class__(**{**t.__dict__, "partitions": {"model": partition}}))


@pytest.mark.parametrize("partition, problem", [
    (dict(region="ITCM", origin=0x8000, length=0x1000), "'ITCM' is ram, not flash"),
    (dict(region="QSPI", origin=0x08100000, length=0x1000), "'QSPI': no such region"),
    (dict(region="FLASH", origin=0x081FF000, length=0x2000), "is not inside FLASH"),
    (dict(region="FLASH", origin=0x08000000, length=0x2000), "is not inside FLASH"),
    (dict(region="FLASH", origin=0x08100020, length=0x2000), "not 64-byte aligned"),
])
def test_bad_partition_named(partition, problem):
    fw = _fw("stm32h7", **partition)
    with pytest.raises(TargetError, match=re.escape(problem)) as e:
        partition_spec(fw)
    assert str(e.value).startswith("targets/stm32h7.toml: partitions.model")


def test_targets_check_names_a_bad_partition():
    from colibri.toolchain.target_check import check_target

    t = load_target("stm32h7")
    bad = t.__class__(**{**t.__dict__, "partitions": {"model": dict(region="DTCM", origin=0x20010000,
                                                                    length=0x1000)}})
    assert "targets/stm32h7.toml: partitions.model.region = 'DTCM' is ram, not flash" in check_target(bad)
    assert not [p for p in check_target(t) if "partitions" in p]


def test_app_region_ends_at_the_partition():
    fw = firmware.firmware_spec(load_target("stm32h7"))
    p = partition_spec(fw)
    app = app_firmware(fw, p)
    for v, origin in ((app.part, 0x08100000), (app.qemu_variant, _qemu_address("stm32h7"))):
        flash = {r.name: r for r in v.regions}["FLASH"]
        assert flash.origin + flash.length == origin


@pytest.mark.parametrize("args, line", [
    (("TARGET=stm32h7", "PARTITION=app"), "colibri: PARTITION=app: expected model"),
    (("TARGET=stm32h7", "GENERIC=1"), "colibri: GENERIC=1: only with PARTITION=model (a model linked in is the "
                                      "build's own)"),
    (("TARGET=x86_64", "PARTITION=model"), "colibri: PARTITION=model: target x86_64 is not a firmware target"),
    (("TARGET=cortex-m4", "PARTITION=model"), "colibri: targets/cortex-m4.toml: no [partitions.model] table "
                                              "(PARTITION=model needs its region, origin and length)"),
])
def test_bad_options_one_line(args, line, ckpts, tmp_path):
    res = subprocess.run([str(BIN / "scons"), "-C", str(ROOT), "-Q", f"BUILD={tmp_path}",
                          f"MODEL={ckpts['part_a']}", *args], capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    assert [ln for ln in res.stderr.splitlines() if ln.startswith("colibri:")] == [line], res.stderr
    assert "Traceback" not in res.stderr
