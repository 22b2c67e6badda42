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
# The demo model's size (firmware_examples/models/adder: vocab 260, hidden 64, 2 layers, 4/2 heads, 4 experts
# of 128, about 275 KB of int8c weights): a dense Qwen3 (q/k norms, head_dim 16) with the same 512-wide MLP
# the adder's four experts have, and a Granite-MoE with the adder's experts plus a shared MLP (the four
# multipliers, fused experts on disk). initializer_range 0.2 rather than transformers' 0.02, so that every
# block (the shared MLP too) moves the logits enough to change greedy tokens when it is left out; seeds whose
# greedy streams do not settle into one repeated token (a constant stream would match a broken runtime too:
# the last assert checks it).
DEMO_SIZE = dict(vocab_size=260, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 initializer_range=0.2)
FAMILIES = {
    "qwen3": (("Qwen3Config", dict(test_dense.CASES["qwen3"][1], **DEMO_SIZE, intermediate_size=512)), 60),
    "granitemoeshared": (("GraniteMoeSharedConfig", dict(test_granite.CASES["granitemoeshared"][1], **DEMO_SIZE,
                                                         intermediate_size=128, num_local_experts=4,
                                                         shared_intermediate_size=128)), 60),
}


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
