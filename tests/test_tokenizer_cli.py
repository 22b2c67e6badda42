"""`colibri export` compiles tokenizer.json in (or refuses it, or leaves it out with --no-tokenizer), and
`colibri tokenize` / `colibri detokenize` run the C tokenizer on the exported section: the ids HF
`tokenizers` gives for a byte-level BPE trained here (a small, independent tokenizer.json)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, synth
from tokvocab import build_lib, train_bytelevel

VOCAB = 320
TEXTS = ["Hello, world", "123+456=", "héllo wörld 👋", "  spaces\tand\nlines  ", "<|endoftext|>end"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = synth(tmp_path_factory.mktemp("tokckpt") / "tokmodel", layers=1, hidden=16, ffn=24, heads=2, kv_heads=1,
              experts=2, top_k=1, vocab=VOCAB, seed=5)
    return train_bytelevel(d, VOCAB)


@pytest.fixture(scope="module")
def exported(ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("tokexport") / "gen"
    res = subprocess.run([str(BIN / "colibri"), "export", str(ckpt), "-o", str(out), "--no-predict"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return out


def _colibri(*args, env=None):
    return subprocess.run([str(BIN / "colibri"), *args], capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def runtime_env(tmp_path_factory):
    build_lib(tmp_path_factory.mktemp("toklib"))
    so = next(Path(str(tmp_path_factory.getbasetemp())).glob("toklib*/libcolibri_text.so"))
    return {**os.environ, "COLIBRI_RUNTIME": str(so)}


def test_export_writes_the_section(ckpt, exported):
    """The section is the last entry of model.bin (read by the independent blobread.py), not a file beside
    it; the manifest gives its bytes and offset."""
    from colibri.codegen.tokenizer import load_tokenizer, pack

    import blobread

    m = json.loads((exported / "manifest.json").read_text())
    raw = (exported / "model.bin").read_bytes()
    section = blobread.tokenizer_section(raw)
    assert section == pack(load_tokenizer(ckpt)) and len(section) > 0
    assert m["tokenizer"] == {"bytes": len(section), "offset": blobread.entries(raw)[-1]["data_off"]}
    assert not (exported / "tokenizer.bin").exists()


def test_tokenize_detokenize_as_hf(ckpt, exported, runtime_env):
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    for text in TEXTS:
        want = hf.encode(text, add_special_tokens=False).ids
        res = _colibri("tokenize", str(exported / "model.bin"), text, env=runtime_env)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == ",".join(map(str, want)), text
        back = _colibri("detokenize", str(exported / "model.bin"), res.stdout.strip(), env=runtime_env)
        assert back.returncode == 0, back.stderr
        assert back.stdout[:-1] == hf.decode(want, skip_special_tokens=False)
    plain = _colibri("tokenize", str(exported / "model.bin"), "<|endoftext|>", "--no-parse-special", env=runtime_env)
    assert "0" not in plain.stdout.strip().split(",")  # <|endoftext|> is id 0: not matched whole


def test_no_tokenizer_and_refusal(ckpt, tmp_path, runtime_env):
    out = tmp_path / "ids_only"
    res = _colibri("export", str(ckpt), "-o", str(out), "--no-predict", "--no-tokenizer")
    assert res.returncode == 0, res.stderr
    assert not (out / "tokenizer.bin").exists()
    assert json.loads((out / "manifest.json").read_text())["tokenizer"] is None
    res = _colibri("tokenize", str(out / "model.bin"), "hi", env=runtime_env)
    assert res.returncode == 2 and "no tokenizer" in res.stderr and "Traceback" not in res.stderr
    j = json.loads((ckpt / "tokenizer.json").read_text())
    j["normalizer"] = {"type": "Lowercase"}
    bad = tmp_path / "badckpt"
    bad.mkdir()
    for f in ckpt.iterdir():
        (bad / f.name).symlink_to(f) if f.name != "tokenizer.json" else None
    (bad / "tokenizer.json").write_text(json.dumps(j))
    res = _colibri("export", str(bad), "-o", str(tmp_path / "never"), "--no-predict")
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "unsupported tokenizer component: normalizer Lowercase" in res.stderr
    assert not (tmp_path / "never").exists()


def test_binding_through_the_built_runtime(ckpt, exported, build_model):
    """Model.tokenize/detokenize by the SCons-built generic libcolibri.so (the text runtime linked in)"""
    from tokenizers import Tokenizer

    from colibri.runtime import load
    from colibri.runtime.text import TokenizerError

    out = build_model(ckpt, "int8c", "host")
    m = load(exported / "model.bin", runtime=out / "libcolibri.so")
    hf = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    for text in TEXTS:
        ids = m.tokenize(text)
        assert ids == hf.encode(text, add_special_tokens=False).ids
        assert m.detokenize(ids) == hf.decode(ids, skip_special_tokens=False)
    long = "Hello world " * m.max_seq
    with pytest.raises(TokenizerError) as e:  # more ids than max_seq: an error, never a silent cut
        m.tokenize(long)
    assert e.value.status == -104
    assert len(m.tokenize("Hello world " * (m.max_seq // 4))) <= m.max_seq
    # the model library: its linked-in blob carries the same section (no file beside it is read)
    so = out / "libcolibri_tokmodel.so"
    lib_model = load(so)
    assert lib_model.tokenize(TEXTS[0]) == hf.encode(TEXTS[0], add_special_tokens=False).ids
    res = _colibri("tokenize", str(so), TEXTS[2])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == ",".join(map(str, hf.encode(TEXTS[2], add_special_tokens=False).ids))
    assert not list(out.glob("tokenizer.bin"))
