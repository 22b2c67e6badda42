"""The C tokenizer (runtime_c/src/text/tok.c, through colibri.runtime.text) against HF `tokenizers` on
real vocabularies (llama.cpp's test vocabularies, see tests/tokvocab.py): the same ids as
encode(add_special_tokens=False) and the same decoded text on 400+ strings per tokenizer type, and
llama.cpp's own expected ids where transformers' conversion reproduces them."""

from __future__ import annotations

import pytest

from colibri.codegen.errors import ExportError
from colibri.codegen.tokenizer import load_tokenizer, pack
from colibri.runtime.text import Tokenizer, TokenizerError

from tokvocab import MODELS, build_lib, gguf_to_hf, llamacpp_cases, strings, variant

pytestmark = pytest.mark.skipif(not MODELS.is_dir(), reason=f"{MODELS} missing: run `bash toolchain/dev.sh setup`")

# vocabulary -> how many of llama.cpp's expected ids transformers' GGUF conversion reproduces (checked
# below): only a conversion that reproduces all of them also stands for llama.cpp itself.
GGUF = {"gpt-2": True, "llama-bpe": False, "qwen2": True, "llama-spm": False}


def _ignore_merges(j):
    j["model"]["ignore_merges"] = True


def _nfc(j):
    j["normalizer"] = {"type": "NFC"}


def _spm_normalizer(j):  # Mixtral / Llama 2's own tokenizer.json: the metaspace as normalizers
    j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                            {"type": "Replace", "pattern": {"String": " "},
                                                             "content": "\u2581"}]}
    j["pre_tokenizer"] = None


# the tokenizer types under test: (gguf vocabulary, tokenizer.json edit) - the edits give the real
# models' settings the conversion drops (Llama 3's ignore_merges, Qwen2's NFC, Mixtral's normalizer)
TYPES = {
    "gpt2": ("gpt-2", None),
    "llama-spm-metaspace": ("llama-spm", None),
    "llama-spm-normalizer": ("llama-spm", _spm_normalizer),
    "llama3": ("llama-bpe", None),
    "llama3-ignore-merges": ("llama-bpe", _ignore_merges),
    "qwen2": ("qwen2", None),
    "qwen2-nfc": ("qwen2", _nfc),
}


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokvocab")
    base = {g: gguf_to_hf(g, root / g) for g in sorted({g for g, _ in TYPES.values()})}
    out = {}
    for name, (g, edit) in TYPES.items():
        out[name] = base[g] if edit is None else variant(base[g], root / name, edit)
    return out


@pytest.fixture(scope="session")
def textlib(tmp_path_factory):
    return build_lib(tmp_path_factory.mktemp("textlib"))


class _Sections(dict):
    """name -> its packed section, packed when first asked for"""

    def __init__(self, dirs):
        super().__init__()
        self.dirs = dirs

    def __missing__(self, name):
        self[name] = pack(load_tokenizer(self.dirs[name]))
        return self[name]


@pytest.fixture(scope="session")
def sections(hf_dirs):
    return _Sections(hf_dirs)


def _hf(d):
    from tokenizers import Tokenizer as HF

    return HF.from_file(str(d / "tokenizer.json"))


@pytest.mark.parametrize("gguf", sorted(GGUF))
def test_conversion_against_llamacpp(hf_dirs, textlib, sections, gguf):
    """transformers' conversion (and so the C tokenizer) against llama.cpp's expected ids: all of them
    where GGUF[gguf] says the conversion is faithful; the C tokenizer always equals HF on them."""
    name = next(n for n, (g, e) in TYPES.items() if g == gguf and e is None)
    hf, tok = _hf(hf_dirs[name]), Tokenizer.from_bytes(textlib, sections[name])
    cases = llamacpp_cases(gguf)
    assert len(cases) >= 40
    hf_ok = sum(hf.encode(s, add_special_tokens=False).ids == ids for s, ids in cases)
    c_ok = sum(tok.encode(s) == ids for s, ids in cases)
    assert c_ok == hf_ok
    if GGUF[gguf]:
        assert hf_ok == len(cases)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_same_ids_and_text_as_hf(hf_dirs, textlib, sections, name):
    hf, tok = _hf(hf_dirs[name]), Tokenizer.from_bytes(textlib, sections[name])
    texts = strings()
    assert len(texts) >= 300
    mismatched = []
    for s in texts:
        want = hf.encode(s, add_special_tokens=False).ids
        got = tok.encode(s)
        if got != want:
            mismatched.append((s, want[:16], got[:16]))
            continue
        if hf.decode(want, skip_special_tokens=False) != tok.decode(got):
            mismatched.append((s, hf.decode(want, skip_special_tokens=False), tok.decode(got)))
    assert not mismatched, f"{len(mismatched)} of {len(texts)} differ, first: {mismatched[:3]}"


def test_parse_special(hf_dirs, textlib, sections):
    """special tokens in the text: matched whole by default (as HF), plain text without parse_special"""
    hf, tok = _hf(hf_dirs["llama3"]), Tokenizer.from_bytes(textlib, sections["llama3"])
    text = "<|begin_of_text|>Hi<|end_of_text|>"
    assert tok.encode(text) == hf.encode(text, add_special_tokens=False).ids
    assert tok.encode(text)[0] == 128000
    plain = tok.encode(text, parse_special=False)
    assert 128000 not in plain and 128001 not in plain
    assert tok.decode(plain) == text
    # HF's own "plain text" mode for special tokens
    hf.encode_special_tokens = True
    assert plain == hf.encode(text, add_special_tokens=False).ids


def test_special_adds_bos(hf_dirs, textlib, sections):
    for name in ("llama-spm-metaspace", "gpt2"):
        hf, tok = _hf(hf_dirs[name]), Tokenizer.from_bytes(textlib, sections[name])
        for text in ("Hello", "", "a<s>b"):
            assert tok.encode(text, special=True) == hf.encode(text, add_special_tokens=True).ids, (name, text)
    assert Tokenizer.from_bytes(textlib, sections["llama-spm-metaspace"]).encode("Hello", special=True)[0] == 1


def test_invalid_utf8_as_replacement(hf_dirs, textlib, sections):
    """invalid UTF-8: each maximal invalid subpart is U+FFFD, as bytes.decode('utf-8', 'replace') gives HF"""
    for name in ("qwen2", "llama-spm-metaspace"):
        hf, tok = _hf(hf_dirs[name]), Tokenizer.from_bytes(textlib, sections[name])
        for raw in (b"ab\xffcd", b"\xe2\x82", b"x\xe2\x82y", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80z",
                    b"\x80\x80 \xf0\x9f\x98"):
            assert tok.encode(raw) == hf.encode(raw.decode("utf-8", "replace"), add_special_tokens=False).ids, raw


def test_prompt_longer_than_buffer_is_an_error(textlib, sections):
    tok = Tokenizer.from_bytes(textlib, sections["gpt2"])
    ids = tok.encode("one two three four")
    assert len(ids) == 4
    assert tok.encode("one two three four", max_ids=4) == ids
    with pytest.raises(TokenizerError) as e:
        tok.encode("one two three four", max_ids=3)
    assert e.value.status == -104


def test_section_cut_short_or_corrupt_is_an_error(textlib, sections):
    sec = sections["gpt2"]
    for cut in (0, 8, 63, 64, 1000, len(sec) // 2, len(sec) - 4):
        with pytest.raises(TokenizerError) as e:
            Tokenizer.from_bytes(textlib, sec[:cut])
        assert e.value.status in (-101, -102, -103), cut
    Tokenizer.from_bytes(textlib, sec)  # the whole section is accepted


def test_missing_merge_rank_refused(hf_dirs, tmp_path):
    def drop(j):
        j["model"]["merges"][5] = ["\u0120t", "nosuchtoken"]

    d = variant(hf_dirs["gpt2"], tmp_path / "bad", drop)
    with pytest.raises(ExportError, match=r"merges\[5\].*not in the vocabulary"):
        load_tokenizer(d)


@pytest.mark.parametrize("edit,component", [
    (lambda j: j.__setitem__("normalizer", {"type": "Lowercase"}), "normalizer Lowercase"),
    (lambda j: j["model"].__setitem__("type", "Unigram"), "model Unigram"),
    (lambda j: j.__setitem__("pre_tokenizer", {"type": "Whitespace"}), "pre_tokenizer Whitespace"),
    (lambda j: j["pre_tokenizer"]["pretokenizers"][0]["pattern"].__setitem__("Regex", r"\w+"), "pre_tokenizer Split"),
])
def test_unsupported_component_refused(hf_dirs, tmp_path, edit, component):
    d = variant(hf_dirs["llama3"], tmp_path / "u", edit)
    with pytest.raises(ExportError, match=f"unsupported tokenizer component: {component}"):
        load_tokenizer(d)
