"""codegen/chat.py: real chat templates (tests/fixtures/chat_templates, from llama.cpp's test data) reduced
to prefix + suffix, checked against transformers' own apply_chat_template for the same template (one
user turn, add_generation_prompt=True); templates that cannot be reduced are refused with one line, at
export too; the manifest carries the parts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from colibri.codegen.chat import ChatTemplateError, reduce_template

from conftest import ROOT, synth

FIXTURES = ROOT / "tests" / "fixtures" / "chat_templates"
TEMPLATES = sorted(FIXTURES.glob("*.jinja"))
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
TINY = dict(layers=1, hidden=16, ffn=16, heads=2, kv_heads=1, experts=2, top_k=1, vocab=32, seed=1)
TEST_TEXT = "What is 123+456? Answer in one line."


def _hf_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL.values())}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")), **SPECIAL)


@pytest.fixture(scope="module")
def hf():
    return _hf_tokenizer()


def test_there_are_enough_real_templates():
    assert len(TEMPLATES) >= 6


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_prefix_suffix_match_transformers(hf, path):
    src = path.read_text()
    parts = reduce_template(src, SPECIAL)
    ref = hf.apply_chat_template([{"role": "user", "content": TEST_TEXT}], chat_template=src, tokenize=False,
                                 add_generation_prompt=True)
    assert parts.prefix + TEST_TEXT + parts.suffix == ref
    assert ref.count(TEST_TEXT) == 1
    prefix, suffix = ref.split(TEST_TEXT)
    assert (parts.prefix, parts.suffix) == (prefix, suffix)
    assert parts.suffix  # every one of these opens the assistant's turn after the text


@pytest.mark.parametrize("src,why", [
    ("{{ bos_token }}hello", "does not contain"),
    ("{% for m in messages %}{{ m.content }}|{{ m.content }}{% endfor %}", "2 times"),
    ("{% if 'A' in messages[0].content %}a:{% endif %}{{ messages[0].content }}", "depends on the user text"),
    ("{% if messages[0].content | length > 24 %}long:{% endif %}{{ messages[0].content }}", "depends"),
    ("{{ raise_exception('only system turns') }}", "does not render"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}{{ messages[0].content }}", "does not render"),
    ("{% for m in messages %}{{ m.content", "does not render"),
])
def test_irreducible_templates_are_refused(src, why):
    with pytest.raises(ChatTemplateError, match=why) as e:
        reduce_template(src, SPECIAL)
    assert "\n" not in str(e.value)


def _ckpt(tmp_path: Path, template) -> Path:
    ckpt = synth(tmp_path / "ck", **TINY)
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, **SPECIAL}))
    return ckpt


def _export(ckpt: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "colibri.toolchain.cli", "export", str(ckpt), "-o", str(out),
                           "--no-predict"], capture_output=True, text=True)


def test_export_stores_the_parts_in_the_manifest(tmp_path):
    src = (FIXTURES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    res = _export(_ckpt(tmp_path, src), tmp_path / "out")
    assert res.returncode == 0, res.stderr
    chat = json.loads((tmp_path / "out" / "manifest.json").read_text())["chat"]
    ref = _hf_tokenizer().apply_chat_template([{"role": "user", "content": "Q"}], chat_template=src, tokenize=False,
                                              add_generation_prompt=True)
    assert chat["prefix"] + "Q" + chat["suffix"] == ref


def test_export_refuses_an_irreducible_template_in_one_line(tmp_path):
    res = _export(_ckpt(tmp_path, "{{ messages[0].content }}{{ messages[0].content }}"), tmp_path / "out")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "tokenizer_config.json" in lines[0] and "chat_template" in lines[0], res.stderr
    assert not (tmp_path / "out").exists()


def test_no_template_no_chat(tmp_path):
    ckpt = synth(tmp_path / "ck", **TINY)
    res = _export(ckpt, tmp_path / "out")
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["chat"] is None
