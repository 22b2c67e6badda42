"""int8c against plain int8, and the bits it costs."""

from __future__ import annotations

import numpy as np

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.quantize import quantize, relative_error
from colibri.codegen.spec import canonical_names

from conftest import synth

QUANTIZED = ("attn.q", "attn.k", "attn.v", "attn.o", "gate", "down", "up", "embed", "lm_head")


def test_int8c_beats_int8_on_every_tensor_of_heavy_tailed_checkpoint(tmp_path):
    ckpt = synth(tmp_path / "heavy", layers=2, hidden=128, ffn=256, heads=4, kv_heads=2, experts=4, top_k=2,
                 vocab=256, seed=5, heavy_tail=True)
    c = open_checkpoint(ckpt)
    bits = n = 0
    for name in canonical_names(c.spec):
        if not name.endswith(QUANTIZED):
            continue
        w = c.get(name)
        q8 = quantize(w, "int8")
        q8c = quantize(w, "int8c")
        e8 = relative_error(w, q8.dequantize())
        e8c = relative_error(w, q8c.dequantize())
        assert e8c < e8, f"{name}: int8c error {e8c:.3g} not below int8 {e8:.3g}"
        bits += q8c.payload_bits()
        n += w.size
    assert bits / n < 8.5, f"int8c costs {bits / n:.3f} bits per weight"


def test_group_scales_and_outliers_reconstruct():
    rng = np.random.default_rng(0)
    w = rng.standard_t(3, size=(37, 75)).astype(np.float32)
    q = quantize(w, "int8c", group_size=16, outlier_frac=0.01)
    assert q.n_groups == 5 and q.scales.shape == (37, 5)
    assert q.n_outliers == int(0.01 * w.size)
    assert np.all(np.diff(q.oidx.astype(np.int64)) > 0)
    # every entry is within half a quantization step of its group, except the corrected ones
    err = np.abs(w - q.dequantize())
    step = np.repeat(q.scales.astype(np.float32), 16, axis=1)[:, :75]
    assert np.all(err <= step * 0.5 + 1e-3 * np.abs(w) + 1e-7)


def test_quantizer_is_deterministic():
    rng = np.random.default_rng(1)
    w = rng.standard_t(3, size=(64, 96)).astype(np.float32)
    a, b = quantize(w, "int8c"), quantize(w.copy(), "int8c")
    assert a.data.tobytes() == b.data.tobytes() and a.oidx.tobytes() == b.oidx.tobytes()
    assert a.scales.tobytes() == b.scales.tobytes() and a.oval.tobytes() == b.oval.tobytes()


def test_outlier_gaps_bridge_long_distances():
    from colibri.codegen.quantize import MAX_GAP, encode_outliers

    idx = np.array([0, 5, 5 + MAX_GAP, 5 + 3 * MAX_GAP + 7, 400_000], dtype=np.uint32)
    val = np.arange(1, 6, dtype=np.float16)
    gaps, vals = encode_outliers(idx, val)
    decoded = np.cumsum(gaps.astype(np.int64))
    assert np.all(gaps[1:] >= 1)
    assert np.array_equal(decoded[vals != 0], idx) and np.array_equal(vals[vals != 0], val)
    assert gaps.size > idx.size  # fillers were needed
