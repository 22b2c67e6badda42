"""Host end to end: checkpoint -> export -> SCons -> C library, against the numpy reference."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.reference import Reference
from colibri.codegen.spec import canonical_names
from colibri.runtime import ColibriError, load

from blobread import header as blob_header
from blobread import weights as blob_weights
from conftest import GOLDEN

PROMPT = [3, 17, 42, 5, 9]
BLOB_AND_RUNTIME = ("model.bin", "libcolibri.so")  # what load(model.bin) runs: tests of the blob build no more
N_GREEDY = 32


def _prompt(vocab: int) -> list[int]:
    return [t % vocab for t in PROMPT]


def _source_weights(ckpt):
    c = open_checkpoint(ckpt)
    return {n: c.get(n) for n in canonical_names(c.spec)}, c.spec


def _models(out):
    name = out.name
    return {"embedded": load(out / f"libcolibri_{name}.so"), "generic": load(out / "model.bin")}


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_f32_logits_match_reference(case, golden_ckpts, build_model):
    ckpt = golden_ckpts[case]
    out = build_model(ckpt, "f32")
    w, spec = _source_weights(ckpt)
    ref = Reference(spec, w, max_seq=256)
    prompt = _prompt(spec.vocab)
    expected = [ref.forward(prompt)] + [ref.forward([t]) for t in prompt[:4]]
    for how, m in _models(out).items():
        got = [m.forward(prompt)] + [m.forward([t]) for t in prompt[:4]]
        for step, (g, e) in enumerate(zip(got, expected, strict=True)):
            bound = 1e-4 * float(np.max(np.abs(e)))
            err = float(np.max(np.abs(g - e)))
            assert err <= bound, f"{case} {how} step {step}: max abs error {err:.3g} > {bound:.3g}"


# int8c's logit error relative to max |logit| on the golden models (1.1-2.5% when this was written; int8
# per row alone gives about as much): a quantizer that does worse than 4% has regressed.
INT8C_MAX_LOGIT_ERROR = 0.04


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_int8c_greedy_and_error_bound(case, golden_ckpts, build_model):
    ckpt = golden_ckpts[case]
    out = build_model(ckpt, "int8c")
    manifest = json.loads((out / "manifest.json").read_text())
    src, spec = _source_weights(ckpt)
    deq = blob_weights(out / "model.bin")
    prompt = _prompt(spec.vocab)
    ref_q = Reference(spec, deq, max_seq=256)
    want_tokens = ref_q.generate(prompt, N_GREEDY)
    ref_fp = Reference(spec, src, max_seq=256)
    fp_logits = ref_fp.forward(prompt)
    predicted = manifest["predicted_logit_error"]["relative"]
    for how, m in _models(out).items():
        assert m.generate(prompt, N_GREEDY) == want_tokens, f"{case} {how}: greedy tokens differ"
        m.reset()
        got = m.forward(prompt)
        rel = float(np.max(np.abs(got - fp_logits))) / float(np.max(np.abs(fp_logits)))
        # fixed here, not read from the export: a quantizer regression must not loosen its own bound
        assert rel <= INT8C_MAX_LOGIT_ERROR, f"{case} {how}: logit error {rel:.3g} above {INT8C_MAX_LOGIT_ERROR}"
        assert rel <= predicted, f"{case} {how}: logit error {rel:.3g} above the predicted {predicted:.3g}"


@pytest.mark.parametrize("case, quant, extra", [
    ("gqa_top2", "f32", ()), ("gqa_top2", "int8c", ()),
    # integer matmuls, tiled: a 128-token block, two tokens per pass over a tile, the corrections per tile
    ("mixtral_f16", "int8c", ("PREFILL_BLOCK=128", "MAX_SEQ=200")),
])
def test_prefill_equals_single_steps(case, quant, extra, golden_ckpts, build_model):
    out = build_model(golden_ckpts[case], quant, "host", *extra)
    for how, m in _models(out).items():
        prompt = _prompt(m.vocab) * (30 if extra else 1)  # 150 tokens: a block of 128 and one of 22
        batch = m.forward(prompt)
        m.reset()
        for t in prompt:
            step = m.forward([t])
        assert np.array_equal(batch, step), f"{how}: prefill differs from {len(prompt)} single steps"


@pytest.mark.parametrize("quant, extra", [("f16", ()), ("int8", ()), ("int8c", ("ACTIVATIONS=float",))])
def test_other_quants_run_and_track_reference(quant, extra, golden_ckpts, build_model):
    ckpt = golden_ckpts["mixtral_f16"]
    # int8c with float activations: test_specialised_build_refuses_other_blobs builds its library anyway
    out = build_model(ckpt, quant, "host", *extra, only=() if extra else BLOB_AND_RUNTIME)
    h = blob_header((out / "model.bin").read_bytes())
    assert (h["xq_offset"] != 0) == (quant == "int8"), "int8 activations exactly when asked for"
    spec = open_checkpoint(ckpt).spec
    deq = blob_weights(out / "model.bin")
    ref = Reference(spec, deq, max_seq=256)
    want = ref.forward(_prompt(spec.vocab))
    got = load(out / "model.bin").forward(_prompt(spec.vocab))
    assert float(np.max(np.abs(got - want))) <= 1e-4 * float(np.max(np.abs(want)))


def test_demo_prints_tokens_and_rate(golden_ckpts, build_model):
    ckpt = golden_ckpts["mixtral_f16"]
    out = build_model(ckpt, "int8c")
    res = subprocess.run([out / "colibri_demo", "--tokens", "3,17,42", "--generate", "16"],
                         capture_output=True, text=True, check=True)
    lines = res.stdout.splitlines()
    tokens = [int(t) for t in lines[0].removeprefix("tokens: ").split(",")]
    assert lines[0].startswith("tokens: ") and len(tokens) == 16
    assert lines[1].startswith("tok/s: ") and float(lines[1].split()[1]) > 0
    assert tokens == load(out / f"libcolibri_{out.name}.so").generate([3, 17, 42], 16)
    default = subprocess.run([out / "colibri_demo"], capture_output=True, text=True, check=True)
    assert default.stdout.startswith("tokens: ")


def _thread_runs(out: Path, prompt: str, generate: int) -> dict[tuple[str, int], list[str]]:
    """The tokens and logits lines of colibri_demo and colibri_run at 1, 2, 3 and 7 threads."""
    runs = {}
    for prog in ("colibri_demo", "colibri_run"):
        for threads in (1, 2, 3, 7):
            argv = [out / prog] + ([out / "model.bin"] if prog == "colibri_run" else [])
            res = subprocess.run([*argv, "--tokens", prompt, "--generate", str(generate), "--threads", str(threads),
                                  "--print-logits"], capture_output=True, text=True, check=True, timeout=120)
            runs[prog, threads] = [x for x in res.stdout.splitlines() if x.startswith(("tokens: ", "logits: "))]
    return runs


def test_demo_threads_give_the_same_bits(golden_ckpts, build_model):
    """The demos' pthread pool behind colibri_set_parallel: any thread count, the one-thread logits, bit for bit
    (more threads than this machine's cores included: waiters then sleep instead of spinning)."""
    out = build_model(golden_ckpts["mixtral_f16"], "int8c")
    runs = _thread_runs(out, "3,17,42,5", 12)
    first = runs["colibri_demo", 1]
    assert len(first) == 2
    for key, lines in runs.items():
        assert lines == first, f"{key} differs from one thread"


def test_demo_threads_split_a_long_prompt_with_the_same_bits(golden_ckpts, build_model):
    """A 200-token prompt in blocks of 128: the per-token steps (norms, SwiGLU, the activations'
    quantization) are then wide enough to be split over the threads by tokens, as the matmuls are by rows.
    Any thread count gives the one-thread tokens and logits, bit for bit, and so does colibri_run."""
    out = build_model(golden_ckpts["mixtral_f16"], "int8c", "host", "PREFILL_BLOCK=128", "MAX_SEQ=256")
    runs = _thread_runs(out, ",".join(str((i * 37 + 5) % 320) for i in range(200)), 8)
    first = runs["colibri_demo", 1]
    assert len(first) == 2 and len(first[0].split(",")) == 8
    for key, lines in runs.items():
        assert lines == first, f"{key} differs from one thread"


def test_symbols_exported_and_undefined(golden_ckpts, build_model):
    out = build_model(golden_ckpts["gqa_top2"], "int8c")
    for so in (out / f"libcolibri_{out.name}.so", out / "libcolibri.so"):
        nm = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True, check=True)
        names = [line.split()[-1] for line in nm.stdout.splitlines() if line.strip()]
        assert names and all(n.startswith("colibri_") for n in names), f"{so.name} exports {names}"
        kinds = {line.split()[-2] for line in nm.stdout.splitlines() if line.strip()}
        assert kinds == {"T"}, f"{so.name}: exported non-functions: {kinds}"
    nm = subprocess.run(["nm", "-u", out / f"libcolibri_{out.name}.a"], capture_output=True, text=True, check=True)
    undefined = {line.split()[-1] for line in nm.stdout.splitlines() if line.strip() and ":" not in line}
    assert not undefined & {"malloc", "calloc", "realloc", "free"}, undefined


def test_arena_size_agrees_with_header(golden_ckpts, build_model):
    out = build_model(golden_ckpts["gqa_top2"], "int8c")
    model_h = (out.parent.parent / "gen" / out.name / "int8c" / "model.h").read_text()
    define = next(line for line in model_h.splitlines() if line.startswith("#define COLIBRI_ARENA_SIZE "))
    arena = int(define.split()[2].rstrip("u"))
    manifest = json.loads((out / "manifest.json").read_text())
    assert load(out / "model.bin").arena_bytes == arena == manifest["arena"]["arena_bytes"]
    assert arena < manifest["arena"]["naive_bytes"]


def test_sparse_far_apart_corrections(tmp_path, build_model):
    """A big matrix (the lm_head, 6000 x 48) with few corrections: gaps beyond 65535 need filler entries."""
    from conftest import synth

    ckpt = synth(tmp_path / "sparse", layers=1, hidden=48, ffn=64, heads=4, kv_heads=2, experts=2, top_k=1,
                 vocab=6000, seed=4, heavy_tail=True)
    out = build_model(ckpt, "int8c", "host", "OUTLIER_FRAC=0.00003")
    spec = open_checkpoint(ckpt).spec
    raw = (out / "model.bin").read_bytes()
    from blobread import SECTION_KINDS, canonical_name, entries
    head = next(e for e in entries(raw) if e["kind"] not in SECTION_KINDS and canonical_name(e) == "lm_head")
    gaps = np.frombuffer(raw, dtype="<u2", count=head["n_outliers"], offset=head["oidx_off"])
    assert head["n_outliers"] >= 2 and gaps.max() == 0xFFFF, "expected filler entries in the lm_head"
    deq = blob_weights(out / "model.bin")
    ref = Reference(spec, deq, max_seq=256)
    for how, m in _models(out).items():
        ref.reset()
        prompt = [5, 4000, 5999, 17]
        want = ref.forward(prompt)
        got = m.forward(prompt)
        assert float(np.max(np.abs(got - want))) <= 1e-4 * float(np.max(np.abs(want))), how


def test_prefill_block_trades_arena_for_nothing_else(golden_ckpts, build_model):
    """The prefill block size changes the arena, never the numbers."""
    ckpt = golden_ckpts["mixtral_f16"]
    outs = {b: build_model(ckpt, "int8c", "host", f"PREFILL_BLOCK={b}", only=(*BLOB_AND_RUNTIME, "manifest.json"))
            for b in (1, 7, 32)}
    arenas = {b: json.loads((o / "manifest.json").read_text())["arena"] for b, o in outs.items()}
    assert [arenas[b]["prefill_block"] for b in (1, 7, 32)] == [1, 7, 32]
    assert arenas[1]["arena_bytes"] < arenas[7]["arena_bytes"] < arenas[32]["arena_bytes"]
    prompt = [(7 * i) % 320 for i in range(40)]  # longer than one block of 32
    logits = {b: load(o / "model.bin").forward(prompt) for b, o in outs.items()}
    assert np.array_equal(logits[1], logits[7]) and np.array_equal(logits[1], logits[32])
    for b, o in outs.items():
        assert load(o / "model.bin").arena_bytes == arenas[b]["arena_bytes"]


def test_specialised_build_refuses_other_blobs(golden_ckpts, build_model):
    """A model library is compiled against its model.h: given another model's blob, or its own model
    exported with the other kind of activations (which decides the kernels it was built with), colibri_init
    returns COLIBRI_E_MODEL_MISMATCH; the generic runtime runs all of them."""
    ckpt = golden_ckpts["mixtral_f16"]
    q8 = build_model(ckpt, "int8c")
    flt = build_model(ckpt, "int8c", "host", "ACTIVATIONS=float")
    other = build_model(golden_ckpts["top1_tied_bf16"], "int8c")
    for lib, blob in ((q8, flt), (flt, q8), (q8, other)):
        spec = lib / f"libcolibri_{lib.name}.so"
        with pytest.raises(ColibriError) as e:
            load(blob / "model.bin", runtime=spec)
        assert e.value.status == 14, f"{spec} with {blob / 'model.bin'}: {e.value}"
        generic = load(blob / "model.bin", runtime=lib / "libcolibri.so")
        assert np.all(np.isfinite(generic.forward([1, 2, 3])))
    for lib in (q8, flt):  # and each its own blob, as the linked-in one
        spec = lib / f"libcolibri_{lib.name}.so"
        own = load(lib / "model.bin", runtime=spec).forward([1, 2, 3])
        assert np.array_equal(own, load(spec).forward([1, 2, 3]))
