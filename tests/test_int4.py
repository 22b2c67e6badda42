"""int4 and int4c (issue 20): the quantizer, the blob, and the runtime end to end.

int4: values in [-8, 7], one f16 scale per 32 inputs, searched per group; int4c adds sparse fp16
corrections. The runtime multiplies both with int8 activations (runtime_c/test/kernels_q4_test.c holds the
kernels to their scalar definition on every target; tests/test_kernels.py and test_firmware_kernels.py run it).
Here: what the exporter writes, read back by tests/blobread.py (an independent reader), against the numpy
reference run on those weights; prefill against single steps; thread counts; every Linux target's bits;
and int4c against int4 on a heavy-tailed checkpoint.
"""

from __future__ import annotations

import struct
import subprocess
import zlib

import numpy as np
import pytest
from ties import TieWatch

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.quantize import INT4C_OUTLIER_FRAC, quantize, relative_error
from colibri.codegen.reference import Reference
from colibri.codegen.spec import canonical_names
from colibri.codegen.stream import tensor_quant
from colibri.runtime import ColibriError, load
from colibri.toolchain.targets import all_targets

from blobread import canonical_name as blob_name
from blobread import entries as blob_entries
from blobread import header as blob_header
from blobread import weights as blob_weights
from conftest import BIN, GOLDEN, require_target, synth

PROMPT = [3, 17, 42, 5, 9]
N_GREEDY = 24
LOGIT_PROMPTS = 8
CROSS = [t.name for t in all_targets() if t.kind == "linux" and t.name != "host"]
E_DTYPE = 19  # colibri.h COLIBRI_E_DTYPE
E_BAD_TENSOR = 8


def _q4_0(w: np.ndarray) -> np.ndarray:
    """llama.cpp's Q4_0 written out from its definition (d = signed max / -8, q = round(x / d) + 8
    clamped to [0, 15], d stored f16), dequantized: the plain 4-bit baseline."""
    g = w.reshape(w.shape[0], -1, 32)
    peak = np.take_along_axis(g, np.argmax(np.abs(g), axis=2)[..., None], axis=2)
    d = (peak / -8.0).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(np.trunc(np.where(d != 0, g / d, 0.0) + 8.5), 0, 15) - 8
    return (d * q).reshape(w.shape)


def _offset4(w: np.ndarray) -> np.ndarray:
    """Asymmetric 4-bit with an f16 scale and an f16 minimum per 32 (llama.cpp's Q4_1, 5.0 bits a weight)."""
    g = w.reshape(w.shape[0], -1, 32)
    lo, hi = g.min(axis=2, keepdims=True), g.max(axis=2, keepdims=True)
    s = ((hi - lo) / 15.0).astype(np.float16).astype(np.float32)
    m = lo.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(np.rint(np.where(s > 0, (g - m) / s, 0.0)), 0, 15)
    return (q * s + m).reshape(w.shape)


def _matrices():
    rng = np.random.default_rng(5)
    return {"gauss": rng.standard_normal((128, 256)).astype(np.float32),
            "student_t3": rng.standard_t(3, (128, 256)).astype(np.float32)}


@pytest.mark.parametrize("kind", ["gauss", "student_t3"])
def test_int4_is_4bit_and_beats_q4_0(kind):
    w = _matrices()[kind]
    qt = quantize(w, "int4")
    assert qt.data.min() >= -8 and qt.data.max() <= 7 and qt.group_size == 32
    assert qt.scales.shape == (128, 8) and qt.scales.dtype == np.float16
    assert qt.bits_per_weight() == pytest.approx(4.5)
    # the searched scale must do better than Q4_0's fixed one, by a margin (measured: 6% gauss, 3% t3)
    assert relative_error(w, qt.dequantize()) <= 0.98 * relative_error(w, _q4_0(w))


@pytest.mark.parametrize("kind", ["gauss", "student_t3"])
def test_int4c_default_stays_under_4_6_bits_and_corrects(kind):
    w = _matrices()[kind]
    qt = quantize(w, "int4c")
    assert qt.n_outliers == int(INT4C_OUTLIER_FRAC * w.size)
    # everything counted: 4-bit values, f16 scales, u16 gaps and f16 values (filler entries included)
    assert qt.payload_bits() == 4 * w.size + 16 * 128 * 8 + 32 * qt.n_outliers
    assert qt.bits_per_weight() <= 4.6
    assert relative_error(w, qt.dequantize()) < relative_error(w, quantize(w, "int4").dequantize())


@pytest.mark.parametrize("kind", ["gauss", "student_t3"])
def test_symmetric_beats_offset_at_equal_bits(kind):
    """Why int4 has no minimum: an f16 minimum a group costs 0.5 bits a weight (5.0 in all); int4c spending
    the same bits on corrections (4.5 + 0.5) has the lower error on zero-centred weights."""
    w = _matrices()[kind]
    same_bits = quantize(w, "int4c", outlier_frac=0.5 / 32)
    assert same_bits.bits_per_weight() <= 5.0
    assert relative_error(w, same_bits.dequantize()) < 0.95 * relative_error(w, _offset4(w))


@pytest.mark.parametrize("cols", [256, 100])
def test_plain_int4_from_int4c_is_int4s_own_search(cols):
    """quantize_report's int4 comparison re-searches only the groups holding one of int4c's corrections
    (_int4_plain): its values, scales and error are quantize(w, "int4")'s, bit for bit, with rows that
    end in a partial group (100 columns) and corrections there; and its scales fall back to float32 as
    int4's do when one would not be a normal float16."""
    from colibri.codegen.quantize import _int4_plain, quantize_measured, quantize_report

    w = np.random.default_rng(9).standard_t(3, (64, cols)).astype(np.float32)
    w[:, -4:-1] *= 0.01  # the last group: one entry standing far above the others (a correction there)
    w[5, :40] *= 1e-6  # tiny groups: scales below float16's normal range
    ref, ref_err = quantize_measured(w, "int4")
    assert ref.scales.dtype == np.float32
    in_last = 0
    for frac in (INT4C_OUTLIER_FRAC, 0.1):
        m = quantize_report(w, "int4c", outlier_frac=frac, plain=True)
        assert m.qt.n_outliers > 0
        in_last += int(np.count_nonzero(m.qt.oidx % cols >= (cols - 1) // 32 * 32))
        assert m.plain_sq_err == ref_err
        mine = _int4_plain(w, m.qt)
        assert mine.scales.dtype == np.float32
        assert np.array_equal(mine.data, ref.data) and np.array_equal(mine.scales, ref.scales)
    assert in_last > 0


# ---- heavy tails: int4c against int4, per tensor and end to end

HEAVY = dict(layers=2, hidden=64, ffn=96, heads=4, kv_heads=2, experts=4, top_k=2, vocab=128, seed=31)
# measured when written: int4c's weight error is 0.72-0.85x int4's per tensor; its mean KL over 1,000
# positions 0.75x int4's on this checkpoint (0.70-0.76 on seeds 31-33). Fewer positions are too noisy: over
# 72 the order can flip, a few positions carry most of the KL of a random model.
TENSOR_RATIO_MAX = 0.93
KL_RATIO_MAX = 0.85


@pytest.fixture(scope="module")
def heavy_ckpt(tmp_path_factory):
    return synth(tmp_path_factory.mktemp("heavy") / "heavy", heavy_tail=True, **HEAVY)


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    p = np.exp(p_logits - p_logits.max()).astype(np.float64)
    q = np.exp(q_logits - q_logits.max()).astype(np.float64)
    p, q = p / p.sum(), q / q.sum()
    return float(np.sum(p * (np.log(p) - np.log(q))))


def test_int4c_beats_int4_on_a_heavy_tailed_checkpoint(heavy_ckpt, golden_ckpts, build_model, tmp_path):
    c = open_checkpoint(heavy_ckpt)
    src = {n: c.get(n) for n in canonical_names(c.spec)}
    quantized = [n for n in src if tensor_quant(n, "int4") == "int4"]
    assert len(quantized) > 10
    for name in quantized:
        e4 = relative_error(src[name], quantize(src[name], "int4").dequantize().reshape(src[name].shape))
        e4c = relative_error(src[name], quantize(src[name], "int4c").dequantize().reshape(src[name].shape))
        assert e4c <= TENSOR_RATIO_MAX * e4, f"{name}: int4c {e4c:.4g} vs int4 {e4:.4g}"
    kl = {}
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, c.spec.vocab, 25).tolist() for _ in range(40)]
    ref = Reference(c.spec, src, max_seq=64)
    want = []
    for s in seqs:
        ref.reset()
        want.append([ref.forward([t]) for t in s])
    runtime = build_model(golden_ckpts["mixtral_f16"], "int4c") / "libcolibri.so"  # the generic runtime
    for quant in ("int4", "int4c"):
        out = tmp_path / quant
        subprocess.run([str(BIN / "colibri"), "export", str(heavy_ckpt), "-o", str(out), "--quant", quant,
                        "--no-predict"], check=True, capture_output=True)
        m = load(out / "model.bin", runtime)
        total, n = 0.0, 0
        for s, w_seq in zip(seqs, want, strict=True):
            m.reset()
            for t, w_logits in zip(s, w_seq, strict=True):
                total += _kl(w_logits, m.forward([t]))
                n += 1
        kl[quant] = total / n
    assert kl["int4c"] <= KL_RATIO_MAX * kl["int4"], kl


# ---- the runtime end to end


def _prompt(vocab: int) -> list[int]:
    return [t % vocab for t in PROMPT]


@pytest.mark.parametrize("case", ["gqa_top2", "mixtral_f16"])  # hidden 44 (a partial block) and 64
def test_int4c_greedy_equals_reference_on_its_weights(case, golden_ckpts, build_model):
    ckpt = golden_ckpts[case]
    out = build_model(ckpt, "int4c")
    raw = (out / "model.bin").read_bytes()
    h = blob_header(raw)
    assert (h["version_major"], h["version_minor"]) == (1, 4 if h["prefill_block"] > 1 else 3) and h["xq_offset"] != 0
    entries = {blob_name(e): e for e in blob_entries(raw)}
    dtypes = {n: e["dtype"] for n, e in entries.items()}
    v = {n for n in dtypes if n.endswith(".attn.v")}
    assert v and {dtypes[n] for n in v} == {4}, dtypes  # the V projections int8c
    assert {d for n, d in dtypes.items() if n not in v} == {1, 6}, dtypes  # f32 norms/router/rope, int4c
    for n, e in entries.items():  # K: ten times the corrections of the other int4c matrices (0.001)
        if e["dtype"] == 6:
            frac = 0.01 if n.endswith(".attn.k") else 0.001
            assert e["n_outliers"] == int(frac * e["rows"] * e["cols"]), (n, e["n_outliers"])
    spec = open_checkpoint(ckpt).spec
    deq = blob_weights(out / "model.bin")
    deq.quantize_activations = watch = TieWatch()
    ref = Reference(spec, deq, max_seq=256)
    prompt = _prompt(spec.vocab)
    want_tokens = ref.generate(prompt, N_GREEDY)
    # the logits of a few prompts; a prompt on which the reference met an activation on a rounding tie
    # (tests/ties.py) is left out of the float bound, and half must be in
    prompts = [[(t * (1 + 3 * i) + i) % spec.vocab for t in PROMPT] for i in range(LOGIT_PROMPTS)]
    want = {}
    for p in prompts:
        ref.reset()
        watch.reset()
        logits = ref.forward(p)
        if not watch.near_tie:
            want[tuple(p)] = logits
    assert len(want) >= LOGIT_PROMPTS // 2, f"{case}: {LOGIT_PROMPTS - len(want)} prompts met a rounding tie"
    for how, m in {"embedded": load(out / f"libcolibri_{out.name}.so"), "generic": load(out / "model.bin")}.items():
        assert m.generate(prompt, N_GREEDY) == want_tokens, f"{case} {how}: greedy tokens differ"
        for p, want_logits in want.items():
            m.reset()
            got = m.forward(list(p))
            assert float(np.max(np.abs(got - want_logits))) <= 1e-4 * float(np.max(np.abs(want_logits))), (how, p)


def test_int4c_prefill_equals_single_steps(golden_ckpts, build_model):
    out = build_model(golden_ckpts["gqa_top2"], "int4c", "host", "PREFILL_BLOCK=32", "MAX_SEQ=128")
    m = load(out / "model.bin")
    prompt = _prompt(m.vocab) * 11  # 55 tokens: a block of 32 and one of 23
    batch = m.forward(prompt)
    m.reset()
    for t in prompt:
        step = m.forward([t])
    assert np.array_equal(batch, step), "prefill differs from single steps"


def _printed(argv: list, *extra: str) -> list[str]:
    res = subprocess.run([*map(str, argv), "--tokens", "3,17,42,5", "--generate", "10", "--print-logits", *extra],
                         capture_output=True, text=True, check=True, timeout=300)
    return [x for x in res.stdout.splitlines() if x.startswith(("tokens: ", "logits: "))]


def test_int4c_threads_give_the_same_bits(golden_ckpts, build_model):
    out = build_model(golden_ckpts["mixtral_f16"], "int4c")
    runs = {t: _printed([out / "colibri_demo"], "--threads", str(t)) for t in (1, 2, 3, 7)}
    assert len(runs[1]) == 2
    for t, lines in runs.items():
        assert lines == runs[1], f"{t} threads differ from one"


INT4_SHAPE = dict(layers=2, hidden=48, ffn=80, heads=4, kv_heads=2, experts=4, top_k=2, vocab=75, seed=27)


def test_int4c_gives_the_same_bits_on_every_target(tmp_path_factory, build_model):
    """Every Linux target's SIMD build and a scalar host build print the same logits, bit for bit."""
    ckpt = synth(tmp_path_factory.mktemp("q4") / "q4m", **INT4_SHAPE)
    runs = {}
    for target in ["host", *CROSS]:
        require_target(target)
    for extra, targets in (((), ["host", *CROSS]), (("KERNELS=scalar",), ["host"])):
        outs = build_model.many(ckpt, "int4c", targets, *extra, only=("colibri_demo",))[0]
        for target, out in outs.items():
            res = subprocess.run([str(BIN / "colibri"), "run", "--target", target, str(out / "colibri_demo"), "--",
                                  "--tokens", "3,17,42", "--generate", "8", "--print-logits"],
                                 capture_output=True, text=True, timeout=300)
            assert res.returncode == 0, f"{target}: {res.stderr}"
            runs[f"{target} {' '.join(extra)}"] = [x for x in res.stdout.splitlines()
                                                   if x.startswith(("tokens: ", "logits: "))]
    first = runs["host "]
    assert len(first) == 2
    for name, lines in runs.items():
        assert lines == first, f"{name} differs from the host build"


# ---- the blob: a dtype the runtime has no kernel for


def _restamp(b: bytearray) -> bytes:
    struct.pack_into("<I", b, 8, zlib.crc32(bytes(b[12:])))
    return bytes(b)


def test_unknown_dtype_is_refused_with_its_own_status(golden_ckpts, build_model, tmp_path):
    out = build_model(golden_ckpts["mixtral_f16"], "int4c")
    raw = bytearray((out / "model.bin").read_bytes())
    first_int4 = next(i for i, e in enumerate(blob_entries(bytes(raw))) if e["dtype"] == 6)
    # 7 (raw bytes) is a code the runtime knows, not one a matrix takes; 9 and up are past its last (8, int16)
    for code, status in ((9, E_DTYPE), (255, E_DTYPE), (7, E_BAD_TENSOR), (0, E_BAD_TENSOR)):
        b = bytearray(raw)
        b[256 + 64 * first_int4 + 6] = code
        path = tmp_path / f"dtype{code}.bin"
        path.write_bytes(_restamp(b))
        with pytest.raises(ColibriError) as e:
            load(path, out / "libcolibri.so").forward([1])
        assert e.value.status == status, (code, e.value)


def test_runtime_specialised_to_int8c_has_no_int4(golden_ckpts, build_model):
    """A runtime specialised to an int8c model is built without the int4 kernels (model.h COLIBRI_INT4 0)
    and refuses an int4c blob of the same model with COLIBRI_E_DTYPE; the generic runtime runs that blob,
    and so does the int4c model's own specialised runtime."""
    out8 = build_model(golden_ckpts["mixtral_f16"], "int8c")
    out4 = build_model(golden_ckpts["mixtral_f16"], "int4c")
    assert "#define COLIBRI_INT4 0" in (out8 / "include" / "model.h").read_text()
    with pytest.raises(ColibriError) as e:
        load(out4 / "model.bin", out8 / f"libcolibri_{out8.name}.so").forward([1])
    assert e.value.status == E_DTYPE, e.value
    want = load(out4 / "model.bin", out8 / "libcolibri.so").forward([1])
    got = load(out4 / "model.bin", out4 / f"libcolibri_{out4.name}.so").forward([1])
    assert np.array_equal(want, got)


def test_int4_without_integer_matmuls_is_refused(golden_ckpts, build_model, tmp_path):
    """An int4 tensor in a blob without the xq buffer (no integer matmul plan) has no kernel: BAD_TENSOR."""
    out = build_model(golden_ckpts["mixtral_f16"], "int4c")
    b = bytearray((out / "model.bin").read_bytes())
    struct.pack_into("<Q", b, 248, 0)
    struct.pack_into("<I", b, 32, 1)  # row-major: the only layout of a blob without integer matmuls
    path = tmp_path / "noxq.bin"
    path.write_bytes(_restamp(b))
    with pytest.raises(ColibriError) as e:
        load(path, out / "libcolibri.so").forward([1])
    assert e.value.status in (E_BAD_TENSOR,), e.value


def test_export_prints_int4c_against_int4(golden_ckpts, tmp_path):
    res = subprocess.run([str(BIN / "colibri"), "export", str(golden_ckpts["mixtral_f16"]), "-o", str(tmp_path / "o"),
                          "--quant", "int4c", "--no-predict"], capture_output=True, text=True, check=True)
    text = res.stdout + res.stderr
    lines = [x for x in text.splitlines() if ".moe.experts.0.gate" in x]
    assert lines and "int4c" in lines[0] and "b/w" in lines[0] and "(int4 " in lines[0], text
    assert "int4c" in next(x for x in text.splitlines() if x.startswith("model "))


assert set(GOLDEN) >= {"gqa_top2", "mixtral_f16"}


# bench/hf_checkpoints.py's model (issue 20's checkpoints): K and V are 1.9% of its weights
HF_SHAPE = dict(layers=4, hidden=256, ffn=512, heads=8, kv_heads=4, experts=8, top_k=2, vocab=1024, seed=3)
ELEM_BITS = {1: 32, 2: 16, 3: 8, 4: 8, 5: 4, 6: 4}  # FORMAT.md's dtype codes, written out here
SCALE_BITS = {0: 0, 1: 32, 2: 16}


def test_int4c_model_stays_under_4_6_bits(tmp_path):
    """Issue 20's budget, counted over every weight of the model from the blob's own table: each matrix's
    values, scales and corrections (u16 gap + f16 value each), norms and router in f32. int4c: at most 4.6
    bits a weight (llama.cpp's Q4_0 is 4.635 on that model); K and V both 8-bit would be 4.62."""
    ckpt = synth(tmp_path / "hf", **HF_SHAPE)
    out = tmp_path / "out"
    subprocess.run([str(BIN / "colibri"), "export", str(ckpt), "-o", str(out), "--quant", "int4c", "--no-predict"],
                   check=True, capture_output=True)
    bits = weights = 0
    for e in blob_entries((out / "model.bin").read_bytes()):
        if e["dtype"] not in ELEM_BITS or blob_name(e) == "rope_freq":
            continue  # the tokenizer's and parameters' bytes, the rotary frequencies: not weights
        n = e["rows"] * e["cols"]
        groups = -(-e["cols"] // e["group_size"]) if e["scale_dtype"] else 0
        bits += n * ELEM_BITS[e["dtype"]] + e["rows"] * groups * SCALE_BITS[e["scale_dtype"]] + 32 * e["n_outliers"]
        weights += n
    assert weights == 13_904_128
    assert bits / weights <= 4.6, bits / weights
