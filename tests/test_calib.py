"""--calib: a calibration set's activation statistics choose a scale migration folded into the weights
(codegen/smooth.py) and weigh int4's scale search and int4c's corrections (codegen/calibrate.py).

The end-to-end checks run the C runtime (host) on the exported blob and compare its logits with the float32
reference of the source checkpoint, on sequences the calibration set does not hold."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from colibri.codegen.calibrate import calibrate
from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.quantize import _int4_groups, quantize
from colibri.codegen.reference import Reference
from colibri.codegen.smooth import SmoothedWeights, Smoothing, migration_scales, norm_groups
from colibri.codegen.spec import canonical_names
from colibri.runtime import load

from conftest import synth
from logit_stats import log_softmax, stepwise
from tokvocab import train_bytelevel

SHAPE = dict(layers=2, hidden=128, ffn=256, heads=4, kv_heads=2, experts=4, top_k=2, vocab=256, seed=11)
N_SEQS, SEQ_LEN = 32, 16
GAIN = 8.0  # the norm weights' outlier channels: activation outliers, as trained LLMs have them


def _act_outliers(ckpt, channels: int = 3):
    """The checkpoint with `channels` channels of every RMSNorm weight multiplied by GAIN."""
    path = ckpt / "model.safetensors"
    t = load_file(path)
    rng = np.random.default_rng(3)
    for k, v in t.items():
        if k.endswith("norm.weight"):
            v = v.copy()
            v[rng.choice(v.size, channels, replace=False)] *= GAIN
            t[k] = v
    save_file(t, path, metadata={"format": "pt"})
    return ckpt


def _calib_file(path, vocab: int, seed: int = 99):
    seqs = np.random.default_rng(seed).integers(0, vocab, size=(48, SEQ_LEN))
    path.write_text("# calibration\n" + "\n".join(" ".join(map(str, s)) for s in seqs) + "\n")
    return path


def _kl(base: np.ndarray, other: np.ndarray) -> float:
    p, q = log_softmax(base), log_softmax(other)
    return float(np.mean(np.sum(np.exp(p) * (p - q), axis=-1)))


def test_migration_leaves_the_float_model_as_it_was(tmp_path):
    ckpt = _act_outliers(synth(tmp_path / "m", **SHAPE))
    c = open_checkpoint(ckpt)
    weights = {n: c.get(n) for n in canonical_names(c.spec)}
    seqs = np.random.default_rng(0).integers(0, c.spec.vocab, size=(4, SEQ_LEN))
    cal = calibrate(c.spec, weights, seqs.tolist(), 32, "x")
    groups = norm_groups(c.spec)
    assert set(groups) == {f"layers.{i}.{n}" for i in range(2) for n in ("attn_norm", "ffn_norm")} | {"final_norm"}
    scales, consumers = {}, {}
    for norm, cons in groups.items():
        wmax = np.max([np.max(np.abs(weights[n]), axis=0) for n in cons], axis=0)
        scales[norm] = migration_scales(cal.input_peak[norm], wmax, 0.5)
        assert np.ptp(np.log(scales[norm])) > 1.0  # a real migration, not s = 1
        consumers.update(dict.fromkeys(cons, norm))
    smoothed = SmoothedWeights(weights, Smoothing(scales, dict.fromkeys(scales, 0.5), consumers))
    assert not np.array_equal(smoothed.get("layers.0.moe.experts.1.up"), weights["layers.0.moe.experts.1.up"])
    a, b = Reference(c.spec, weights, max_seq=32), Reference(c.spec, smoothed, max_seq=32)
    base, got = stepwise(a.forward, a.reset, seqs), stepwise(b.forward, b.reset, seqs)
    assert np.max(np.abs(got - base)) <= 1e-4 * np.max(np.abs(base))


@pytest.mark.parametrize("arch,extra", [
    ("mixtral", {}),
    ("qwen2_moe", {}),  # a gated shared expert, q/k/v biases
    ("gpt-oss", {"sliding_window": 3}),  # sinks, sliding layers, expert biases
    ("deepseek-v2", {"kv_lora_rank": 16, "q_lora_rank": 0}),  # latent attention (its own cache), a dense layer
])
def test_layer_by_layer_statistics(arch, extra, tmp_path, monkeypatch):
    """calibrate() runs the layers one at a time over chunks of sequences; its statistics equal, bit for bit,
    those of the reference run token by token (Reference.forward), whether a chunk holds one sequence or all."""
    import colibri.codegen.calibrate as cal

    # top_k 3: the order experts are combined in changes the sum (with two, a + b = b + a)
    shape = dict(layers=2, hidden=64, ffn=96, heads=4, kv_heads=2, experts=6, top_k=3, vocab=64, seed=5)
    c = open_checkpoint(synth(tmp_path / "m", arch=arch, **shape, **extra))
    weights = {n: c.get(n) for n in canonical_names(c.spec)}
    rng = np.random.default_rng(7)
    seqs = [rng.integers(0, c.spec.vocab, size=n).tolist() for n in (5, 1, 9, 12, 3)]
    max_seq = 8  # cuts two of them
    ref = cal._Recorder(c.spec, weights, max_seq=max_seq, cache_bytes=cal.CALIB_CACHE_BYTES)
    for seq in seqs:
        ref.reset()
        for t in seq[:max_seq]:
            ref.forward([t])
    for hidden_bytes in (1, 1 << 30):
        monkeypatch.setattr(cal, "CALIB_HIDDEN_BYTES", hidden_bytes)
        got = cal.calibrate(c.spec, weights, seqs, max_seq, "x")
        assert got.tokens == sum(min(len(s), max_seq) for s in seqs)
        assert got.counts == ref.counts
        assert got.mean_square.keys() == ref.sums.keys()
        for name, s in ref.sums.items():
            assert np.array_equal(got.mean_square[name], s / ref.counts[name]), name
        assert got.inputs.keys() == ref.inputs.keys() and got.input_peak.keys() == ref.input_peak.keys()
        for norm, xs in ref.inputs.items():
            assert np.array_equal(got.inputs[norm], np.stack(xs)), norm
            assert np.array_equal(got.input_peak[norm], ref.input_peak[norm]), norm


def test_weighted_int4_search():
    """With equal column weights the weighted search picks what the plain one does; a column weighed 1000x
    gets a smaller error than without weights."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 96)).astype(np.float32)
    s0, q0 = _int4_groups(w, 96)
    s1, q1 = _int4_groups(w, 96, np.ones(96))
    assert np.mean(q0 == q1) > 0.99 and np.mean(s0 == s1) > 0.97
    imp = np.ones(96)
    imp[5] = 1000.0
    plain = quantize(w, "int4").dequantize()
    weighted = quantize(w, "int4", importance=imp).dequantize()
    err = lambda d: float(np.sum((w[:, 5] - d[:, 5]) ** 2))  # noqa: E731
    assert err(weighted) < 0.5 * err(plain)
    # the whole matrix's weighted error is lower too
    werr = lambda d: float(np.sum(((w - d) ** 2) * imp))  # noqa: E731
    assert werr(weighted) < werr(plain)


# (checkpoint, quantization, the largest calibrated/uncalibrated mean KL taken): activation outliers must
# gain; on Gaussian or heavy-tailed weights with the synth's own norms the search must not lose
CASES = {
    "act-int8c": ("act", "int8c", 0.9), "act-int4c": ("act", "int4c", 0.9),
    "plain-int8c": ("plain", "int8c", 1.05), "heavy-int8c": ("heavy", "int8c", 1.05),
    "heavy-int4c": ("heavy", "int4c", 1.05),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_calib_kl(case, tmp_path, build_model):
    """End to end on the C runtime: the calibrated export's mean KL to the float32 logits against the
    uncalibrated one's, on sequences the calibration set does not hold; the blob's bits are the same."""
    kind, quant, limit = CASES[case]
    ckpt = synth(tmp_path / case, **SHAPE, heavy_tail=kind == "heavy")
    if kind == "act":
        _act_outliers(ckpt)
    calib = _calib_file(tmp_path / "calib.txt", SHAPE["vocab"])
    c = open_checkpoint(ckpt)
    fp32 = Reference(c.spec, {n: c.get(n) for n in canonical_names(c.spec)}, max_seq=64)
    seqs = np.random.default_rng(0).integers(0, c.spec.vocab, size=(N_SEQS, SEQ_LEN))
    base = stepwise(fp32.forward, fp32.reset, seqs)
    kl, bits = {}, {}
    for label, extra in (("plain", ()), ("calib", (f"CALIB={calib}",))):
        out = build_model(ckpt, quant, "host", "MAX_SEQ=64", *extra)
        manifest = json.loads((out / "manifest.json").read_text())
        bits[label] = manifest["totals"]["bits_per_weight"]
        if label == "calib":
            cal = manifest["calibration"]
            assert cal["sequences"] == 48 and cal["tokens"] == 48 * SEQ_LEN
            if kind == "act":
                assert cal["smoothing"]["migrated"], cal
        else:
            assert manifest["calibration"] is None
        m = load(out / f"libcolibri_{out.name}.so")
        kl[label] = _kl(base, stepwise(m.forward, m.reset, seqs))
    assert bits["calib"] == pytest.approx(bits["plain"], abs=1e-3)
    assert kl["calib"] <= limit * kl["plain"], kl


@pytest.mark.parametrize("content,why", [
    ("1 2 x\n", "line 1: not a list of token ids"),
    ("5 999\n", "line 1: token id outside [0, 256)"),
    ("# nothing\n\n", "the calibration set has no sequences"),
    ("1 2\n3 x\n4 5\n", "line 2: not a list of token ids"),  # mostly ids: read as ids, whatever the tokenizer
    ("Hello there\n", "line 1: not a list of token ids, and the checkpoint has no tokenizer.json to read the "
                      "file as text"),
])
def test_bad_calibration_file(content, why, tmp_path):
    ckpt = synth(tmp_path / "m", **SHAPE)
    bad = tmp_path / "calib.txt"
    bad.write_text(content)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "colibri.toolchain.cli", "export", str(ckpt), "-o", str(out),
                        "--calib", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and why in lines[0], r.stderr
    assert not out.exists()


# Text calibration lines: punctuation, digits, runs of spaces, a special token's text, non-ASCII.
TEXTS = ["Hello world, hello there.", "  123+456=579; spaces and   lines", "lines<|endoftext|>Hello there",
         "Zürich naïve café — ünïcödé", "hello " * 12, "579=123+456"]


@pytest.mark.parametrize("flag", ["--calib", "--prune-experts"])
def test_text_calibration(flag, tmp_path):
    """A text calibration file is encoded by the checkpoint's tokenizer.json: the export equals, byte for byte,
    the one calibrated on the ids HF tokenizers makes of the same lines (an independent encoder), and
    differs from the uncalibrated one."""
    from tokenizers import Tokenizer

    ckpt = train_bytelevel(_act_outliers(synth(tmp_path / "m", **{**SHAPE, "vocab": 320, "experts": 16})))
    lines = TEXTS * 4 if flag == "--calib" else TEXTS[:1]  # pruning: few enough tokens to leave experts unrouted
    text = tmp_path / "calib text.txt"
    text.write_text("\n".join(lines) + "\n\n")
    hf = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    ids = tmp_path / "calib ids.txt"
    ids.write_text("\n".join(" ".join(map(str, hf.encode(line).ids)) for line in lines) + "\n")
    assert hf.token_to_id("<|endoftext|>") in hf.encode(TEXTS[2]).ids

    def export(*args: str) -> tuple[bytes, str]:
        out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
        r = subprocess.run([sys.executable, "-m", "colibri.toolchain.cli", "export", str(ckpt), "-o", str(out),
                            "--quant", "int8c", *args], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return (out / "model.bin").read_bytes(), r.stdout

    by_text, said = export(flag, str(text))
    assert f"calibration set {text}: {len(lines)} lines of text encoded by its tokenizer.json" in said
    by_ids, said = export(flag, str(ids))
    assert f"calibration set {ids}: {len(lines)} sequences of token ids" in said
    assert by_text == by_ids
    assert by_text != export()[0]


@pytest.mark.parametrize("text,cc,why", [
    ("Hello there\n", "no such cc", "read as text, it needs a C compiler"),  # no compiler for the C tokenizer
    ("Hello there\n" + "a" * 300_000 + "\n", None, "line 2: the model's tokenizer cannot encode it"),
])
def test_bad_text_calibration(text, cc, why, tmp_path):
    """Text needs the C tokenizer compiled for this machine, and lines it can encode: else one line, exit 2."""
    import os

    ckpt = train_bytelevel(synth(tmp_path / "m", **{**SHAPE, "vocab": 320}))
    calib = tmp_path / "calib.txt"
    calib.write_text(text)
    out = tmp_path / "out"
    env = {**os.environ, "CC": str(tmp_path / cc)} if cc else None
    r = subprocess.run([sys.executable, "-m", "colibri.toolchain.cli", "export", str(ckpt), "-o", str(out),
                        "--calib", str(calib)], capture_output=True, text=True, env=env)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(calib) in lines[0] and why in lines[0], r.stderr
    assert not out.exists()


HOSTILE = '${__import__("os").system("touch PWNED")} $x `touch PWNED` \'$(touch PWNED)\' a;b,c'


def test_calib_in_a_build(tmp_path):
    """CALIB= in a build: a path SCons would substitute or a shell would run is only a path (the export
    reads it: the manifest records it), and a missing file is one line and exit 2 before anything builds."""
    from conftest import output_dirs, scons

    base = tmp_path / HOSTILE
    ckpt = synth(base / "m", **SHAPE)
    calib = _calib_file(base / "calib $y.txt", SHAPE["vocab"])
    res = scons(f"MODEL={ckpt}", "TARGET=host", f"CALIB={calib}", build=base / "b")
    out = output_dirs(res)["host"]
    assert json.loads((out / "manifest.json").read_text())["calibration"]["file"] == str(calib)
    assert not [p for p in tmp_path.rglob("PWNED")], "a path was evaluated or ran through a shell"
    missing = base / "no such.txt"
    r = scons(f"MODEL={ckpt}", "TARGET=host", f"CALIB={missing}", build=base / "b2", check=False)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"colibri: CALIB={missing}: no such file (a calibration set: token ids "
                                             "or text, a sequence per line)"]
    assert not (base / "b2" / "gen").exists()
