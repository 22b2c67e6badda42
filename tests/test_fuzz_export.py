"""The exporter on 500 randomly mutated checkpoints (fixed seed): config.json values, index maps, safetensors
headers and lengths, file kinds. Each run is a forked `colibri export` (the CLI's main, imports done once)
under a time limit (SIGALRM) and a memory limit (RLIMIT_AS). Every run must end with exit 0 or 2, a single
error line and no traceback, and leave every file outside its output path as it was."""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import shutil
import signal
import stat
import sys
from pathlib import Path

import pytest

from conftest import synth

N_CASES = 500
SEED = 20261201
CASE_SECONDS = 20  # per run; a run that hangs is killed and fails the test
CASE_MEMORY = 1 << 30  # address space a run may add to what the forked process already maps
TINY = dict(layers=1, hidden=16, ffn=24, heads=2, kv_heads=1, experts=3, top_k=2, vocab=32, seed=3, shards=2)
BASES = {"mixtral": dict(TINY), "qwen2_moe": dict(TINY, arch="qwen2_moe"),
         "deepseek": dict(TINY, arch="deepseek", layers=2, dense_layers=(0,))}
INDEX = "model.safetensors.index.json"

VALUES = [None, True, False, 0, -1, 1, 2, 3, 7, 16, 2**31, 2**32, 2**63, 2**64, 10**30, -(10**30), 1.5, -0.0, 1e-5,
          1e308, float("inf"), float("nan"), "", "x", "silu", "default", [], [0], [1, 2], [True], {},
          {"rope_type": "x"}, {"rope_theta": -1}, "9" * 5000]


def tree(path: Path) -> dict[str, object]:
    """Every entry under path (links not followed, FIFOs not opened) -> kind and content hash."""
    out: dict[str, object] = {}
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            p = Path(root) / n
            st = os.lstat(p)
            key = str(p.relative_to(path))
            if stat.S_ISREG(st.st_mode):
                out[key] = hashlib.sha256(p.read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                out[key] = ("link", os.readlink(p))
            else:
                out[key] = stat.S_IFMT(st.st_mode)
    return out


# ---- mutations: each takes the checkpoint directory and a Random ----

def _read(p: Path) -> bytes:
    """A file's bytes; an earlier mutation may have made it a FIFO or a link: then the mutation skips."""
    if not stat.S_ISREG(os.lstat(p).st_mode):
        raise OSError(f"{p} is no longer a regular file")
    return p.read_bytes()


def _put(p: Path, data: bytes | str) -> None:
    """Write a file whatever is there now (a FIFO would block the writer, a link would write elsewhere)."""
    if os.path.lexists(p) and not stat.S_ISREG(os.lstat(p).st_mode):
        shutil.rmtree(p) if stat.S_ISDIR(os.lstat(p).st_mode) else p.unlink()
    p.write_bytes(data.encode() if isinstance(data, str) else data)


def _json(p: Path):
    return json.loads(_read(p))


def _shards(ck: Path) -> list[Path]:
    return sorted(ck.glob("*.safetensors"))


def mut_config_value(ck, r):
    cfg = _json(ck / "config.json")
    key = r.choice(sorted(cfg) + ["head_dim", "rope_parameters", "rope_scaling", "sliding_window", "num_experts",
                                  "num_local_experts", "n_routed_experts", "mlp_only_layers", "kv_lora_rank"])
    cfg[key] = r.choice(VALUES)
    _put(ck / "config.json", json.dumps(cfg))


def mut_config_delete(ck, r):
    cfg = _json(ck / "config.json")
    del cfg[r.choice(sorted(cfg))]
    _put(ck / "config.json", json.dumps(cfg))


def mut_config_scale(ck, r):
    """A dimension changed to a plausible but wrong number (the tensors then disagree)."""
    cfg = _json(ck / "config.json")
    key = r.choice([k for k, v in sorted(cfg.items()) if isinstance(v, int) and not isinstance(v, bool)])
    cfg[key] = r.choice([cfg[key] * 2, cfg[key] + 1, max(cfg[key] - 1, 0), 60000, 65536, 4294967296])
    _put(ck / "config.json", json.dumps(cfg))


def mut_config_bytes(ck, r):
    data = _read(ck / "config.json")
    _put(ck / "config.json", r.choice([
        data[: r.randrange(len(data))], b"[" * 100_000, b"{" * 70 + b"}" * 70, b"null", b"[]", b"\xff\xfe",
        b'{"a": 1, "a": 2}', bytes(r.randrange(256) for _ in range(64)), b"",
    ]))


def mut_index(ck, r):
    idx = _json(ck / INDEX)
    wm = idx["weight_map"]
    name = r.choice(sorted(wm))
    choice = r.randrange(8)
    if choice == 0:
        wm[name] = r.choice(["../x.safetensors", "/etc/passwd", "", "nope.safetensors", "sub/a.safetensors",
                             "model.safetensors.index.json", "config.json", ".", "a\u0000b"])
    elif choice == 1:
        wm[name] = r.choice(VALUES)
    elif choice == 2:
        del wm[name]
    elif choice == 3:
        wm["model.extra.weight"] = wm[name]
    elif choice == 4:
        idx["weight_map"] = r.choice([[], None, "x", 3])
    elif choice == 5:
        other = sorted(set(wm.values()) - {wm[name]})
        if other:
            wm[name] = other[0]
    elif choice == 6:
        del idx["weight_map"]
    else:
        idx = r.choice([[], None, 3])
    _put(ck / INDEX, json.dumps(idx))


def _read_st(p: Path) -> tuple[dict, bytes]:
    raw = _read(p)
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_st(p: Path, header, data: bytes) -> None:
    text = json.dumps(header).encode()
    _put(p, len(text).to_bytes(8, "little") + text + data)


def mut_header_entry(ck, r):
    st = r.choice(_shards(ck))
    header, data = _read_st(st)
    name = r.choice(sorted(k for k in header if k != "__metadata__"))
    e = header[name]
    field = r.choice(["dtype", "shape", "data_offsets", "delete", "entry", "metadata", "rename"])
    if field == "dtype":
        e["dtype"] = r.choice(["F16", "BF16", "F32", "F64", "I8", "U8", "BOOL", "F8_E4M3", "X", "", 5, None])
    elif field == "shape":
        e["shape"] = r.choice([[], [0], [-1, 16], [2**40, 2**40], e["shape"][::-1], e["shape"] + [1],
                               [True, 16], [1.5], "16", None, [2**64]])
    elif field == "data_offsets":
        b, end = e["data_offsets"]
        e["data_offsets"] = r.choice([[end, b], [b, end + 4], [b - 4, end - 4], [0, end - b], [-1, end],
                                      [b, 2**64], [b, len(data) + 64], [b], [b, end, 0], [str(b), end], None,
                                      [b + 0.5, end]])
    elif field == "delete":
        del header[name]
    elif field == "entry":
        header[name] = r.choice([[], None, 3, "x", {}])
    elif field == "metadata":
        header["__metadata__"] = r.choice([[], None, 3, {"format": 3}, {"a": {"b": 1}}])
    else:
        header["model.layers.0.something.weight"] = header.pop(name)
    _write_st(st, header, data)


def mut_header_length(ck, r):
    st = r.choice(_shards(ck))
    raw = bytearray(_read(st))
    n = int.from_bytes(raw[:8], "little")
    raw[:8] = r.choice([0, 1, n - 1, n + 1, n + 8, len(raw), 2**63, 2**64 - 1, 100_000_001]).to_bytes(8, "little")
    _put(st, bytes(raw))


def mut_truncate(ck, r):
    p = r.choice(_shards(ck) + [ck / "config.json", ck / INDEX])
    size = len(_read(p))
    os.truncate(p, r.choice([0, 4, 8, 9, r.randrange(size), size - 1]))


def mut_flip(ck, r):
    p = r.choice(_shards(ck))
    raw = bytearray(_read(p))
    for _ in range(r.randrange(1, 8)):
        raw[r.randrange(len(raw))] ^= 1 << r.randrange(8)
    _put(p, bytes(raw))


def mut_nan(ck, r):
    """A NaN or Inf somewhere in a tensor's data (F32 source)."""
    st = r.choice(_shards(ck))
    header, data = _read_st(st)
    name = r.choice(sorted(k for k in header if k != "__metadata__"))
    b, end = header[name]["data_offsets"]
    if end - b >= 4:
        at = b + 4 * r.randrange((end - b) // 4)
        data = data[:at] + r.choice([b"\x00\x00\xc0\x7f", b"\x00\x00\x80\x7f", b"\x00\x00\x80\xff"]) + data[at + 4:]
    _write_st(st, header, data)


def mut_kind(ck, r):
    p = r.choice([ck / "config.json", ck / INDEX, ck / "colibri.json", *_shards(ck)])
    if os.path.lexists(p):
        shutil.rmtree(p) if stat.S_ISDIR(os.lstat(p).st_mode) else p.unlink()
    kind = r.randrange(6)
    if kind == 0:
        os.mkfifo(p)
    elif kind == 1:
        p.mkdir()
    elif kind == 2:
        p.symlink_to("/dev/zero")
    elif kind == 3:
        p.symlink_to(ck / "missing")
    elif kind == 4:
        p.symlink_to(p.name)  # a loop
    # kind 5: the file is gone


def mut_colibri_json(ck, r):
    _put(ck / "colibri.json", json.dumps(r.choice([
        {"prompt": [r.choice(VALUES)], "generate": 2}, {"generate": r.choice(VALUES)}, {"prompt": r.choice(VALUES)},
        {"prompt": [1] * r.choice([1, 300, 5000])}, r.choice(VALUES), {"extra": 1}, {},
    ])))


MUTATIONS = [mut_config_value] * 4 + [mut_config_delete, mut_config_scale, mut_config_bytes] + [mut_index] * 2 + \
    [mut_header_entry] * 3 + [mut_header_length, mut_truncate, mut_flip, mut_nan, mut_kind, mut_kind,
                              mut_colibri_json]


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz-bases")
    out = {}
    for name, kw in BASES.items():
        out[name] = synth(root / name, **kw)
        (out[name] / "colibri.json").write_text('{"prompt": [1, 2, 3], "generate": 4}')
    return out


def _run_forked(argv: list[str], log: Path) -> tuple[int | None, int | None]:
    """(exit status, killing signal) of `colibri <argv>` run in a forked child under the limits."""
    from colibri.toolchain.cli import main

    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    pid = os.fork()
    if pid == 0:  # the child: limits, output to the log, the CLI, exit with its status
        rc = 99
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (pytest's capture replaced them)
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.alarm(CASE_SECONDS)
            resource.setrlimit(resource.RLIMIT_AS, (vm + CASE_MEMORY, vm + CASE_MEMORY))
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 99
        except BaseException:  # an escaped exception is a bug: show it
            import traceback

            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(rc)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


def test_fuzz_export(bases, tmp_path):
    import contextlib
    import io

    from colibri.toolchain.cli import main

    # One real export per base and quantization here, so that each forked run finds the modules imported,
    # the templates compiled and the lazy caches filled (a run then takes tens of milliseconds, not hundreds).
    with contextlib.redirect_stdout(io.StringIO()):
        for name, ck in sorted(bases.items()):
            for quant in ("f32", "int8c"):
                assert main(["export", str(ck), "-o", str(tmp_path / f"warm-{name}"), "--no-predict", "--quant",
                             quant]) == 0

    r = random.Random(SEED)
    results: dict[int, int] = {}
    failures = []
    for i in range(N_CASES):
        base = r.choice(sorted(bases))
        case = tmp_path / f"c{i}"
        case.mkdir()
        ck = case / "ck"
        shutil.copytree(bases[base], ck)
        muts = [r.choice(MUTATIONS) for _ in range(r.choice([1, 1, 1, 2, 3]))]
        for m in muts:
            try:
                m(ck, random.Random(r.random()))
            except Exception:  # noqa: BLE001
                pass  # the mutation does not apply (a file an earlier one removed): keep what it did
        before = tree(ck)
        out = case / "out"
        log = tmp_path / f"c{i}.log"
        quant = "int8c" if i % 5 == 0 else "f32"  # int8c's corrections cost time; the parsing is the same
        rc, sig = _run_forked(["export", str(ck), "-o", str(out), "--no-predict", "--max-seq", "64", "--quant", quant],
                              log)
        text = log.read_text(errors="replace")
        err = [ln for ln in text.splitlines() if ln.startswith("colibri: error: ")]
        what = f"case {i} ({base}: {', '.join(m.__name__ for m in muts)})"
        if sig is not None:
            failures.append(f"{what}: killed by signal {sig} (time or memory limit)")
        elif rc not in (0, 2):
            failures.append(f"{what}: exit {rc}\n{text[-3000:]}")
        elif "Traceback" in text:
            failures.append(f"{what}: traceback\n{text[-3000:]}")
        elif rc == 2 and len(err) != 1:
            failures.append(f"{what}: exit 2 without exactly one error line\n{text[-2000:]}")
        if tree(ck) != before:
            failures.append(f"{what}: the checkpoint changed")
        left = sorted(p.name for p in case.iterdir())
        if left != (["ck", "out"] if rc == 0 else ["ck"]):
            failures.append(f"{what}: files beside the output: {left}")
        results[rc if rc is not None else -1] = results.get(rc if rc is not None else -1, 0) + 1
        shutil.rmtree(case)
        log.unlink()
    assert not failures, "\n".join(failures[:20]) + f"\n({len(failures)} failures; exits {results})"
    # the mutations reach both outcomes: neither everything refused nor everything accepted
    assert results.get(0, 0) >= 25 and results.get(2, 0) >= 250, results
