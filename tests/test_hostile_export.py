"""Hostile and careless input to `colibri export` / `inspect` / `synth`: every failure is one line and exit 2,
no user file is lost, nothing hangs, nothing reaches the generated C that C would read as code."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import select
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BIN, ROOT, synth

TINY = dict(layers=1, hidden=16, ffn=24, heads=2, kv_heads=1, experts=3, top_k=2, vocab=32, seed=3)
TIMEOUT = 60  # a hang fails the test instead of the suite


def colibri(*args, timeout: float = TIMEOUT, **kw) -> subprocess.CompletedProcess:
    argv = [os.fsencode(BIN / "colibri"), *(a if isinstance(a, bytes) else os.fsencode(str(a)) for a in args)]
    return subprocess.run(argv, capture_output=True, timeout=timeout, **kw)


def one_line(res: subprocess.CompletedProcess, *needles: str) -> str:
    """The single error line of a run that must fail with exit 2, containing every needle."""
    err = res.stderr.decode("utf-8")  # the CLI prints non-UTF-8 bytes as \\xNN: this must decode
    assert res.returncode == 2, (res.returncode, res.stdout[-2000:], err[-2000:])
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("colibri: error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def tree(path: Path) -> dict[str, object]:
    """Every entry under path (not following links) -> its kind and content hash."""
    out: dict[str, object] = {}
    if not os.path.lexists(path):
        return out
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            p = Path(root) / n
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                out[str(p.relative_to(path))] = hashlib.sha256(p.read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                out[str(p.relative_to(path))] = ("link", os.readlink(p))
            else:
                out[str(p.relative_to(path))] = stat.S_IFMT(st.st_mode)
    return out


@pytest.fixture()
def ck(tmp_path) -> Path:
    return synth(tmp_path / "ck", **TINY)


# ---- class 2: -o never replaces what it did not make ----

@pytest.mark.parametrize("where", ["itself", "parent", "inside", "cwd", "home", "symlink_to_ckpt"])
def test_output_on_or_around_the_checkpoint_is_refused(ck, tmp_path, where):
    (tmp_path / "notes.txt").write_text("mine")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".profile").write_text("mine")
    (tmp_path / "link").symlink_to(ck)
    out, cwd, needle = {
        "itself": (ck, None, "is the checkpoint directory"),
        "parent": (tmp_path, None, "contains the checkpoint directory"),
        "inside": (ck / "out", None, "lies inside the checkpoint directory"),
        "cwd": (".", tmp_path, "contains the checkpoint directory"),
        "home": (home, None, "is not a colibri export"),
        "symlink_to_ckpt": (tmp_path / "link", None, "is the checkpoint directory"),
    }[where]
    before = tree(tmp_path)
    res = colibri("export", ck, "-o", out, "--no-predict", cwd=cwd)
    one_line(res, needle, "refusing to replace it")
    assert tree(tmp_path) == before


def test_output_that_is_a_file_or_a_foreign_directory_is_refused(ck, tmp_path):
    f = tmp_path / "some_file"
    f.write_text("precious")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    ok = tmp_path / "prev"
    assert colibri("export", ck, "-o", ok, "--no-predict").returncode == 0
    (ok / "README").write_text("added by the user")  # a previous export with a user's file is no longer ours
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "manifest.json").write_text('{"generator": "someone else"}')
    before = tree(tmp_path)
    one_line(colibri("export", ck, "-o", f, "--no-predict"), str(f), "is a file, not a directory")
    for d in (foreign, ok, fake):
        one_line(colibri("export", ck, "-o", d, "--no-predict"), str(d), "is not a colibri export")
    assert tree(tmp_path) == before


def test_output_missing_empty_or_previous_export_is_replaced(ck, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for out in (tmp_path / "new", empty, tmp_path / "new"):  # the third run replaces the first's export
        res = colibri("export", ck, "-o", out, "--no-predict")
        assert res.returncode == 0, res.stderr
        assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.bin", "model.c", "model.h",
                                                         "model_blob.S"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "empty", "new"]  # no lock or staging left


# ---- class 3: only regular files, bounded, no hang ----

def _fifo(p: Path) -> None:
    p.unlink(missing_ok=True)
    os.mkfifo(p)


def _zero(p: Path) -> None:
    p.unlink(missing_ok=True)
    p.symlink_to("/dev/zero")


def _dir(p: Path) -> None:
    p.unlink(missing_ok=True)
    p.mkdir()


KINDS = {"fifo": (_fifo, "is a FIFO"), "dev_zero": (_zero, "is a character device"),
         "directory": (_dir, "is a directory")}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("file", ["config.json", "model.safetensors", "colibri.json", "index", "shard"])
def test_checkpoint_files_that_are_not_regular_files(tmp_path, kind, file):
    make, needle = KINDS[kind]
    sharded = file in ("index", "shard")
    ck = synth(tmp_path / "ck", **TINY, shards=2 if sharded else 1)
    target = {"index": ck / "model.safetensors.index.json", "shard": ck / "model-00002-of-00002.safetensors"}.get(
        file, ck / file)
    make(target)
    t0 = time.monotonic()
    res = colibri("export", ck, "-o", tmp_path / "out", "--no-predict", timeout=20)
    one_line(res, str(target), needle)
    assert time.monotonic() - t0 < 15
    assert not (tmp_path / "out").exists()
    if file == "config.json":  # inspect reads the checkpoint the same way
        one_line(colibri("inspect", ck, timeout=20), str(target), needle)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_calibration_file_that_is_not_a_regular_file(ck, tmp_path, kind):
    make, needle = KINDS[kind]
    calib = tmp_path / "calib.txt"
    make(calib)
    res = colibri("export", ck, "-o", tmp_path / "out", "--no-predict", "--prune-experts", calib, timeout=20)
    one_line(res, str(calib), needle)


def test_oversized_config_is_refused_without_reading_it(ck):
    with open(ck / "config.json", "r+b") as f:
        f.truncate(8 << 20)  # sparse: 8 MiB of NULs, over the 4 MiB limit of a config file
    one_line(colibri("export", ck, "-o", ck.parent / "out"), "config.json", "limit")


# ---- classes 8 and 9: the built-in prompt ----

@pytest.mark.parametrize("content, needle", [
    ("[1, 2]", "expected a JSON object"),
    ("null", "expected a JSON object"),
    ("3", "expected a JSON object"),
    ('"prompt"', "expected a JSON object"),
    ('{"prompt": [1, true, 2]}', "element 1 is True"),
    ('{"prompt": [1.5]}', "element 0 is 1.5"),
    ('{"prompt": [-1]}', "outside the vocabulary [0, 32)"),
    ('{"prompt": [32]}', "outside the vocabulary [0, 32)"),
    ('{"prompt": [' + "9" * 40 + "]}", "an integer of 40 digits"),
    ('{"prompt": "3,4"}', "a text prompt needs the model's tokenizer"),  # text: only with a tokenizer
    ('{"prompt": ""}', "an empty text"),
    ('{"prompt": {"a": 1}}', "expected a list of token ids or a text"),
    ('{"generate": true}', "expected a positive integer, got True"),
    ('{"generate": -100000000000000000000000}', "expected a positive integer"),
    ('{"generate": -1}', "expected a positive integer, got -1"),
    ('{"generate": 0}', "expected a positive integer, got 0"),
    ('{"generate": 2.0}', "expected a positive integer, got 2.0"),
    ('{"prompt": [1], "temperature": 0.7}', "unknown key 'temperature'"),
    ("[" * 100_000, "nested deeper than"),
    (b"\xff\xfe{}", "not UTF-8"),
])
def test_bad_colibri_json(ck, tmp_path, content, needle):
    (ck / "colibri.json").write_bytes(content if isinstance(content, bytes) else content.encode())
    one_line(colibri("export", ck, "-o", tmp_path / "out", "--no-predict"), str(ck / "colibri.json"), needle)
    assert not (tmp_path / "out").exists()


def test_prompt_longer_than_max_seq_is_refused_naming_the_limit(ck, tmp_path):
    (ck / "colibri.json").write_text(json.dumps({"prompt": [1] * 40, "generate": 1}))
    one_line(colibri("export", ck, "-o", tmp_path / "out", "--max-seq", "32"), "40 tokens", "max_seq 32")
    (ck / "colibri.json").write_text(json.dumps({"prompt": [1] * 20, "generate": 13}))
    one_line(colibri("export", ck, "-o", tmp_path / "out", "--max-seq", "32"), "13 tokens", "max_seq 32")
    one_line(colibri("export", ck, "-o", tmp_path / "out", "--max-seq", "32", "--generate", "-5"), "--generate -5")
    one_line(colibri("export", ck, "-o", tmp_path / "out", "--max-seq", "32", "--prompt", "1,2,99"),
             "--prompt", "token 99 outside the vocabulary")
    (ck / "colibri.json").write_text(json.dumps({"prompt": [1] * 20, "generate": 12}))
    assert colibri("export", ck, "-o", tmp_path / "out", "--max-seq", "32", "--no-predict").returncode == 0


CC = shutil.which("cc") or shutil.which("gcc")


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_hostile_checkpoint_name_reaches_c_as_plain_text(tmp_path):
    """A directory name that would end a comment, start a line or hold non-UTF-8 bytes gives C that compiles
    with -Werror and a valid identifier."""
    name = os.fsencode("we*/ #error pwned */\n#define x ??/ \"q\\") + b"\xff"
    ck = synth(Path(os.fsdecode(os.fsencode(tmp_path) + b"/" + name)), **TINY)
    out = tmp_path / "out"
    res = colibri("export", os.fsencode(ck), "-o", out, "--no-predict")
    assert res.returncode == 0, res.stderr
    res.stdout.decode("utf-8")  # printed safely
    for f in ("model.h", "model.c", "model_blob.S"):
        text = (out / f).read_bytes().decode("ascii")  # pure ASCII
        first = text.splitlines()[0]
        assert first.startswith("/* Generated by colibri") and first.count("*/") == (0 if f == "model_blob.S" else 1)
        assert not any(line.lstrip().startswith(("#error", "#define x")) for line in text.splitlines())
    model_h = (out / "model.h").read_text()
    ident = model_h.split('#define COLIBRI_MODEL_NAME "')[1].split('"')[0]
    assert ident.isidentifier() and ident.isascii()
    res = subprocess.run([CC, "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only",
                          f"-I{ROOT / 'runtime_c/include'}", str(out / "model.c")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


# ---- class 10: one line, never a traceback ----

def test_non_utf8_names_print_safely(tmp_path):
    ck = synth(Path(os.fsdecode(os.fsencode(tmp_path) + b"/m\xff")), **TINY)
    (ck / "config.json").write_text("{")
    line = one_line(colibri("export", os.fsencode(ck), "-o", tmp_path / "out"))
    assert "m\\xff/config.json" in line


def test_non_utf8_calibration_file(ck, tmp_path):
    calib = tmp_path / "calib.txt"
    calib.write_bytes(b"1 2 3\n\xff\xfe\n")
    one_line(colibri("export", ck, "-o", tmp_path / "out", "--prune-experts", calib), str(calib), "not UTF-8")


@pytest.mark.parametrize("file", ["config.json", "model.safetensors.index.json", "model.safetensors"])
def test_deeply_nested_json(tmp_path, file):
    ck = synth(tmp_path / "ck", **TINY, shards=2 if "index" in file else 1)
    deep = b"[" * 100_000
    if file == "model.safetensors":
        deep = len(deep).to_bytes(8, "little") + deep
    (ck / file).write_bytes(deep)
    one_line(colibri("export", ck, "-o", tmp_path / "out"), str(ck / file), "nested deeper than")


def test_full_output_file_system(ck, tmp_path):
    """A write that fails (here: over RLIMIT_FSIZE, as on a full disk) is one line and the previous output stays."""
    out = tmp_path / "out"
    assert colibri("export", ck, "-o", out, "--no-predict").returncode == 0
    before = tree(tmp_path)

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    res = colibri("export", ck, "-o", out, "--no-predict", "--quant", "f32", preexec_fn=small_files)
    one_line(res, str(out), "cannot write the export", "File too large")
    assert tree(tmp_path) == before


def test_output_under_a_file_or_a_link_loop(ck, tmp_path):
    (tmp_path / "f").write_text("x")
    one_line(colibri("export", ck, "-o", tmp_path / "f" / "out", "--no-predict"), str(tmp_path / "f"))
    (tmp_path / "loop").symlink_to("loop")
    one_line(colibri("export", ck, "-o", tmp_path / "loop", "--no-predict"), str(tmp_path / "loop"), "resolved")


def test_debug_shows_the_traceback(ck, tmp_path):
    (ck / "config.json").write_text("{")
    res = colibri("--debug", "export", ck, "-o", tmp_path / "out")
    assert res.returncode != 0 and b"Traceback" in res.stderr and b"ExportError" in res.stderr


def test_bad_synth_arguments_are_one_line(tmp_path):
    one_line(colibri("synth", tmp_path / "s", "--heads", "3", "--hidden", "16"), "hidden 16")


PAGE = os.sysconf("SC_PAGE_SIZE")  # the smallest pipe Linux makes


def _big(tmp_path: Path) -> Path:
    """Big enough that an export interrupted in layer 1 still has most of its work and its output ahead
    (16 layers, 28 M weights, ~39 KB of lines after layer 1 begins)."""
    return synth(tmp_path / "big", layers=16, hidden=192, ffn=384, heads=4, kv_heads=2, experts=8, top_k=2,
                 vocab=256, seed=5)


def test_interrupt_is_exit_130_and_leaves_the_output(ck, tmp_path):
    out = tmp_path / "out"
    assert colibri("export", ck, "-o", out, "--no-predict").returncode == 0
    before = tree(out)
    big = _big(tmp_path)
    # SIGINT at its default in the child: a suite started in the background by a non-interactive shell
    # inherits SIGINT ignored, and Python then leaves it ignored (the export would finish, exit 0)
    # The export prints a line per tensor, ~39 KB after the first of layer 1; with the pipe at one page
    # (and at most as much again in this reader's buffer) it blocks in a write long before it ends, however
    # late this process gets to send the signal (with the default 64 KB pipe a loaded machine let it finish
    # first, exit 0)
    proc = subprocess.Popen([str(BIN / "colibri"), "export", str(big), "-o", str(out), "--no-predict"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, pipesize=PAGE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in proc.stdout:  # one line per tensor: interrupt it in layer 1 of 16
            if "layers.1." in line:
                break
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "colibri: interrupted" and "Traceback" not in err, err
    assert tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big", "ck", "out"]


# ---- class 11: two exports to one directory ----

def test_concurrent_exports_to_one_directory_both_succeed(ck, tmp_path):
    """The first export is stopped (SIGSTOP) while it holds the output; the second must wait for it, say so,
    and both must succeed once the first resumes. Synchronised by the staging directory and that line."""
    out = tmp_path / "out"
    big = _big(tmp_path)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen([str(BIN / "colibri"), "export", str(big), "-o", str(out), "--no-predict"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             pipesize=PAGE)  # as above: it cannot finish before it is stopped
    second = None
    try:
        for line in first.stdout:  # the first is writing into its staging directory when this line comes
            if "layers.0." in line:
                break
        first.send_signal(signal.SIGSTOP)
        assert list(tmp_path.glob(".out.tmp-*")), "the first export is not staging"
        second = subprocess.Popen([str(BIN / "colibri"), "export", str(ck), "-o", str(out), "--no-predict"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        ready, _, _ = select.select([second.stderr], [], [], TIMEOUT)
        waiting = second.stderr.readline() if ready else ""
        first.send_signal(signal.SIGCONT)
        assert "waiting for another export" in waiting, waiting
        _, err1 = first.communicate(timeout=TIMEOUT)  # first: the second waits for it, and it for its reader
        _, err2 = second.communicate(timeout=TIMEOUT)
    finally:
        for p in (first, second):
            if p is not None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()
    assert first.returncode == 0, err1
    assert second.returncode == 0, err2
    # the second waited for the first, then replaced its output whole: out is the small model's export
    assert json.loads((out / "manifest.json").read_text())["model"] == "ck"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big", "ck", "out"]


# ---- class 14: every spelling of a family's config keys ----

ALIAS_CASES = [("mixtral", "num_local_experts", "num_experts"), ("qwen3_moe", "num_experts", "num_local_experts"),
               ("olmoe", "num_experts", "num_local_experts"), ("deepseek", "n_routed_experts", "num_local_experts")]


@pytest.mark.parametrize("arch, key, alias", ALIAS_CASES)
def test_config_alias_spellings(tmp_path, arch, key, alias):
    kw = dict(TINY, arch=arch, layers=2)
    if arch == "deepseek":
        kw["dense_layers"] = (0,)
    ck = synth(tmp_path / "ck", **kw)
    assert colibri("export", ck, "-o", tmp_path / "ref", "--no-predict").returncode == 0
    cfg = json.loads((ck / "config.json").read_text())
    assert key in cfg
    n = cfg.pop(key)
    cfg[alias] = n
    (ck / "config.json").write_text(json.dumps(cfg))
    res = colibri("export", ck, "-o", tmp_path / "alias", "--no-predict")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "alias" / "model.bin").read_bytes() == (tmp_path / "ref" / "model.bin").read_bytes()
    cfg[key] = n  # both spellings, same value: fine
    (ck / "config.json").write_text(json.dumps(cfg))
    assert colibri("export", ck, "-o", tmp_path / "both", "--no-predict").returncode == 0
    cfg[alias] = n + 1  # different values: refused naming both
    (ck / "config.json").write_text(json.dumps(cfg))
    one_line(colibri("export", ck, "-o", tmp_path / "bad"), f"'{key}'", f"'{alias}'", "differ")


def test_usage_errors_are_one_line(tmp_path):
    for argv in (("export", tmp_path), ("export", tmp_path, "-o", tmp_path / "o", "--prompt", "a,b"),
                 ("synth", tmp_path / "s", "--layers", "x"), ("inspect",)):
        res = colibri(*argv)
        err = res.stderr.decode()
        assert res.returncode == 2 and len(err.strip().splitlines()) == 1 and "error:" in err, err


def test_synth_replaces_only_a_checkpoint(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    f = tmp_path / "file"
    f.write_text("mine")
    before = tree(tmp_path)
    for out, needle in ((tmp_path, "file"), (f, "is not a directory")):
        one_line(colibri("synth", out, "--layers", "1"), str(out), needle)
    assert tree(tmp_path) == before
    ck = tmp_path / "ck"
    for _ in range(2):  # over a checkpoint it wrote: fine
        assert colibri("synth", ck, "--layers", "1").returncode == 0
