"""One token's routed experts in two parallel regions (runtime_c/src/forward.c cb_moe1): every chosen expert's
gate and up as one region, then every down as one, each task a range of output rows through the experts in
increasing index order. With top_k >= 3 the order of an output row's sums shows in its bits, so:

- a prompt prefilled in blocks (the expert-by-expert path) equals the same tokens as single steps (the
  two-region path) bit for bit, through the binding (no parallel_for: one task);
- a one-token prompt through the demo's pthread pool at 1, 2, 3 and 7 threads gives the binding's logits bit
  for bit, and the same generated tokens (decode steps).

Over int8c, int4c and float (f32 weights) matmuls, and a family with a shared expert (qwen2_moe) and one with
top_k 8 of 32 experts (granitemoe's routing).
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from colibri.runtime import load

from conftest import synth

SHAPE = dict(layers=2, hidden=64, ffn=64, heads=4, kv_heads=2, vocab=256, seed=7, dtype="f32")
PROMPT = [(i * 53 + 11) % 256 for i in range(40)]
CASES = [  # (arch, experts, top_k, quantization)
    (None, 8, 4, "int8c"),
    (None, 8, 4, "int4c"),
    (None, 8, 3, "f32"),
    ("qwen2_moe", 8, 4, "int8c"),
    ("granitemoe", 32, 8, "int8c"),
]


def _demo(out, threads: int) -> tuple[str, np.ndarray]:
    res = subprocess.run([out / "colibri_demo", "--tokens", str(PROMPT[0]), "--generate", "12", "--threads",
                          str(threads), "--print-logits"], capture_output=True, text=True, check=True, timeout=120)
    lines = dict(x.partition(": ")[::2] for x in res.stdout.splitlines())
    return lines["tokens"], np.array([float(v) for v in lines["logits"].split(",")], dtype=np.float32)


@pytest.mark.parametrize("arch, experts, top_k, quant", CASES)
def test_one_token_experts_give_the_expert_by_expert_bits(arch, experts, top_k, quant, tmp_path, build_model):
    ckpt = synth(tmp_path / "m", **SHAPE, experts=experts, top_k=top_k, **({"arch": arch} if arch else {}))
    out = build_model(ckpt, quant, "host", "PREFILL_BLOCK=32", "MAX_SEQ=64")
    blocks = load(out / "model.bin").forward(PROMPT)
    m = load(out / "model.bin")
    for t in PROMPT:
        step = m.forward([t])
    assert np.array_equal(step, blocks), "single steps differ from the prompt prefilled in blocks"

    first = load(out / "model.bin").forward([PROMPT[0]])
    tokens, logits = _demo(out, 1)
    assert np.array_equal(logits, first), "the demo's one-token step differs from the binding's"
    for threads in (2, 3, 7):
        t, lg = _demo(out, threads)
        assert t == tokens and np.array_equal(lg, logits), f"{threads} threads differ from one"
