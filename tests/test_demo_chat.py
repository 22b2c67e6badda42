"""colibri_demo --chat TEXT: one user turn through the chat template's prefix and suffix, which export
renders from tokenizer_config.json (codegen/chat.py) into model.h, tokenized on the device by the blob's
tokenizer: the template's special tokens parsed, the user's text never. Against HF tokenizers' ids of the
rendered parts and the binding's logits and greedy tokens from those ids."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, synth
from tokvocab import train_bytelevel

TEMPLATE = ROOT / "tests" / "fixtures" / "chat_templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
GENERATE = 4


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    d = synth(tmp_path_factory.mktemp("chat") / "chatml", layers=1, hidden=16, ffn=24, heads=2, kv_heads=1,
              experts=2, top_k=1, vocab=320, seed=6)
    train_bytelevel(d, 320, SPECIALS)
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE.read_text(),
                                                         "eos_token": "<|im_end|>", "bos_token": None}))
    return d


@pytest.fixture(scope="module")
def out(ckpt, build_model):
    return build_model(ckpt, "int8c", "host")


@pytest.fixture(scope="module")
def hf(ckpt):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(ckpt / "tokenizer.json"))


def _demo(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(out / "colibri_demo"), *args], capture_output=True, timeout=60)


def _lines(stdout: bytes) -> dict[str, str]:
    return {k: v for k, _, v in (line.partition(": ") for line in stdout.decode("utf-8", "replace").splitlines())}


def _model(out: Path):
    from colibri.runtime import load

    return load(next(out.glob("libcolibri_*.so")))


def _check(out: Path, user: str, user_ids: list[int], hf) -> None:
    chat = json.loads((out / "manifest.json").read_text())["chat"]
    ids = hf.encode(chat["prefix"], add_special_tokens=False).ids + user_ids + \
        hf.encode(chat["suffix"], add_special_tokens=False).ids
    res = _demo(out, "--chat", user, "--generate", str(GENERATE), "--print-logits")
    assert res.returncode == 0, res.stderr
    got = _lines(res.stdout)
    m = _model(out)
    want_logits = m.forward(ids)
    m.reset()
    np.testing.assert_array_equal(np.array([float(x) for x in got["logits"].split(",")], np.float32), want_logits)
    assert [int(t) for t in got["tokens"].split(",")] == m.generate(ids, GENERATE)


def test_chat_is_the_templates_ids(out, hf):
    chat = json.loads((out / "manifest.json").read_text())["chat"]
    assert "<|im_start|>" in chat["prefix"] and "<|im_start|>assistant" in chat["suffix"]
    user = "Hello world, 123+456="
    _check(out, user, hf.encode(user, add_special_tokens=False).ids, hf)


def test_a_special_token_typed_by_the_user_stays_text(out, hf):
    user = "hi<|im_end|>there"
    im_end = hf.token_to_id("<|im_end|>")
    # HF's encode always matches added tokens: the binding's parse_special=False ids stand for the text
    as_text = _model(out).tokenize(user, parse_special=False)
    assert im_end not in as_text and hf.decode(as_text, skip_special_tokens=False) == user
    assert im_end in hf.encode(user, add_special_tokens=False).ids  # what parsing it would have given
    _check(out, user, as_text, hf)


def test_chat_without_a_template_is_refused(build_model, tmp_path_factory):
    d = synth(tmp_path_factory.mktemp("nochat") / "nochat", layers=1, hidden=16, ffn=24, heads=2, kv_heads=1,
              experts=2, top_k=1, vocab=320, seed=7)
    train_bytelevel(d, 320)
    res = _demo(build_model(d, "int8c", "host"), "--chat", "hi")
    assert res.returncode == 2
    lines = res.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "chat template" in lines[0], res.stderr


def test_chat_with_tokens_is_a_usage_error(out):
    res = _demo(out, "--chat", "hi", "--tokens", "1,2")
    assert res.returncode == 2 and b"--chat" in res.stderr
