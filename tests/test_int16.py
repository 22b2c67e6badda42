"""int16 (FORMAT.md "int16") end to end: `--attn-quant int16:1` puts the embedding and layer 0's attention in
14-bit weights multiplied with 14-bit activations, the rest int8c. Every Linux target's build gives the greedy
tokens of the numpy reference run on the blob's own weights (with the 14-bit activations as the runtime
quantizes them) and the host's logits bit for bit, as does a KERNELS=scalar build; prefill equals single
steps; 1/2/3/7 threads give the bits of one. A blob whose int16 tensor breaks the format's rules is refused
with COLIBRI_E_BAD_TENSOR, and an export onto widths that are not whole blocks is one line and exit 2.
(tests/test_kernels.py holds each ISA's block dots to the scalar ones; tests/test_attn_quant.py measures
what int16:1 does to the KL.)"""

from __future__ import annotations

import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from every_target import check_every_target

from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.reference import Reference
from colibri.runtime import ColibriError, load

from blobread import INT16, entries, entry_offset
from blobread import weights as blob_weights
from conftest import BIN, synth

SHAPE = dict(layers=2, hidden=64, ffn=96, heads=4, kv_heads=2, experts=4, top_k=2, vocab=150, seed=41)
ATTN = "ATTN_QUANT=int16:1"
PROMPT = [3, 17, 42, 5, 99]
E_BAD_TENSOR, E_DTYPE = 8, 19


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return synth(tmp_path_factory.mktemp("i16") / "i16m", **SHAPE, heavy_tail=True)


def _printed(argv: list, *extra: str) -> list[str]:
    res = subprocess.run([*map(str, argv), "--tokens", ",".join(map(str, PROMPT)), "--generate", "10",
                          "--print-logits", *extra], capture_output=True, text=True, check=True, timeout=300)
    return [x for x in res.stdout.splitlines() if x.startswith(("tokens: ", "logits: "))]


def test_every_target_gives_the_references_tokens_and_the_hosts_bits(ckpt, build_model):
    spec = open_checkpoint(ckpt).spec
    outs = check_every_target(build_model, ckpt, "int8c", lambda w: Reference(spec, w, max_seq=64), PROMPT, 12,
                              ATTN, what="int16:1")
    dtypes = {e["kind"]: e["dtype"] for e in entries((next(iter(outs.values())) / "model.bin").read_bytes())
              if e["layer"] == 0}
    assert dtypes[1] == INT16 and dtypes[4] == INT16 and dtypes[7] == INT16, dtypes  # embed, attn.q, attn.o
    assert dtypes[10] == 4, dtypes  # layer 0's experts stay int8c


def test_scalar_kernels_give_the_same_bits(ckpt, build_model):
    simd = build_model(ckpt, "int8c", "host", ATTN, only=("colibri_demo",))
    scalar = build_model(ckpt, "int8c", "host", ATTN, "KERNELS=scalar", only=("colibri_demo",))
    want = _printed([simd / "colibri_demo"])
    assert len(want) == 2 and _printed([scalar / "colibri_demo"]) == want


def test_threads_give_the_same_bits(ckpt, build_model):
    out = build_model(ckpt, "int8c", "host", ATTN, only=("colibri_demo",))
    runs = {t: _printed([out / "colibri_demo"], "--threads", str(t)) for t in (1, 2, 3, 7)}
    for t, lines in runs.items():
        assert lines == runs[1], f"{t} threads differ from one"


def test_prefill_equals_single_steps(ckpt, build_model):
    out = build_model(ckpt, "int8c", "host", ATTN, "PREFILL_BLOCK=8", "MAX_SEQ=64")
    m = load(out / "model.bin")
    prompt = PROMPT * 4  # 20 tokens: blocks of 8, 8 and 4
    batch = m.forward(prompt)
    m.reset()
    for t in prompt:
        step = m.forward([t])
    assert np.array_equal(batch, step), "prefill differs from single steps"


def _mutated(blob: Path, tmp: Path, change) -> Path:
    """A copy of blob with the first int16 entry changed by change(bytearray, entry, entry offset), the CRC redone."""
    b = bytearray(blob.read_bytes())
    i, e = next((i, e) for i, e in enumerate(entries(bytes(b))) if e["dtype"] == INT16)
    change(b, e, entry_offset(i))
    struct.pack_into("<I", b, 8, zlib.crc32(bytes(b[12:])))
    out = tmp / f"bad{len(list(tmp.iterdir()))}.bin"
    out.write_bytes(b)
    return out


def _value(v: int):
    def change(b, e, _off):
        struct.pack_into("<h", b, e["data_off"] + 2 * 5, v)
    return change


def _field(off: int, fmt: str, v: int):
    def change(b, _e, eoff):
        struct.pack_into("<" + fmt, b, eoff + off, v)
    return change


@pytest.mark.parametrize("change", [_value(8192), _value(-8192), _value(-32768), _field(7, "B", 2),
                                    _field(20, "I", 32)],
                         ids=["value 8192", "value -8192", "value -32768", "f16 scales", "a scale per 32"])
def test_a_broken_int16_tensor_is_refused(ckpt, build_model, tmp_path, change):
    out = build_model(ckpt, "int8c", "host", ATTN, only=("model.bin", "libcolibri.so"))
    runtime = out / "libcolibri.so"  # the generic runtime
    ok = _mutated(out / "model.bin", tmp_path, _value(-8191))  # the range's end is a valid value
    load(ok, runtime=runtime).forward([1])
    with pytest.raises(ColibriError) as err:
        load(_mutated(out / "model.bin", tmp_path, change), runtime=runtime)
    assert err.value.status == E_BAD_TENSOR


def test_widths_that_are_not_whole_blocks_are_one_line(tmp_path):
    ck = synth(tmp_path / "ck40", layers=1, hidden=40, ffn=56, heads=4, kv_heads=2, experts=2, top_k=1, vocab=50,
               seed=3)
    out = tmp_path / "gen"
    res = subprocess.run([str(BIN / "colibri"), "export", str(ck), "-o", str(out), "--attn-quant", "int16:1"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and not out.exists()
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "int16" in lines[0] and "40 wide" in lines[0] and str(ck) in lines[0], res.stderr


def test_runtime_specialised_to_int8c_has_no_int16(ckpt, build_model):
    """A runtime specialised to a model without int16 tensors is built without the int16 kernels (model.h
    COLIBRI_INT16 0: an int8c firmware image carries none of their flash or stack) and refuses an int16 blob of
    the same model with COLIBRI_E_DTYPE; the generic runtime and the int16 model's own runtime run it alike."""
    out8 = build_model(ckpt, "int8c", "host")
    out16 = build_model(ckpt, "int8c", "host", ATTN)
    assert "#define COLIBRI_INT16 0" in (out8 / "include" / "model.h").read_text()
    assert "#define COLIBRI_INT16 1" in (out16 / "include" / "model.h").read_text()
    with pytest.raises(ColibriError) as e:
        load(out16 / "model.bin", out8 / f"libcolibri_{out8.name}.so").forward([1])
    assert e.value.status == E_DTYPE, e.value
    want = load(out16 / "model.bin", out8 / "libcolibri.so").forward([1])
    got = load(out16 / "model.bin", out16 / f"libcolibri_{out16.name}.so").forward([1])
    assert np.array_equal(want, got)


def test_a_whole_model_in_int16_gives_the_references_tokens(ckpt, build_model):
    """--quant int16: every matrix int16 (experts and lm_head included), through the specialised and the generic
    runtime: the reference's greedy tokens on the blob's weights, logits within 1e-4 of its max."""
    out = build_model(ckpt, "int16", "host")
    raw = (out / "model.bin").read_bytes()
    matrices = [e for e in entries(raw) if e["rows"] > 1 and e["kind"] not in (2, 9)]  # not rope_freq, the router
    assert matrices and {e["dtype"] for e in matrices} == {INT16}
    spec = open_checkpoint(ckpt).spec
    ref = Reference(spec, blob_weights(out / "model.bin"), max_seq=64)
    want_logits = ref.forward(PROMPT)
    ref.reset()
    want = ref.generate(PROMPT, 12)
    for m in (load(out / f"libcolibri_{out.name}.so"), load(out / "model.bin")):
        assert m.generate(PROMPT, 12) == want
        m.reset()
        got = m.forward(PROMPT)
        assert float(np.max(np.abs(got - want_logits))) <= 1e-4 * float(np.max(np.abs(want_logits)))
