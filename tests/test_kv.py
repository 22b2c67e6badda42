"""KV cache precision (KV=f32|f16|int8, `colibri export --kv`): the blob records it, the plan and the arena
shrink by the bytes the cache saves, and the runtime tracks the float cache (f16: exactly the numpy
reference's f16 rounding of K/V; int8: per head per position with an f32 scale)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.reference import Reference
from colibri.codegen.spec import canonical_names
from colibri.runtime import ColibriError, load

from blobread import header as blob_header
from blobread import weights as blob_weights
from conftest import BIN, GOLDEN, ROOT, require_target, scons
from targets_under_test import cross, one_per_arch

sys.path.insert(0, str(ROOT / "firmware_examples/models"))
import adder_task  # noqa: E402

ADDER = ROOT / "firmware_examples/models/adder"
PROMPT = [3, 17, 42, 5, 9]
N_GREEDY = 32
F16_REL = 1e-3  # KV f16 against KV f32: max |logit difference| / max |logit| (the bound)
SAME_KV_REL = 1e-5  # C against the numpy reference with the same KV option (float sums in another order)
INT8_KL = 1e-5  # KV int8 against KV f32 on the demo model: mean KL of the teacher-forced next-token logits
# (3.2e-7 when this was written; the issue suggests 1e-3, which would not catch a scale read off by one head)
N_HELDOUT = 200
KV_FLAG_BITS = {"f32": 0, "f16": 1 << 14, "int8": 1 << 15}  # FORMAT.md "Feature flags", written out here


def _prompt(vocab: int) -> list[int]:
    return [t % vocab for t in PROMPT]


def _source(ckpt):
    c = open_checkpoint(ckpt)
    return c.spec, {n: c.get(n) for n in canonical_names(c.spec)}


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b))) / float(np.max(np.abs(b)))


def _logits_and_tokens(m, prompt: list[int]) -> tuple[list[np.ndarray], list[int]]:
    m.reset()
    logits = [m.forward(prompt)] + [m.forward([t]) for t in prompt[:4]]
    m.reset()
    return logits, m.generate(prompt, N_GREEDY)


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_f16_kv_tracks_f32_kv_and_is_the_references_f16_rounding(case, golden_ckpts, build_model):
    ckpt = golden_ckpts[case]
    spec, w = _source(ckpt)
    prompt = _prompt(spec.vocab)
    f32 = load(build_model(ckpt, "f32") / "model.bin")
    out = build_model(ckpt, "f32", "host", "KV=f16")
    assert blob_header((out / "model.bin").read_bytes())["flags"] & KV_FLAG_BITS["f16"]
    f32_logits, f32_tokens = _logits_and_tokens(f32, prompt)
    ref = Reference(spec, w, max_seq=256, kv="f16")
    ref_logits = [ref.forward(prompt)] + [ref.forward([t]) for t in prompt[:4]]
    ref.reset()
    ref_tokens = ref.generate(prompt, N_GREEDY)
    for how, m in (("generic", load(out / "model.bin")), ("embedded", load(out / f"libcolibri_{out.name}.so"))):
        logits, tokens = _logits_and_tokens(m, prompt)
        for step, (g, f, r) in enumerate(zip(logits, f32_logits, ref_logits, strict=True)):
            assert _rel(g, f) <= F16_REL, f"{case} {how} step {step}: {_rel(g, f):.3g} from KV f32"
            assert _rel(g, r) <= SAME_KV_REL, f"{case} {how} step {step}: {_rel(g, r):.3g} from the f16 reference"
        assert tokens == f32_tokens == ref_tokens, f"{case} {how}: greedy tokens differ"


def test_f16_kv_is_not_the_f32_reference():
    """The f16 reference really rounds: on a model whose K/V are not f16 values it differs from f32."""
    from colibri.codegen.reference import kv_round

    x = np.array([[1.0 + 2.0**-13, -3.3], [0.1, 7.0]], dtype=np.float32)
    assert np.array_equal(kv_round(x, "f16"), x.astype(np.float16).astype(np.float32))
    assert not np.array_equal(kv_round(x, "f16"), x)
    q = kv_round(x, "int8")  # per row (head): max |x| maps to 127, 1.0001 * 127 / 3.3 = 38.49 rounds to 38
    assert q[0, 1] == np.float32(-3.3) and q[0, 0] == np.float32(38) * (np.float32(3.3) / np.float32(127))
    assert q[1, 0] == np.float32(2) * (np.float32(7) / np.float32(127))  # 0.1 * 127 / 7 = 1.81


def _kv_bytes(spec, max_seq: int, kv: str) -> int:
    """Both caches' bytes, from the format's description (FORMAT.md "KV cache"), each buffer 64-aligned."""
    n = spec.n_kv_heads * spec.head_dim
    row = {"f32": 4 * n, "f16": 2 * n, "int8": (n + 3) // 4 * 4 + 4 * spec.n_kv_heads}[kv]
    return 2 * (-(-spec.n_layers * max_seq * row // 64) * 64)


def test_export_records_the_kv_and_shrinks_the_arena(golden_ckpts, build_model, tmp_path):
    ckpt = golden_ckpts["gqa_top2"]
    runtime = build_model(ckpt, "f32") / "libcolibri.so"
    spec, _ = _source(ckpt)
    seen = {}
    for kv in ("f32", "f16", "int8"):
        out = tmp_path / kv
        res = subprocess.run([str(BIN / "colibri"), "export", str(ckpt), "-o", str(out), "--kv", kv, "--max-seq", "64",
                              "--no-predict", "--prefill-block", "4"], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        a = json.loads((out / "manifest.json").read_text())["arena"]
        assert a["kv_cache_dtype"] == kv and a["kv_cache_bytes"] == _kv_bytes(spec, 64, kv)
        line = next(x for x in res.stdout.splitlines() if x.startswith("arena "))
        assert line.startswith(f"arena {a['arena_bytes']:,} bytes planned")
        assert f"KV cache {a['kv_cache_bytes']:,} bytes in {kv}" in line, line
        h = blob_header((out / "model.bin").read_bytes())
        assert h["flags"] & (KV_FLAG_BITS["f16"] | KV_FLAG_BITS["int8"]) == KV_FLAG_BITS[kv]
        assert h["arena_bytes"] == a["arena_bytes"]
        assert f"#define COLIBRI_ARENA_SIZE {a['arena_bytes']}u" in (out / "model.h").read_text()
        assert load(out / "model.bin", runtime).info().arena_bytes == a["arena_bytes"]
        seen[kv] = a
    assert seen["f32"]["arena_bytes"] > seen["f16"]["arena_bytes"] > seen["int8"]["arena_bytes"]


def test_bad_kv_option_is_one_line(golden_ckpts, tmp_path):
    res = scons(f"MODEL={golden_ckpts['gqa_top2']}", "KV=f8", build=tmp_path / "b", check=False)
    assert res.returncode == 2 and "KV=f8: expected one of f32, f16, int8" in res.stderr
    assert "Traceback" not in res.stderr
    res = subprocess.run([str(BIN / "colibri"), "export", str(golden_ckpts["gqa_top2"]), "-o", str(tmp_path / "o"),
                          "--kv", "bf16"], capture_output=True, text=True)
    assert res.returncode == 2 and "--kv" in res.stderr and not (tmp_path / "o").exists()


def _with_flags(blob: bytes, flags: int) -> bytes:
    b = bytearray(blob)
    struct.pack_into("<I", b, 28, flags)
    struct.pack_into("<I", b, 8, zlib.crc32(bytes(b[12:])))
    return bytes(b)


def test_both_kv_flags_are_refused(golden_ckpts, build_model, tmp_path):
    out = build_model(golden_ckpts["gqa_top2"], "f32", "host", "KV=f16")
    blob = (out / "model.bin").read_bytes()
    bad = tmp_path / "both.bin"
    bad.write_bytes(_with_flags(blob, blob_header(blob)["flags"] | KV_FLAG_BITS["int8"]))
    with pytest.raises(ColibriError) as e:
        load(bad, out / "libcolibri.so")
    assert e.value.status == 6  # COLIBRI_E_BAD_HEADER
    # and a flag a runtime does not know, as KV_F16 is to one that predates it, is refused the same way
    unknown = tmp_path / "unknown.bin"
    unknown.write_bytes(_with_flags(blob, blob_header(blob)["flags"] | 1 << 30))
    with pytest.raises(ColibriError) as e:
        load(unknown, out / "libcolibri.so")
    assert e.value.status == 6


@pytest.mark.parametrize("kv", ["f16", "int8"])
def test_prefill_equals_single_steps(kv, golden_ckpts, build_model):
    out = build_model(golden_ckpts["mixtral_f16"], "int8c", "host", f"KV={kv}", "PREFILL_BLOCK=32", "MAX_SEQ=64")
    m = load(out / "model.bin")
    prompt = _prompt(m.vocab) * 9  # 45 tokens: a block of 32 and one of 13
    batch = m.forward(prompt)
    m.reset()
    for t in prompt:
        step = m.forward([t])
    assert np.array_equal(batch, step)


def _teacher_forced(m, prompts, answers) -> np.ndarray:
    out = []
    for p, a in zip(prompts, answers, strict=True):
        m.reset()
        out.append(m.forward(p))
        out += [m.forward([t]) for t in a]
    return np.array(out, dtype=np.float64)


def _greedy(m, prompt: list[int], max_new: int) -> list[int]:
    m.reset()
    logits, ids = m.forward(prompt), []
    while len(ids) < max_new:
        ids.append(int(np.argmax(logits)))
        if ids[-1] == adder_task.EOS:
            break
        logits = m.forward(ids[-1:])
    return ids


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_int8_kv_on_the_demo_model(build_model):
    task = json.loads((ADDER / "task.json").read_text())
    problems = adder_task.make_problems(task["heldout_seed"], N_HELDOUT, task["max_digits"])
    prompts = [adder_task.encode_prompt(p) for p, _ in problems]
    f32 = load(build_model(ADDER, "int8c") / "model.bin")
    out = build_model(ADDER, "int8c", "host", "KV=int8")
    i8 = load(out / "model.bin")
    answers = [_greedy(f32, p, task["max_new_tokens"]) for p in prompts]
    assert [_greedy(i8, p, task["max_new_tokens"]) for p in prompts] == answers
    digits = [a[:-1] if a[-1:] == [adder_task.EOS] else a for a in answers]  # as bench/accuracy.py: up to EOS
    p, q = _log_softmax(_teacher_forced(f32, prompts, digits)), _log_softmax(_teacher_forced(i8, prompts, digits))
    kl = float(np.mean(np.sum(np.exp(p) * (p - q), axis=-1)))
    print(f"KV int8 against KV f32 on {N_HELDOUT} held-out sums: mean KL {kl:.3e} (bound {INT8_KL:g})")
    assert 0.0 < kl < INT8_KL
    # the runtime is the reference with the same KV option (the blob's weights, int8 activations)
    c = open_checkpoint(ADDER)
    ref = Reference(c.spec, blob_weights(out / "model.bin"), max_seq=c.spec.max_position, kv="int8")
    i8.reset()
    assert _rel(i8.forward(prompts[0]), ref.forward(prompts[0])) <= SAME_KV_REL


CROSS_SHAPE = dict(layers=2, hidden=64, ffn=96, heads=4, kv_heads=2, experts=4, top_k=2, vocab=75, seed=29)


def _run(target: str, program, *args: str) -> list[str]:
    res = subprocess.run([str(BIN / "colibri"), "run", "--target", target, str(program), "--", *args],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{target} {program}: exit {res.returncode}\n{res.stderr}"
    return [x for x in res.stdout.splitlines() if x.startswith(("tokens: ", "logits: "))]


@pytest.mark.parametrize("kv", ["f16", "int8"])
def test_kv_gives_the_same_bits_everywhere(kv, tmp_path_factory, build_model):
    """int8 activations and a 16- or 8-bit cache: the host's SIMD build, its scalar build and one target of
    each other architecture print the same logits, bit for bit."""
    from conftest import synth

    ckpt = synth(tmp_path_factory.mktemp(f"kv{kv}") / "kvm", **CROSS_SHAPE)
    args = ("--tokens", "3,17,42", "--generate", "8", "--print-logits")
    runs = {}
    for target in ["host", *one_per_arch(cross())]:
        require_target(target)
    for extra, targets in (((), ["host", *one_per_arch(cross())]), (("KERNELS=scalar",), ["host"])):
        outs = build_model.many(ckpt, "int8c", targets, f"KV={kv}", *extra, only=("colibri_demo",))[0]
        for target, out in outs.items():
            runs[f"{target} {' '.join(extra)}"] = _run(target, out / "colibri_demo", *args)
    first = runs["host "]
    assert len(first) == 2 and first[1].count(",") >= CROSS_SHAPE["vocab"] - 1
    for name, lines in runs.items():
        assert lines == first, f"{name} differs from the host build in the printed logits"


def _arena_region_bytes(target: str) -> int:
    """The length of the region the target file places the arena in (read from the TOML itself)."""
    import tomllib

    t = tomllib.loads((ROOT / "targets" / f"{target}.toml").read_text())
    return next(r["length"] for r in t["memory"] if r["name"] == t["placement"]["arena"])


def test_max_seq_auto_on_stm32h7(build_model):
    """MAX_SEQ=auto: the largest max_seq whose arena fits the arena's region (stm32h7: AXI_SRAM, nothing
    else there), printed; a 16- or 8-bit cache fits more positions; the image boots with the reference's
    tokens."""
    import re

    from colibri.codegen.plan import plan_arena
    from colibri.codegen.spec import ModelSpec

    require_target("stm32h7")
    room = _arena_region_bytes("stm32h7")
    seqs = {}
    for kv in ("f32", "f16", "int8"):
        out = build_model(ADDER, "int8c", "stm32h7", f"KV={kv}", "MAX_SEQ=auto")
        manifest = json.loads((out / "manifest.json").read_text())
        n, a = manifest["max_seq"], manifest["arena"]
        assert a["arena_bytes"] <= room
        spec = ModelSpec.from_json(manifest["spec"])
        bigger = plan_arena(spec, n + 1, a["prefill_block"] if a["prefill_block"] > 1 else None, True, 32, kv)
        assert bigger.arena_bytes > room, f"KV {kv}: max_seq {n + 1} would fit too"
        size = json.loads(next(out.glob("*.size.json")).read_text())
        assert size["regions"]["ram"]["bytes"] >= a["arena_bytes"]
        seqs[kv] = n
    assert seqs["f32"] < seqs["f16"] < seqs["int8"], seqs
    elf = next(p for p in out.glob("*.elf") if not p.name.endswith("-qemu.elf"))
    res = subprocess.run([str(BIN / "colibri"), "run", "--target", "stm32h7", str(elf)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    tokens = [int(t) for t in res.stdout.splitlines()[0].removeprefix("tokens: ").split(",") if t]
    (gen,) = (out.parent.parent / "gen" / out.name).glob(f"*-seq{seqs['int8']}")  # the export it linked
    h = dict(re.findall(r"^#define (COLIBRI_\w+) (.*?)\s*(?:/\*.*)?$", (gen / "model.h").read_text(), re.M))
    assert int(h["COLIBRI_MAX_SEQ"]) == seqs["int8"]
    prompt = [int(t) for t in h["COLIBRI_DEFAULT_PROMPT"].strip("{} ").split(",")]
    ref = Reference(open_checkpoint(ADDER).spec, blob_weights(gen / "model.bin"), max_seq=seqs["int8"], kv="int8")
    assert tokens == ref.generate(prompt, int(h["COLIBRI_DEFAULT_GENERATE"]))
