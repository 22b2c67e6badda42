"""A dense model, a Granite-MoE, a gpt-oss and a DeepSeek-V3 (MLA) model, each written by transformers'
save_pretrained, in a firmware image on every firmware target (targets_under_test.firmware()): booted under
QEMU, the greedy tokens equal the host build's and the numpy reference's on the weights the blob holds (int8c
and int4c, the weights the C runtime computes with)."""

from __future__ import annotations

import json

import pytest
import test_dense
import test_gpt_oss
import test_granite
import test_mla
from test_firmware import _boot, _expected_tokens, _model_h, _run_output

from colibri.runtime import load

from conftest import require_target
from targets_under_test import firmware

TARGETS = firmware()
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
    # sinks, biases, alternating sliding (window 5) and full layers, YaRN, the clamped SwiGLU
    "gpt-oss": (("GptOssConfig", dict(test_gpt_oss.CONFIG, **DEMO_SIZE, head_dim=16, intermediate_size=128)), 60),
    # MLA with a q latent, sigmoid routing with the expert bias, a dense first layer and a shared expert
    "deepseek-v3": (("DeepseekV3Config", dict(test_mla.C_CASES["v3_flat"][1], **dict(DEMO_SIZE, num_key_value_heads=4),
                                              moe_intermediate_size=64, intermediate_size=128)), 60),
}


@pytest.fixture(scope="module")
def family_ckpts(tmp_path_factory):
    base = tmp_path_factory.mktemp("fw_families")
    out = {f: test_dense.make_hf(base / f, *case, seed=seed) for f, (case, seed) in FAMILIES.items()}
    for p in out.values():  # the image's built-in prompt
        (p / "colibri.json").write_text(json.dumps({"prompt": PROMPT, "generate": 16}))
    return out


@pytest.mark.parametrize("quant", ["int8c", "int4c"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_in_a_firmware_image(family, quant, family_ckpts, build_model):
    """Every firmware target's image of the family in the quantization, built in one SCons run, booted under
    QEMU; a failure names every target that failed."""
    for t in TARGETS:
        require_target(t)
    ckpt = family_ckpts[family]
    outs = build_model.many(ckpt, quant, TARGETS)[0]
    host = load(build_model(ckpt, quant) / "model.bin")
    failures = []
    for target, out in outs.items():
        res = _boot(target, out / f"{out.name}.elf")
        if res.returncode != 0:
            failures.append(f"{target}: exit {res.returncode} {res.stderr.strip()[-200:]}")
            continue
        tokens, _, _, _ = _run_output(res)
        want = _expected_tokens(ckpt, out, quant)
        h = _model_h(out, quant)
        prompt = [int(t) for t in h["COLIBRI_DEFAULT_PROMPT"].strip("{} ").split(",")]
        host.reset()
        on_host = host.generate(prompt, int(h["COLIBRI_DEFAULT_GENERATE"]))
        if tokens != want:
            failures.append(f"{target}: tokens {tokens} != the reference's {want}")
        elif tokens != on_host:
            failures.append(f"{target}: tokens {tokens} != the host build's {on_host}")
        elif len(set(tokens)) < 4:
            failures.append(f"{target}: {tokens} is too uniform a stream to tell runtimes apart")
    assert not failures, f"{family} {quant}: " + "; ".join(failures)
