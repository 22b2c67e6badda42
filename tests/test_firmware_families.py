"""A dense model and a Granite-MoE model, both written by transformers' save_pretrained, in a firmware image
on stm32h7 and cortex-m55: booted under QEMU, the greedy tokens equal the host build's and the numpy
reference's on the weights the blob holds (int8c, the weights the C runtime computes with)."""

from __future__ import annotations

import json

import pytest
import test_dense
import test_granite
from test_firmware import _boot, _expected_tokens, _model_h, _run_output

from colibri.runtime import load

from conftest import require_target

TARGETS = ["stm32h7", "cortex-m55"]
PROMPT = [1, 2, 3, 4]
# a dense Qwen3 (q/k norms, head_dim != hidden / heads) and a Granite-MoE with a shared MLP (the multipliers,
# fused experts); seeds whose greedy streams do not settle into one repeated token at once (a tiny random
# model often does, and a constant stream would match a broken runtime too: the last assert checks it);
# initializer_range 0.2 rather than transformers' 0.02, so that every block (the shared MLP too) moves
# the logits enough to change greedy tokens when it is left out
FAMILIES = {f: ((cases[f][0], dict(cases[f][1], initializer_range=0.2)), 60)
            for f, cases in (("qwen3", test_dense.CASES), ("granitemoeshared", test_granite.CASES))}


@pytest.fixture(scope="module")
def family_ckpts(tmp_path_factory):
    base = tmp_path_factory.mktemp("fw_families")
    out = {f: test_dense.make_hf(base / f, *case, seed=seed) for f, (case, seed) in FAMILIES.items()}
    for p in out.values():  # the image's built-in prompt
        (p / "colibri.json").write_text(json.dumps({"prompt": PROMPT, "generate": 16}))
    return out


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_in_a_firmware_image(family, target, family_ckpts, build_model):
    require_target(target)
    ckpt = family_ckpts[family]
    out = build_model(ckpt, "int8c", target)
    res = _boot(target, out / f"{out.name}.elf")
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.stdout}\n{res.stderr}"
    tokens, _, _, _ = _run_output(res)
    want = _expected_tokens(ckpt, out, "int8c")
    assert tokens == want, f"{family} on {target}: greedy tokens differ from the reference"
    h = _model_h(out, "int8c")
    prompt = [int(t) for t in h["COLIBRI_DEFAULT_PROMPT"].strip("{} ").split(",")]
    host = load(build_model(ckpt, "int8c") / "model.bin")
    assert host.generate(prompt, int(h["COLIBRI_DEFAULT_GENERATE"])) == tokens, f"{family}: host and {target} differ"
    assert len(set(tokens)) >= 4, f"{family}: {tokens} is too uniform a stream to tell runtimes apart"
