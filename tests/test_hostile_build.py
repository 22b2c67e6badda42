"""The SCons build under hostile and careless input: no user string is evaluated or reaches a shell,
nothing stale is kept, concurrent builds wait for each other, outputs never overwrite each other's.

Checkpoints here are tiny (one layer, hidden 32): each host build takes seconds.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from colibri.codegen.inputs import export_inputs

from conftest import BIN, ROOT, output_dirs, require_target, scons, synth

TINY = dict(layers=1, hidden=32, ffn=32, heads=2, kv_heads=1, experts=2, top_k=1, vocab=32, seed=5)
# Substitution (evaluated by SCons as Python), a variable, spaces, both quotes, shell command substitution,
# and a comma (-Wl,/-Wa, split there).
HOSTILE = '${__import__("os").system("touch PWNED")} $x `touch PWNED` "q" \'$(touch PWNED)\' a;b,c'


def _pwned(*roots: Path) -> list[Path]:
    return [p for r in roots for p in r.rglob("PWNED") if p.is_file()] + \
           [p for p in (ROOT / "PWNED", Path.cwd() / "PWNED") if p.is_file()]


def _demo_tokens(argv: list[str]) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{argv}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return next(line for line in res.stdout.splitlines() if line.startswith("tokens: "))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A checkpoint, its build directory and cache all under a directory named HOSTILE; built for the
    host and the STM32H7 (when its toolchain is here)."""
    base = tmp_path_factory.mktemp("hostile") / HOSTILE
    ckpt = synth(base / "m$x", **TINY)
    targets = ["host"] + (["stm32h7"] if not require_target_missing("stm32h7") else [])
    res = scons(f"MODEL={ckpt}", f"TARGET={','.join(targets)}", f"CACHE={base / 'cache $y'}", build=base / "b")
    return ckpt, base, output_dirs(res), res


def require_target_missing(name: str) -> list[str]:
    from colibri.toolchain.targets import load_target

    return load_target(name).missing(run=True)


def test_hostile_paths_build_and_run(hostile):
    ckpt, base, outs, res = hostile
    assert not _pwned(base.parent), "a path was evaluated or ran through a shell"
    assert outs["host"] == base / "b" / "host" / "m_x"
    assert len([p for p in (base / "cache $y").rglob("*") if p.is_file()]) > 10, "CACHE= is the directory named"
    tokens = _demo_tokens([str(outs["host"] / "colibri_demo")])
    run = [str(outs["host"] / "colibri_run"), str(outs["host"] / "model.bin"), "--tokens", "3,17,21", "--generate", "8"]
    assert _demo_tokens(run) == _demo_tokens([str(outs["host"] / "colibri_demo"), "--tokens", "3,17,21",
                                              "--generate", "8"])
    # the recorded compile commands name the real paths (shell-quoted)
    db = json.loads((outs["host"] / "compile_commands.json").read_text())
    assert any(arg.startswith(f"-I{base}/b/gen/m_x/") for e in db for arg in shlex.split(e["command"]))
    assert scons(f"MODEL={ckpt}", "TARGET=host", "--question", f"CACHE={base / 'cache $y'}", build=base / "b",
                 check=False).returncode == 0, "a null build must do nothing"
    if "stm32h7" in outs:
        fw_db = json.loads((outs["stm32h7"] / "compile_commands.json").read_text())  # recorded like Linux ones
        assert {"forward.c", "model.c", "main.c", "model_blob.S"} <= {Path(e["file"]).name for e in fw_db}
        assert all(shlex.split(e["command"])[0] == "arm-none-eabi-gcc" for e in fw_db)
        boot = [str(BIN / "colibri"), "run", "--target", "stm32h7", str(outs["stm32h7"] / "m_x.elf")]
        assert _demo_tokens(boot) == tokens
    assert not _pwned(base.parent)


def _qemu_own_map_targets(tmp: Path) -> Path:
    """stm32h7.toml with the part's map moved to where mps2-an500 has memory, and no qemu_memory: the
    part's own image is QEMU-bootable (the build links its QEMU twin only for the SysTick scaling)."""
    text = (ROOT / "targets" / "stm32h7.toml").read_text()
    text = re.sub(r"\nqemu_memory = \[.*?\n\]\n", "\n", text, flags=re.S)
    text = text.replace("origin = 0x08000000", "origin = 0x00000000").replace("origin = 0x24000000",
                                                                            "origin = 0x20020000")
    text = re.sub(r'\[\[memory\]\]\nname = "(ITCM|SRAM123|SRAM4)".*?kind = "ram"\n', "", text, flags=re.S)
    assert "qemu_memory" not in text and "qemu_clock_hz" in text and "ITCM" not in text
    tdir = tmp / "targets"
    tdir.mkdir()
    (tdir / "mps2own.toml").write_text(text)
    return tdir


def test_firmware_whose_map_is_its_qemu_map(hostile, tmp_path):
    """qemu_clock_hz without qemu_memory: the QEMU twin has the part's map (was an IndexError in link_image)."""
    require_target("stm32h7")
    ckpt, _, outs, _ = hostile
    env = {**os.environ, "COLIBRI_TARGETS_DIR": str(_qemu_own_map_targets(tmp_path))}
    argv = [str(BIN / "scons"), "-C", str(ROOT), "-Q", "-j2", f"BUILD={tmp_path / 'b'}", f"MODEL={ckpt}",
            "TARGET=mps2own"]
    res = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    out = output_dirs(res)["mps2own"]
    assert (out / "m_x-qemu.elf").is_file() and (out / "m_x.size.json").is_file()
    # the twin is a QEMU image of the part's map, not a second part image with its own audit
    assert not [p.name for p in out.glob("m_x-qemu.*") if p.suffix in (".bin", ".hex", ".json")]
    assert "QEMU image: the part's own memory map" in (out / "m_x-qemu.ld").read_text()
    boot = subprocess.run([str(BIN / "colibri"), "run", "--target", "mps2own", str(out / "m_x.elf")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert boot.returncode == 0, boot.stdout + boot.stderr
    tokens = next(line for line in boot.stdout.splitlines() if line.startswith("tokens: "))
    assert tokens == _demo_tokens([str(outs["host"] / "colibri_demo")])


def _subdir_shards(ckpt: Path) -> list[Path]:
    """Move the shards into shards/ and point the index at them."""
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    (ckpt / "shards").mkdir()
    for shard in sorted(set(index["weight_map"].values())):
        (ckpt / shard).rename(ckpt / "shards" / shard)
    index["weight_map"] = {k: f"shards/{v}" for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    return sorted(ckpt / "shards" / p for p in set(v.split("/")[1] for v in index["weight_map"].values()))


def test_export_inputs_are_the_files_the_import_reads(tmp_path):
    ckpt = synth(tmp_path / "m", **TINY, shards=2)
    shards = _subdir_shards(ckpt)
    (ckpt / "colibri.json").write_text('{"generate": 3}')
    (ckpt / "tokenizer.json").write_text("{}")
    (ckpt / "unrelated.safetensors").write_bytes(b"")  # not in the weight map: not read, not a source
    calib = tmp_path / "calib.txt"
    calib.write_text("1 2 3\n")
    got = export_inputs(ckpt, calib)
    want = [ckpt / "config.json", ckpt / "model.safetensors.index.json", *shards, ckpt / "colibri.json",
            ckpt / "tokenizer.json", calib]
    assert sorted(got) == sorted(want) and len(got) == len(want)


def test_changed_shard_in_a_subdirectory_rebuilds_the_blob(tmp_path):
    ckpt = synth(tmp_path / "m", **TINY, shards=2)
    shards = _subdir_shards(ckpt)
    other = synth(tmp_path / "other", **{**TINY, "seed": 6}, shards=2)  # same tensors per shard, other values
    build = tmp_path / "b"
    blob = build / "gen" / "m" / "int8c" / "model.bin"
    scons(f"MODEL={ckpt}", str(blob), build=build)
    before = blob.read_bytes()
    shutil.copyfile(other / shards[-1].name, shards[-1])
    assert scons(f"MODEL={ckpt}", str(blob), "--question", build=build, check=False).returncode != 0
    scons(f"MODEL={ckpt}", str(blob), build=build)
    assert blob.read_bytes() != before, "the blob was not rebuilt from the changed shard"


def _hold(lock: Path):
    f = open(lock, "a+")  # noqa: SIM115 - closed by the caller
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def _wait_for(pred, what: str, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_concurrent_builds_of_one_model_wait_for_each_other(tmp_path):
    """Two builds at once in one build directory: the second waits (one line) instead of compiling
    against an export the first is replacing. The test holds the lock so both are seen waiting. The lock is
    the whole run's, whatever it builds: the blob alone (the export, no compile) shows it."""
    ckpt = synth(tmp_path / "m", **TINY)
    build = tmp_path / "b"
    build.mkdir()
    blob = build / "gen" / "m" / "int8c" / "model.bin"
    lock = _hold(build / ".colibri.lock")
    logs = [tmp_path / f"scons{i}.log" for i in range(2)]
    procs = []
    try:
        for log in logs:
            with open(log, "w") as f:
                procs.append(subprocess.Popen(
                    [str(BIN / "scons"), "-C", str(ROOT), "-Q", "-j2", f"BUILD={build}", f"MODEL={ckpt}", str(blob)],
                    stdout=f, stderr=subprocess.STDOUT, text=True))
        for log in logs:
            _wait_for(lambda log=log: "colibri: waiting for another build" in log.read_text(), f"{log.name} to wait")
        assert all(p.poll() is None for p in procs), "a build did not wait for the lock"
    finally:
        lock.close()
        for p in procs:
            p.wait(timeout=600)
    texts = [log.read_text() for log in logs]
    assert [p.returncode for p in procs] == [0, 0], texts
    assert all(t.count("colibri: waiting for") == 1 for t in texts)
    exports = [t.count("EXPORT m ") for t in texts]
    assert sorted(exports) == [0, 1], f"the model must be exported once: {texts}"
    assert blob.is_file()


def test_colliding_names_and_options_get_their_own_outputs(tmp_path):
    """a-b, a_b, `a b` (one C name) and runs/x/final, runs/y/final: each its own directory, the first
    keeping the plain name; other export options too. Nothing is replaced."""
    ckpts = [synth(tmp_path / n, **{**TINY, "seed": i}) for i, n in
             enumerate(["a-b", "a_b", "a b", "runs/x/final", "runs/y/final"])]
    build = tmp_path / "b"
    outs = []
    for ckpt in ckpts:
        res = scons(f"MODEL={ckpt}", "-n", build=build)  # reading the build names the outputs
        outs.append(output_dirs(res)["host"])
    assert len(set(outs)) == len(outs), outs
    assert outs[0] == build / "host" / "a_b" and outs[3] == build / "host" / "final"
    assert all(o.parent == build / "host" and re.fullmatch(r"(a_b|final)_[0-9a-f]{8}", o.name)
               for o in (outs[1], outs[2], outs[4])), outs
    registry = json.loads((build / "models.json").read_text())
    assert {registry[o.name] for o in outs} == {str(c.resolve()) for c in ckpts}
    again = output_dirs(scons(f"MODEL={ckpts[4]}", "-n", build=build))["host"]
    assert again == outs[4], "a checkpoint keeps its name in a build directory"

    # two of them built for real: both blobs stay, each its own checkpoint's
    for ckpt, out in ((ckpts[3], outs[3]), (ckpts[4], outs[4])):
        scons(f"MODEL={ckpt}", str(out / "model.bin"), build=build)
    a, b = (outs[3] / "model.bin").read_bytes(), (outs[4] / "model.bin").read_bytes()
    assert a != b and (outs[3] / "model.bin").read_bytes() == a

    variants = {}
    for args in ((), ("QUANT=f32",), ("QUANT=int8c", "GROUP_SIZE=16"), ("OUTLIER_FRAC=0.005",)):
        variants[args] = output_dirs(scons(f"MODEL={ckpts[0]}", *args, "-n", build=build))["host"]
    assert variants[()] == variants[("OUTLIER_FRAC=0.005",)] == build / "host" / "a_b"  # the default, spelt out
    assert variants[("QUANT=f32",)] == build / "host" / "a_b-f32"
    assert re.fullmatch(r"a_b-int8c-[0-9a-f]{8}", variants[("QUANT=int8c", "GROUP_SIZE=16")].name)


def test_broken_registry_is_one_line(tmp_path):
    ckpt = synth(tmp_path / "m", **TINY)
    build = tmp_path / "b"
    build.mkdir()
    (build / "models.json").write_text("[1, 2")
    res = scons(f"MODEL={ckpt}", "-n", build=build, check=False)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1 and "models.json" in lines[0], res.stderr


def test_unusable_build_directory_is_one_line(tmp_path):
    ckpt = synth(tmp_path / "m", **TINY)
    (tmp_path / "file").write_text("")
    res = scons(f"MODEL={ckpt}", "-n", build=tmp_path / "file" / "b", check=False)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1 and "cannot build there" in lines[0], res.stderr
