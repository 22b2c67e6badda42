"""A prefill block's attention in lanes (format 1.4): given a parallel_for, up to ATTN_LANES tokens of a block
attend at once, each on its own row of the scores buffer. The demo's pthread pool at 1, 2, 3 and 7 threads
gives the one-thread tokens and logits bit for bit on a prompt long enough to take the parallel path (f32, f16
and int8 KV caches; gpt-oss's sinks and sliding-window rings), and those logits equal single steps through the
binding, which has no parallel_for. The header's minor and prefill block are read by tests/blobread.py."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from colibri.runtime import load

from blobread import header
from conftest import synth

SHAPE = dict(layers=2, hidden=64, ffn=64, heads=4, kv_heads=2, experts=4, top_k=2, vocab=256, seed=31, dtype="f32")
PROMPT = [(i * 37 + 5) % 256 for i in range(150)]  # a block of 128 and one of 22


def _demo(out, threads: int, prompt: list[int] = PROMPT) -> tuple[str, np.ndarray]:
    res = subprocess.run([out / "colibri_demo", "--tokens", ",".join(map(str, prompt)), "--generate", "4",
                          "--threads", str(threads), "--print-logits"], capture_output=True, text=True, check=True,
                         timeout=120)
    lines = dict(x.partition(": ")[::2] for x in res.stdout.splitlines())
    return lines["tokens"], np.array([float(v) for v in lines["logits"].split(",")], dtype=np.float32)


@pytest.mark.parametrize("arch, kv", [(None, "f32"), (None, "f16"), (None, "int8"), ("gpt-oss", "f32")])
def test_attention_lanes_give_the_same_bits(arch, kv, tmp_path, build_model):
    ckpt = synth(tmp_path / "m", **SHAPE, **({"arch": arch} if arch else {}))
    out = build_model(ckpt, "int8c", "host", "PREFILL_BLOCK=128", "MAX_SEQ=200", f"KV={kv}")
    h = header((out / "model.bin").read_bytes())
    assert (h["version_minor"], h["prefill_block"]) == (4, 128)
    tokens, logits = _demo(out, 1)
    for threads in (2, 3, 7):
        t, lg = _demo(out, threads)
        assert t == tokens and np.array_equal(lg, logits), f"{threads} threads differ from one"
    m = load(out / "model.bin")
    for t in PROMPT:
        step = m.forward([t])
    assert np.array_equal(step, logits), "the demo's prefill differs from single steps"


# One token's attention (decode, or a prefill block's last token alone) splits its heads over the threads once
# the step's multiply-adds pass the runtime's parallel threshold (16384: here 8 heads x 32 x positions, from
# position 63), on up to the blob's attention lanes. Blocks of 32, 32 and 1: the prompt's logits at position 64
# come from such a step.
SPLIT_SHAPE = dict(SHAPE, hidden=256, heads=8, kv_heads=2)
SPLIT_PROMPT = [(i * 53 + 7) % 256 for i in range(65)]


@pytest.mark.parametrize("arch, kv", [(None, "f16"), ("gpt-oss", "f32")])
def test_one_token_heads_split_gives_the_same_bits(arch, kv, tmp_path, build_model):
    ckpt = synth(tmp_path / "m", **SPLIT_SHAPE, **({"arch": arch} if arch else {}))
    out = build_model(ckpt, "int8c", "host", "PREFILL_BLOCK=32", "MAX_SEQ=100", f"KV={kv}")
    assert header((out / "model.bin").read_bytes())["prefill_block"] == 32
    tokens, logits = _demo(out, 1, SPLIT_PROMPT)
    for threads in (2, 3, 7):
        t, lg = _demo(out, threads, SPLIT_PROMPT)
        assert t == tokens and np.array_equal(lg, logits), f"{threads} threads differ from one"
    m = load(out / "model.bin")
    for t in SPLIT_PROMPT:
        step = m.forward([t])
    assert np.array_equal(step, logits), "the demo's steps differ from the binding's"
