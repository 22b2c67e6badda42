"""Sampling a real (synthetic) model end to end: colibri.json's "sampling" exported into model.h and run by
the firmware image on stm32h7 under QEMU and by colibri_demo on the host; the demo's sampling flags; and
the binding's generate(). Each is checked against the Python transcription of colibri_sample.h
(sample_spec.py) over the model's own logits (the binding's forward), so the same seed gives the same
ids on the host, in the binding and on the microcontroller; and the export refuses bad values."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import sample_spec

from colibri.toolchain.binding import load
from colibri.toolchain.binding.sampling import TEXT

from conftest import BIN, synth

# a random model: a flat next-token distribution, so sampling and greedy part at once
SMALL = dict(layers=2, hidden=48, ffn=64, heads=4, kv_heads=2, experts=4, top_k=2, vocab=131, seed=21, dtype="f32")
PROMPT, GENERATE = [5, 17, 99, 3], 12
SAMPLING = {"temperature": 1.0, "top_k": 40, "top_p": 0.95, "min_p": 0.01, "repeat_penalty": 1.2, "seed": 7}
WINDOW = 64  # the repetition penalty's window in the demo, the firmware and the binding


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = synth(tmp_path_factory.mktemp("sampled") / "sampled", **SMALL)
    (path / "colibri.json").write_text(json.dumps({"prompt": PROMPT, "generate": GENERATE, "sampling": SAMPLING}))
    return path


@pytest.fixture(scope="module")
def host(ckpt, build_model):
    return build_model(ckpt, "int8c", "host")


def _reference(model, prompt, n, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=0,
               stop=()) -> list[int]:
    """The ids the specification gives over the model's logits (int8c with integer matmuls: the same
    logits on every target)."""
    model.reset()
    rng, history, out = sample_spec.Rng(seed), list(prompt), []
    logits = model.forward(prompt)
    for _ in range(n):
        recent = history[-WINDOW:] if repeat_penalty != 1.0 else []
        nxt = sample_spec.sample(logits, rng, temperature, top_k, top_p, min_p, repeat_penalty, recent)
        out.append(nxt)
        history.append(nxt)
        if nxt in stop or len(out) == n:
            break
        logits = model.forward([nxt])
    model.reset()
    return out


def _tokens(stdout: str) -> list[int]:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("tokens: "))
    return [int(t) for t in line.removeprefix("tokens: ").split(",") if t]


@pytest.fixture(scope="module")
def model(host):
    return load(next(host.glob("libcolibri_*.so")))


@pytest.fixture(scope="module")
def expected(model):
    ids = _reference(model, PROMPT, GENERATE, **SAMPLING)
    assert ids != _reference(model, PROMPT, GENERATE)  # sampled, not greedy
    return ids


def test_demo_runs_the_exported_sampling(host, expected):
    res = subprocess.run([str(host / "colibri_demo")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert _tokens(res.stdout) == expected


def test_binding_generate_samples_the_same_ids(model, expected):
    model.reset()
    assert model.generate(PROMPT, GENERATE, **SAMPLING) == expected
    model.reset()
    assert model.generate(PROMPT, GENERATE) == _reference(model, PROMPT, GENERATE)  # greedy, as before


def test_demo_flags_override_the_export(host, model):
    flags = dict(temperature=0.7, top_k=0, top_p=0.8, min_p=0.0, repeat_penalty=1.0, seed=123)
    argv = [str(host / "colibri_demo"), "--tokens", "1,2,3", "--generate", "9", "--temperature", "0.7",
            "--top-k", "0", "--top-p", "0.8", "--repeat-penalty", "1", "--seed", "123"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert _tokens(res.stdout) == _reference(model, [1, 2, 3], 9, **flags)


def test_stop_id_ends_the_generation(host, model, expected):
    stop = expected[4]
    first = expected.index(stop)
    model.reset()
    assert model.generate(PROMPT, GENERATE, **SAMPLING, stop=[stop]) == expected[:first + 1]
    res = subprocess.run([str(host / "colibri_demo"), "--stop", str(stop)], capture_output=True, text=True,
                         timeout=60)
    assert _tokens(res.stdout) == expected[:first + 1]


def test_stm32h7_firmware_samples_the_same_ids(ckpt, build_model, expected):
    from conftest import require_target

    require_target("stm32h7")
    out = build_model(ckpt, "int8c", "stm32h7")
    elf = next(p for p in out.glob("*.elf") if not p.name.endswith("-qemu.elf"))
    res = subprocess.run([str(BIN / "colibri"), "run", "--target", "stm32h7", str(elf)], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert _tokens(res.stdout) == expected


@pytest.mark.parametrize("sampling,what", [
    ({"temperature": "hot"}, "'temperature'"), ({"temperature": -0.5}, "'temperature'"),
    ({"top_k": 1.5}, "'top_k'"), ({"top_p": 1.5}, "'top_p'"), ({"min_p": -1}, "'min_p'"),
    ({"repeat_penalty": 0}, "'repeat_penalty'"), ({"seed": -1}, "'seed'"), ({"seed": 2**64}, "'seed'"),
    ({"stop": [131]}, "'stop'"), ({"temprature": 1.0}, "unknown key 'temprature'"), ([1], "JSON object"),
])
def test_export_refuses_bad_sampling_in_one_line(tmp_path, sampling, what):
    path = synth(tmp_path / "ck", **{**SMALL, "layers": 1})
    (path / "colibri.json").write_text(json.dumps({"sampling": sampling}))
    res = subprocess.run([sys.executable, "-m", "colibri.toolchain.cli", "export", str(path), "-o",
                          str(tmp_path / "out"), "--no-predict"], capture_output=True, text=True)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "colibri.json" in lines[0] and what in lines[0], res.stderr
    assert not (tmp_path / "out").exists()


def test_generate_text_streams_what_it_returns(model):
    """generate_text with a piece decoder (until the tokenizer's): what on_text got, in whole characters,
    is what it returns, the lossy UTF-8 decoding of the ids' bytes; a stop id's text is left out."""
    table = ["é".encode()[:1], "é".encode()[1:], "你".encode(), b"\xff", b" the", "😀".encode()[:3]]

    def piece(i: int) -> tuple[bytes, int]:
        return table[i % len(table)], TEXT

    def text_of(ids: list[int]) -> str:
        return b"".join(piece(i)[0] for i in ids).decode("utf-8", "replace")

    chunks: list[str] = []
    model.reset()
    text = model.generate_text(PROMPT, 24, temperature=1.5, seed=9, on_text=chunks.append, pieces=piece)
    model.reset()
    ids = model.generate(PROMPT, 24, temperature=1.5, seed=9)
    assert text == "".join(chunks) == text_of(ids)
    assert len(chunks) > 3
    stop = ids[5]
    model.reset()
    assert model.generate_text(PROMPT, 24, temperature=1.5, seed=9, stop=[stop], pieces=piece) == \
        text_of(ids[:ids.index(stop)])
    model.reset()
    with pytest.raises(ValueError, match="no tokenizer"):
        model.generate_text("text needs the tokenizer", 4)


def test_chat_is_prefix_text_suffix_with_the_text_never_parsed(model):
    """Model.chat over the hooks the tokenizer fills (tokenize, chat_template_parts): the ids are the
    prefix's, the text's (parse_special=False) and the suffix's, in that order."""
    calls = []

    def tokenize(text, special=False, parse_special=True):
        calls.append((text, parse_special))
        return [len(text) % 100 + 1]

    model.tokenize, model.chat_template_parts = tokenize, ("<|user|>", "<|end|><|assistant|>")
    try:
        model.reset()
        got = model.chat("hi <|end|>", 6, temperature=0.9, seed=4, pieces=lambda i: (b"x", TEXT))
        ids = [len("<|user|>") + 1, len("hi <|end|>") + 1, len("<|end|><|assistant|>") + 1]
        model.reset()
        assert got == "x" * len(model.generate(ids, 6, temperature=0.9, seed=4))
        assert calls == [("<|user|>", True), ("hi <|end|>", False), ("<|end|><|assistant|>", True)]
    finally:
        del model.tokenize, model.chat_template_parts
        model.reset()
    with pytest.raises(ValueError, match="no chat template"):
        model.chat("hi")
