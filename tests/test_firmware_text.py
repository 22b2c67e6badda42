"""Text on the microcontrollers (issue 16): an image whose colibri.json prompt is a text tokenizes it on the
device with the blob's tokenizer section, giving HF tokenizers' ids (a byte-level BPE trained by HF
tokenizers; the prompt mixes scripts, emoji, digits, whitespace runs and a special token), and prints the
generated text over semihosting as HF decodes the generated ids, the same on stm32h7, cortex-m55 and
rv32imac. An image without a text prompt links none of the tokenizer."""

from __future__ import annotations

import json
import subprocess

import pytest

from colibri.toolchain.targets import load_target

from conftest import BIN, ROOT, synth
from tokvocab import train_bytelevel

TARGETS = ("stm32h7", "cortex-m55", "rv32imac")
PROMPT = "Hello world, héllo wörld 👋🏽 Привет 123+456=\t\n  x<|endoftext|>end 日本"
GENERATE = 5
ADDER = ROOT / "firmware_examples/models/adder"


def _needs(target: str):
    missing = load_target(target).missing()
    return pytest.mark.skipif(bool(missing), reason=f"{target}: {', '.join(missing)} not installed")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = synth(tmp_path_factory.mktemp("fwtext") / "fwtext", layers=1, hidden=16, ffn=24, heads=2, kv_heads=1,
              experts=2, top_k=1, vocab=320, seed=5)
    train_bytelevel(d, 320)
    (d / "colibri.json").write_text(json.dumps({"prompt": PROMPT, "generate": GENERATE}))
    return d


@pytest.fixture(scope="module")
def hf(ckpt):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(ckpt / "tokenizer.json"))


def _boot(target: str, elf) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "colibri"), "run", "--target", target, str(elf)], capture_output=True,
                          timeout=300)


def _lines(stdout: bytes) -> dict[str, bytes]:
    """label -> value of the image's output lines (the text line may hold newlines: it runs to "tokens:")."""
    assert stdout.startswith(b"prompt: "), stdout
    head, rest = stdout.split(b"\ntext: ", 1)
    text, tail = rest.split(b"\ntokens: ", 1)
    lines = tail.split(b"\n")
    return {"prompt": head[len(b"prompt: "):], "text": text, "tokens": lines[0],
            **dict(line.split(b": ", 1) for line in lines[1:] if line)}


_seen: dict[str, bytes] = {}


@pytest.mark.parametrize("target", [pytest.param(t, marks=_needs(t)) for t in TARGETS])
def test_text_prompt_on_the_device(target, ckpt, hf, build_model):
    out = build_model(ckpt, "int8c", target)
    res = _boot(target, out / f"{out.name}.elf")
    assert res.returncode == 0, res.stdout + res.stderr
    got = _lines(res.stdout)
    want = hf.encode(PROMPT, add_special_tokens=False).ids
    assert [int(x) for x in got["prompt"].split(b",")] == want
    tokens = [int(x) for x in got["tokens"].split(b",")]
    assert len(tokens) == GENERATE
    assert got["text"].decode("utf-8") == hf.decode(tokens, skip_special_tokens=False)
    assert b"stack" in got
    _seen[target] = got["tokens"]
    assert len(set(_seen.values())) == 1, _seen  # the same ids on every target run so far


@pytest.mark.parametrize("target", [pytest.param(t, marks=_needs(t)) for t in TARGETS[:1]])
def test_image_without_text_links_no_tokenizer(target, build_model):
    out = build_model(ADDER, "int8c", target)
    elf = out / f"{out.name}.elf"
    nm = subprocess.run(["arm-none-eabi-nm", str(elf)], capture_output=True, text=True, check=True).stdout
    assert "colibri_model_open" in nm  # the symbol table is there
    assert not [line for line in nm.splitlines() if "colibri_tok" in line]
    audit = json.loads((out / f"{out.name}.size.json").read_text())
    assert not [s for s in audit["symbols"] if s["file"].endswith("text/tok.c")]
    assert {c["key"]: c["bytes"] for c in audit["categories"]}["tokenizer"] == 0
