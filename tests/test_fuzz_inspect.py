"""`colibri inspect` on 500 mutated blobs: exit 0, 1 or 2, one line on error, never a traceback, a hang
or an allocation in proportion to a header field.

The blobs come from a fixed seed: header words set to 0, 1 or all ones, table entry fields likewise,
truncations, byte flips, each with the CRC left broken or made to match. They run in batches, each batch
one child process under a memory limit (RLIMIT_AS) and a timeout, calling the CLI's main() per blob with
and without --json; a few run through the installed `colibri` command as well.
"""

from __future__ import annotations

import json
import random
import resource
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from colibri.codegen import format as fmt
from colibri.codegen.export import ExportOptions, export

from conftest import BIN, synth

N_BLOBS = 500
BATCH = 125
MEMORY_LIMIT = 3 << 30  # address space of a batch child: numpy's import needs ~1 GiB of it
SECONDS_PER_RUN = 2.0
SEEDS = {
    "tiled": (dict(layers=1, hidden=32, ffn=32, heads=2, kv_heads=1, experts=2, top_k=2, vocab=20, seed=51,
                   heavy_tail=True), dict(quant="int8c", outlier_frac=0.05, max_seq=6)),
    "tied_f32": (dict(layers=2, hidden=16, ffn=16, heads=2, kv_heads=2, experts=3, top_k=1, vocab=24, seed=52,
                      tie=True), dict(quant="f32", max_seq=4)),
    "features": (dict(arch="qwen2_moe", layers=2, hidden=16, ffn=8, heads=2, kv_heads=1, experts=4, top_k=2,
                      vocab=24, seed=53, shared_ffn=16, dense_layers=[1], dense_ffn=16),
                 dict(quant="int8", max_seq=5)),
}

# One child: run inspect on each path given, print one JSON line per run.
CHILD = r"""
import contextlib, io, json, sys, time, traceback
from colibri.toolchain.cli import main
for path in sys.argv[1:]:
    for extra in ([], ["--json"]):
        out, err = io.StringIO(), io.StringIO()
        t0 = time.monotonic()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = main(["inspect", path, *extra])
        except SystemExit as e:
            rc = e.code
        except BaseException:
            rc, err = "traceback", io.StringIO(traceback.format_exc())
        print(json.dumps({"path": path, "json": bool(extra), "rc": rc, "stderr": err.getvalue(),
                          "stdout": out.getvalue() if extra else "", "seconds": time.monotonic() - t0}), flush=True)
"""


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _recrc(b: bytearray) -> None:
    if len(b) >= fmt.CRC_FROM:
        struct.pack_into("<I", b, fmt.H["crc32"].offset, zlib.crc32(bytes(b[fmt.CRC_FROM:])))


def _set(b: bytearray, off: int, size: int, value: int) -> None:
    if off + size <= len(b):
        b[off:off + size] = (value & ((1 << 8 * size) - 1)).to_bytes(size, "little")


def mutate(raw: bytes, rng: random.Random) -> bytes:
    b = bytearray(raw)
    n = struct.unpack_from("<I", raw, fmt.H["n_tensors"].offset)[0]
    how = rng.choice(("header", "header", "entry", "entry", "truncate", "flip"))
    value = rng.choice((0, 1, (1 << 64) - 1))
    if how == "header":
        f = rng.choice(fmt.HEADER)
        off = f.offset + (f.size // f.count) * rng.randrange(f.count)
        _set(b, off, f.size // f.count, value)
    elif how == "entry":
        f = rng.choice(fmt.ENTRY)
        _set(b, fmt.HEADER_BYTES + fmt.ENTRY_BYTES * rng.randrange(n) + f.offset, f.size, value)
    elif how == "truncate":
        b = b[:rng.choice((0, 4, 100, fmt.HEADER_BYTES - 1, fmt.HEADER_BYTES, rng.randrange(len(b))))]
    else:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    if rng.random() < 0.7:
        _recrc(b)
    return bytes(b)


@pytest.fixture(scope="module")
def blobs(tmp_path_factory) -> list[Path]:
    base = tmp_path_factory.mktemp("fuzz_inspect")
    seeds = []
    for name, (kw, opts) in SEEDS.items():
        export(synth(base / "ckpt" / name, **kw), base / "gen" / name,
               ExportOptions(prompt=[1], generate=1, predict=False, **opts))
        seeds.append((base / "gen" / name / "model.bin").read_bytes())
    rng = random.Random(20261201)
    paths = []
    # first the defect that started this: all-ones layer and expert counts, with a matching CRC
    for field in ("n_layers", "n_experts"):
        b = bytearray(seeds[0])
        _set(b, fmt.H[field].offset, 4, 0xFFFFFFFF)
        _recrc(b)
        paths.append(base / f"huge_{field}.bin")
        paths[-1].write_bytes(bytes(b))
    while len(paths) < N_BLOBS:
        paths.append(base / f"m{len(paths):03d}.bin")
        paths[-1].write_bytes(mutate(rng.choice(seeds), rng))
    return paths


def _check(run: dict) -> None:
    where = f"{run['path']}{' --json' if run['json'] else ''}"
    assert run["rc"] in (0, 1, 2), f"{where}: {run['rc']}\n{run['stderr']}"
    assert "Traceback" not in run["stderr"], f"{where}:\n{run['stderr']}"
    assert run["seconds"] < SECONDS_PER_RUN, f"{where}: {run['seconds']:.1f} s"
    if run["rc"] == 2:
        lines = run["stderr"].splitlines()
        assert len(lines) == 1 and lines[0].startswith("colibri: error: "), f"{where}:\n{run['stderr']}"
    elif run["json"]:
        json.loads(run["stdout"])


def test_inspect_mutated_blobs(blobs):
    runs = []
    for i in range(0, len(blobs), BATCH):
        res = subprocess.run([sys.executable, "-c", CHILD, *map(str, blobs[i:i + BATCH])], capture_output=True,
                             text=True, timeout=120, preexec_fn=_limit_memory,
                             env={"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
        assert res.returncode == 0, res.stderr[-3000:]
        runs += [json.loads(line) for line in res.stdout.splitlines()]
    assert len(runs) == 2 * len(blobs)
    for run in runs:
        _check(run)
    codes = {run["rc"] for run in runs}
    assert codes == {0, 1, 2}, codes  # the mutations reach every outcome
    huge = [run for run in runs if "huge_" in run["path"]]
    assert all(run["rc"] == 2 and "limit" in run["stderr"] for run in huge), huge


def test_inspect_command_on_huge_counts(blobs):
    """The installed command, as a user runs it: one line naming the blob and the field, exit 2."""
    for path in blobs[:2]:
        res = subprocess.run([str(BIN / "colibri"), "inspect", str(path)], capture_output=True, text=True,
                             timeout=60, preexec_fn=_limit_memory)
        field = path.stem.removeprefix("huge_")
        assert res.returncode == 2 and res.stdout == "", res.stderr
        assert res.stderr.count("\n") == 1 and str(path) in res.stderr and field in res.stderr, res.stderr
