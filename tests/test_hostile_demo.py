"""The demo programs on bad input: colibri_run refuses a model file that is not a regular file (a FIFO
does not hang it), and a prompt or a generation longer than the model's max_seq is one line and
exit 2 before any forward pass, never cut; up to max_seq positions run whole (the prompt buffers are
sized by the model, not a fixed 4,096 ids)."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from colibri.runtime import load

from conftest import GOLDEN, synth

LONG_SEQ = 4600  # more than the 4,096 ids the demos once held
LONG_PROMPT = 4500


def _run(*argv, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)


def _logits(stdout: str) -> np.ndarray:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("logits: "))
    return np.array([float(v) for v in line[8:].split(",")], dtype=np.float32)


def _ids(n: int, vocab: int) -> list[int]:
    return [(i * 7 + 3) % vocab for i in range(n)]


@pytest.fixture(scope="module")
def small(golden_ckpts, build_model):
    return build_model(golden_ckpts["gqa_top2"], "int8c")


@pytest.fixture(scope="module")
def long_build(tmp_path_factory, build_model):
    """gqa_top2 with max_seq 4600 and a 4,500-token prompt in its colibri.json."""
    ckpt = synth(tmp_path_factory.mktemp("long") / "gqa_long", **GOLDEN["gqa_top2"])
    (ckpt / "colibri.json").write_text(json.dumps({"prompt": _ids(LONG_PROMPT, GOLDEN["gqa_top2"]["vocab"]),
                                                   "generate": 2}))
    return build_model(ckpt, "int8c", "host", f"MAX_SEQ={LONG_SEQ}")


def _refused(res: subprocess.CompletedProcess, *words: str) -> None:
    lines = res.stderr.splitlines()
    assert res.returncode == 2, f"exit {res.returncode}: {res.stderr}"
    assert len(lines) == 1 and all(w in lines[0] for w in words), res.stderr
    assert "tokens:" not in res.stdout  # refused before any forward pass


@pytest.mark.parametrize("kind", ["fifo", "directory", "dev-zero"])
def test_run_refuses_non_regular_model_file(small, tmp_path, kind):
    path = tmp_path / f"model-{kind}"
    words = {"fifo": "a FIFO", "directory": "a directory", "dev-zero": "a character device"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    res = _run(small / "colibri_run", path, timeout=10)  # a hang in open() is a TimeoutExpired
    _refused(res, str(path), words, "not a regular file")


@pytest.mark.parametrize("prog", ["colibri_run", "colibri_demo"])
@pytest.mark.parametrize("which", ["small", "long_build"])
def test_prompt_longer_than_max_seq(request, prog, which):
    out = request.getfixturevalue(which)
    m = load(out / "model.bin")
    ids = ",".join(map(str, _ids(m.max_seq + 1, m.vocab)))
    model = [out / "model.bin"] if prog == "colibri_run" else []
    _refused(_run(out / prog, *model, "--tokens", ids, "--generate", "1"),
             f"{m.max_seq + 1} tokens, more than max_seq {m.max_seq}")


@pytest.mark.parametrize("prog", ["colibri_run", "colibri_demo"])
def test_prompt_and_generation_over_max_seq(small, prog):
    m = load(small / "model.bin")
    model = [small / "model.bin"] if prog == "colibri_run" else []
    prompt = _ids(10, m.vocab)
    fits = m.max_seq - len(prompt) + 1  # the last generated token is never fed
    ok = _run(small / prog, *model, "--tokens", ",".join(map(str, prompt)), "--generate", str(fits))
    assert ok.returncode == 0, ok.stderr
    assert len(next(ln for ln in ok.stdout.splitlines() if ln.startswith("tokens: "))[8:].split(",")) == fits
    res = _run(small / prog, *model, "--tokens", ",".join(map(str, prompt)), "--generate", str(fits + 1))
    _refused(res, f"10 prompt tokens and {fits + 1} to generate need {m.max_seq + 1} positions",
             f"more than max_seq {m.max_seq}")


def test_more_than_4096_ids_run_whole(long_build):
    """4,500 ids through --tokens (colibri_run, colibri_demo) and as the built-in prompt (colibri_demo
    without arguments): the prompt logits are the binding's for all 4,500, not for a prefix."""
    m = load(long_build / "model.bin")
    assert m.max_seq == LONG_SEQ
    ids = _ids(LONG_PROMPT, m.vocab)
    want = m.forward(ids)
    m.reset()
    cut = m.forward(ids[:4096])
    assert not np.array_equal(want, cut)
    text = ",".join(map(str, ids))
    runs = {"colibri_run --tokens": _run(long_build / "colibri_run", long_build / "model.bin", "--tokens", text,
                                         "--generate", "1", "--print-logits"),
            "colibri_demo --tokens": _run(long_build / "colibri_demo", "--tokens", text, "--generate", "1",
                                          "--print-logits"),
            "colibri_demo": _run(long_build / "colibri_demo", "--print-logits")}
    for name, res in runs.items():
        assert res.returncode == 0, f"{name}: {res.stderr}"
        assert np.array_equal(_logits(res.stdout), want), f"{name}: not the logits of the whole prompt"
