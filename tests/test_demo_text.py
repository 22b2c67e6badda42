"""colibri_demo with text (issue 16): `--prompt TEXT` and colibri.json's `"prompt": "text"` are tokenized by
the C tokenizer in the blob and the text is streamed, against HF tokenizers' ids and the binding's greedy
generation from them; a prompt over max_seq is refused with one line, exit 2, never cut."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import synth
from tokvocab import train_bytelevel

PROMPT = "123+456="
GENERATE = 6


def text_ckpt(tmp_path_factory) -> Path:
    """The session's model with a tokenizer and a text prompt (one directory, so build_model builds it once
    for every test file that uses it)."""
    d = Path(tmp_path_factory.getbasetemp()) / "demotext" / "demotext"
    if not (d / "colibri.json").exists():
        synth(d, layers=1, hidden=16, ffn=24, heads=2, kv_heads=1, experts=2, top_k=1, vocab=320, seed=5)
        train_bytelevel(d, 320)
        (d / "colibri.json").write_text(json.dumps({"prompt": PROMPT, "generate": GENERATE}))
    return d


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return text_ckpt(tmp_path_factory)


@pytest.fixture(scope="module")
def out(ckpt, build_model):
    return build_model(ckpt, "int8c", "host")


@pytest.fixture(scope="module")
def hf(ckpt):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(ckpt / "tokenizer.json"))


def _run(exe, *args):
    return subprocess.run([str(exe), *args], capture_output=True, timeout=60)


def _parse(stdout: bytes) -> tuple[bytes, list[int]]:
    """The streamed text (it may hold newlines) and the ids of the tokens: line."""
    assert stdout.startswith(b"text: "), stdout
    text, rest = stdout[len(b"text: "):].split(b"\ntokens: ", 1)
    return text, [int(x) for x in rest.split(b"\n", 1)[0].split(b",")]


def _expected(out, hf, text: str, n: int) -> list[int]:
    from colibri.runtime import load

    m = load(next(out.glob("libcolibri_*.so")))
    return m.generate(hf.encode(text, add_special_tokens=False).ids, n)


@pytest.mark.parametrize("text", ["Hello world", "héllo wörld 👋", "<|endoftext|>123"])
def test_prompt_text_as_hf_ids(out, hf, text):
    res = _run(out / "colibri_demo", "--prompt", text, "--generate", "8")
    assert res.returncode == 0, res.stderr
    streamed, ids = _parse(res.stdout)
    assert ids == _expected(out, hf, text, 8)
    assert streamed.decode("utf-8") == hf.decode(ids, skip_special_tokens=False)  # whole characters only
    assert b"tok/s: " in res.stdout and b"prefill tok/s: " in res.stdout


def test_colibri_json_text_prompt_is_the_default(out, hf):
    res = _run(out / "colibri_demo")
    assert res.returncode == 0, res.stderr
    assert _parse(res.stdout)[1] == _expected(out, hf, PROMPT, GENERATE)


def test_prompt_over_max_seq_is_refused(out, hf):
    from colibri.runtime import load

    max_seq = load(next(out.glob("libcolibri_*.so"))).max_seq
    long = "Hello world " * max_seq
    assert len(hf.encode(long, add_special_tokens=False).ids) > max_seq
    res = _run(out / "colibri_demo", "--prompt", long, "--generate", "1")
    assert res.returncode == 2 and res.stdout == b""
    assert res.stderr.count(b"\n") == 1 and f"more than max_seq {max_seq}".encode() in res.stderr
    res = _run(out / "colibri_demo", "--prompt", "Hello", "--tokens", "1,2")
    assert res.returncode == 2 and b"one of --tokens, --prompt or --chat" in res.stderr


def test_program_without_tokenizer_refuses_text(out):
    res = _run(out / "colibri_run", str(out / "model.bin"), "--prompt", "Hello")
    assert res.returncode == 2 and b"needs the model's tokenizer" in res.stderr and res.stdout == b""


def test_text_prompt_needs_the_tokenizer(ckpt, tmp_path):
    from conftest import BIN

    res = subprocess.run([str(BIN / "colibri"), "export", str(ckpt), "-o", str(tmp_path / "o"), "--no-predict",
                          "--no-tokenizer"], capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "text prompt needs" in res.stderr
    assert not (tmp_path / "o").exists()


def test_binding_generate_text_from_the_blob(out, hf):
    """Model.generate_text with a text prompt and no pieces=: the blob's tokenizer both ways."""
    from colibri.runtime import load

    m = load(next(out.glob("libcolibri_*.so")))
    chunks: list[str] = []
    text = m.generate_text(PROMPT, 8, on_text=chunks.append)
    m.reset()
    ids = m.generate(hf.encode(PROMPT, add_special_tokens=False).ids, 8)
    assert text == "".join(chunks) == hf.decode(ids, skip_special_tokens=False)


def test_scalar_kernels_build_gives_the_same_text(ckpt, out, hf, build_model):
    """KERNELS=scalar (the kernels' portable C): the same prompt ids, generated ids and streamed text."""
    text = "héllo wörld 👋 <|endoftext|>123"
    scalar = build_model(ckpt, "int8c", "host", "KERNELS=scalar")
    runs = [_run(o / "colibri_demo", "--prompt", text, "--generate", "8", "--print-logits") for o in (out, scalar)]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    (t0, ids0), (t1, ids1) = (_parse(r.stdout) for r in runs)
    assert ids0 == ids1 == _expected(out, hf, text, 8) and t0 == t1
