"""int8c against plain int8, int8c's own attention scheme (the embedding and attention matrices with scales
per 32 inputs) against int8c per row everywhere, and --attn-quant f16 (embedding and
attention matrices in f16, the rest int8c) against them, on a heavy-tailed and an outlier-channel checkpoint
(colibri synth): per tensor (weight error, from the blob) and end to end (KL of the logits against the fp32
numpy reference)."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.export import ExportOptions, export
from colibri.codegen.reference import Reference
from colibri.codegen.spec import canonical_names
from colibri.runtime import load

import blobread
from conftest import BIN, scons, synth
from logit_stats import log_softmax, stepwise

SHAPE = dict(layers=2, hidden=64, ffn=128, heads=4, kv_heads=2, experts=4, top_k=2, vocab=256, seed=11)
KINDS = {"heavy": dict(heavy_tail=True), "outlier": dict(outlier_channels=2)}
N_SEQS, SEQ_LEN = 32, 16
ATTN = ("embed", "attn.q", "attn.k", "attn.v", "attn.o")  # what --attn-quant covers in a Mixtral
# --attn-quant f16 must cut int8c's KL at least this much (measured 0.33-0.39x on the transformers
# checkpoints of bench/quant_table.py, 0.71x on this heavy-tailed one; a bound, not a measurement)
ATTN_F16_KL_RATIO = 0.8
ROWWISE = 1 << 20  # a group size past every width: one scale per row everywhere, as int8c was before


def _is_attn(name: str) -> bool:
    return name == "embed" or ".".join(name.split(".")[-2:]) in ATTN


def _kl(base: np.ndarray, other: np.ndarray) -> float:
    p, q = log_softmax(base), log_softmax(other)
    return float(np.mean(np.sum(np.exp(p) * (p - q), axis=-1)))


@pytest.fixture(scope="module", params=sorted(KINDS))
def measured(request, tmp_path_factory, build_model):
    """KL of int8, int8c and int8c --attn-quant f16 on a heavy-tailed and an outlier-channel checkpoint;
    the heavy-tailed one's --attn-quant f16 built and run in C, the others by the reference on the blob."""
    kind = request.param
    ckpt = synth(tmp_path_factory.mktemp("attnq") / kind, **SHAPE, **KINDS[kind])
    c = open_checkpoint(ckpt)
    weights = {n: c.get(n) for n in canonical_names(c.spec)}
    seqs = np.random.default_rng(0).integers(0, c.spec.vocab, size=(N_SEQS, SEQ_LEN))
    fp32 = Reference(c.spec, weights, max_seq=SEQ_LEN)
    base = stepwise(fp32.forward, fp32.reset, seqs)
    # exported, run by the reference on the blob's weights with the runtime's integer activations
    # (tests/test_cross.py holds the C runtime to that); on the heavy-tailed checkpoint --attn-quant f16 is
    # built and run in C, which must take a blob of f16 attention and int8c experts
    builds, kl = {}, {}
    for label, quant, attn, group in (("int8", "int8", None, 0), ("int8c", "int8c", None, 0),
                                      ("int8c_rows", "int8c", None, ROWWISE), ("attn_f16", "int8c", "f16", 0),
                                      ("attn_f16_1", "int8c", "f16:1", 0), ("attn_i16_1", "int8c", "int16:1", 0)):
        if (label, kind) in (("attn_f16", "heavy"), ("attn_f16_1", "outlier")):
            out = builds[label] = build_model(ckpt, "int8c", "host", "MAX_SEQ=32", f"ATTN_QUANT={attn}")
            m = load(out / f"libcolibri_{out.name}.so")
            kl[label] = _kl(base, stepwise(m.forward, m.reset, seqs))
            continue
        builds[label] = tmp_path_factory.mktemp(label)
        export(ckpt, builds[label], ExportOptions(quant=quant, attn_quant=attn, group_size=group, max_seq=32,
                                                  predict=False, workers=1))
        ref = Reference(c.spec, blobread.weights(builds[label] / "model.bin"), max_seq=SEQ_LEN)
        kl[label] = _kl(base, stepwise(ref.forward, ref.reset, seqs))
    print(kind, {k: f"{v:.3e}" for k, v in kl.items()})
    return weights, builds, kl


def _blob_errors(weights: dict, out) -> dict[str, tuple[str, float]]:
    """Per tensor: its dtype name in the blob and ||W - W_blob|| / ||W||, W_blob read independently."""
    raw = (out / "model.bin").read_bytes()
    names = {1: "f32", 2: "f16", 3: "int8", 4: "int8c", 5: "int4", 6: "int4c", 8: "int16"}
    res = {}
    for e in blobread.entries(raw):
        if e["kind"] in blobread.SECTION_KINDS:
            continue
        name = blobread.canonical_name(e)
        if name not in weights:
            continue
        w = np.asarray(weights[name], dtype=np.float64).reshape(e["rows"], e["cols"])
        err = np.linalg.norm(blobread.dequantize(raw, e) - w) / np.linalg.norm(w)
        res[name] = (names[e["dtype"]], float(err))
    return res


def test_int8c_beats_int8_per_tensor_and_end_to_end(measured):
    weights, builds, kl = measured
    plain, comp = _blob_errors(weights, builds["int8"]), _blob_errors(weights, builds["int8c"])
    matrices = [n for n, (dt, _) in comp.items() if dt == "int8c"]
    assert len(matrices) > 10
    worse = [n for n in matrices if not comp[n][1] < plain[n][1]]
    assert not worse, f"int8c no better than int8 on {worse}"
    assert kl["int8c"] < kl["int8"], f"KL int8c {kl['int8c']:.3e} vs int8 {kl['int8']:.3e}"


def test_attn_f16_tensors_and_kl(measured):
    weights, builds, kl = measured
    errs = _blob_errors(weights, builds["attn_f16"])
    attn = {n for n in errs if _is_attn(n)}
    assert attn and {errs[n][0] for n in attn} == {"f16"}, "the embedding and attention matrices are f16"
    assert errs["lm_head"][0] == "int8c"
    assert {dt for n, (dt, _) in errs.items() if ".moe.experts." in n} == {"int8c"}
    manifest = json.loads((builds["attn_f16"] / "manifest.json").read_text())
    assert manifest["quant"]["attn_quant"] == "f16"
    assert kl["attn_f16"] < ATTN_F16_KL_RATIO * kl["int8c"], (
        f"KL with --attn-quant f16 {kl['attn_f16']:.3e} vs int8c {kl['int8c']:.3e}")


def test_attn_f16_first_layer_tensors_and_kl(measured):
    """--attn-quant f16:1: the embedding and layer 0's attention f16, the other layers' attention int8c with
    per-row scales (group size = width, the default corrections), the rest int8c; the outlier-channel
    checkpoint's built and run in C. The KL is below int8c per row's."""
    weights, builds, kl = measured
    errs = _blob_errors(weights, builds["attn_f16_1"])
    head = {n for n in errs if n == "embed" or (_is_attn(n) and n.startswith("layers.0."))}
    assert len(head) == 1 + 4 and {errs[n][0] for n in head} == {"f16"}, sorted(head)
    assert {dt for n, (dt, _) in errs.items() if n not in head and (_is_attn(n) or ".moe.experts." in n)} == {"int8c"}
    assert errs["lm_head"][0] == "int8c"
    raw = (builds["attn_f16_1"] / "model.bin").read_bytes()
    later = [e for e in blobread.entries(raw) if e["kind"] not in blobread.SECTION_KINDS
             and _is_attn(blobread.canonical_name(e)) and blobread.canonical_name(e) not in head]
    assert len(later) == 4 * (SHAPE["layers"] - 1)
    for e in later:
        assert e["group_size"] == e["cols"], (blobread.canonical_name(e), e["group_size"])
        assert e["n_outliers"] == int(0.005 * e["rows"] * e["cols"]), blobread.canonical_name(e)
    manifest = json.loads((builds["attn_f16_1"] / "manifest.json").read_text())
    assert manifest["quant"]["attn_quant"] == "f16:1"
    # against int8c per row everywhere: the f16 head is what differs. Against int8c's own scheme (scales per
    # 32 inputs in every layer's attention) it is checkpoint-dependent: below it on bench/quant_table.py's
    # transformers checkpoints and on the outlier-channel one here, 1.2x it on the heavy-tailed one here
    assert kl["attn_f16_1"] < kl["int8c_rows"], (
        f"KL with --attn-quant f16:1 {kl['attn_f16_1']:.3e} vs int8c per row {kl['int8c_rows']:.3e}")


def test_int16_first_layer_tensors_and_kl(measured):
    """--attn-quant int16:1: the same matrices as f16:1 in int16 (14-bit weights, 14-bit activations: integer
    matmuls throughout), far less weight error there than int8c's, the rest as f16:1 has it; its KL is within
    1.5x of f16:1's (float activations there) and below int8c per row's."""
    weights, builds, kl = measured
    errs, f16 = _blob_errors(weights, builds["attn_i16_1"]), _blob_errors(weights, builds["attn_f16_1"])
    int8c = _blob_errors(weights, builds["int8c"])
    head = {n for n in errs if n == "embed" or (_is_attn(n) and n.startswith("layers.0."))}
    assert len(head) == 1 + 4 and {errs[n][0] for n in head} == {"int16"}, sorted(head)
    assert all(errs[n][1] * 20 < int8c[n][1] for n in head), {n: (errs[n][1], int8c[n][1]) for n in head}
    assert all(errs[n] == f16[n] for n in errs if n not in head)
    assert kl["attn_i16_1"] < 1.5 * kl["attn_f16_1"] and kl["attn_i16_1"] < kl["int8c_rows"], (
        f"KL with --attn-quant int16:1 {kl['attn_i16_1']:.3e}, f16:1 {kl['attn_f16_1']:.3e}, "
        f"int8c per row {kl['int8c_rows']:.3e}")


def test_int8c_attention_scheme_beats_int8c_per_row(measured):
    """int8c's embedding and attention matrices: scales per 32 inputs (blob fields), the default corrections;
    each has less weight error than int8c per row, the rest is stored as per row, and the KL is lower."""
    weights, builds, kl = measured
    raw = (builds["int8c"] / "model.bin").read_bytes()
    n_attn = 0
    for e in blobread.entries(raw):
        name = blobread.canonical_name(e) if e["kind"] not in blobread.SECTION_KINDS else ""
        if e["dtype"] != 4:  # int8c
            continue
        if _is_attn(name):
            n_attn += 1
            assert e["group_size"] == 32, (name, e["group_size"])
            assert e["n_outliers"] == int(0.005 * e["rows"] * e["cols"]), (name, e["n_outliers"])
        else:
            assert e["group_size"] == e["cols"], (name, e["group_size"])
    assert n_attn == 1 + 4 * SHAPE["layers"]
    scheme, rows = _blob_errors(weights, builds["int8c"]), _blob_errors(weights, builds["int8c_rows"])
    worse = [n for n in scheme if _is_attn(n) and not scheme[n][1] < rows[n][1]]
    assert not worse, f"the attention scheme no better than per row on {worse}"
    assert all(scheme[n] == rows[n] for n in scheme if not _is_attn(n))
    assert kl["int8c"] < kl["int8c_rows"], f"KL {kl['int8c']:.3e} vs per row {kl['int8c_rows']:.3e}"


@pytest.mark.parametrize("value, needle", [("f16:0", "positive number of layers"), ("f16:", "positive number"),
                                           ("f16:1$x", "positive number"), ("int9:1", "unknown quantization 'int9'")])
def test_bad_attn_quant_is_one_line(tmp_path, value, needle):
    """A bad QUANT[:LAYERS], from the CLI and from SCons: exit 2, one line naming it, nothing written."""
    ckpt = synth(tmp_path / "ck", **{**SHAPE, "layers": 1, "vocab": 32})
    res = subprocess.run([str(BIN / "colibri"), "export", str(ckpt), "-o", str(tmp_path / "out"),
                          "--attn-quant", value], capture_output=True, text=True)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and needle in lines[0], res.stderr
    assert not (tmp_path / "out").exists()
    res = scons(f"MODEL={ckpt}", f"ATTN_QUANT={value}", build=tmp_path / "b", check=False)
    assert res.returncode == 2 and "ATTN_QUANT: " in res.stderr and needle in res.stderr, res.stderr
    assert not any((tmp_path / "b").rglob("model.bin"))
