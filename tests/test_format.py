"""The blob schema (codegen/format.py) against its generated outputs and against the independent reader
tests/blobread.py (written from FORMAT.md's prose, not from the schema)."""

from __future__ import annotations

import json
import os
import re
import struct
import zlib

import pytest

from colibri.codegen import format as fmt
from colibri.codegen import formatgen
from colibri.codegen.export import ExportOptions, export
from colibri.toolchain.size.weights import load_manifest

import blobread
from conftest import synth

# Qwen2-MoE with every optional tensor: q/k/v biases, a gated shared expert and a dense layer
FEATURES = dict(arch="qwen2_moe", layers=3, hidden=16, ffn=8, heads=2, kv_heads=1, experts=3, top_k=2, vocab=24,
                seed=41, shared_ffn=16, dense_layers=[1], dense_ffn=12)


def test_c_header_is_generated_from_the_schema():
    """runtime_c/src/cb_format.h is exactly what formatgen writes (run `python -m colibri.codegen.formatgen`)."""
    assert formatgen.C_HEADER.read_text() == formatgen.c_header()


def test_format_md_tables_are_generated_from_the_schema():
    text = formatgen.FORMAT_MD.read_text()
    assert formatgen.format_md(text) == text
    assert text.count("<!-- generated: ") == len(formatgen.doc_tables())


def test_header_fields_agree_with_the_independent_reader():
    """Every field blobread.py names sits at the same offset with the same type in the schema."""
    types = {"I": "u32", "H": "u16", "Q": "u64", "f": "f32"}
    for off, code, name in blobread.HEADER_FIELDS:
        f = fmt.H[name]
        assert (f.offset, f.type, f.count) == (off, types[code], 1), name
    assert blobread.KIND_NAMES == {
        k.code: k.canonical.replace("layers.{L}.", "").replace("moe.experts.{E}.", "") for k in fmt.KINDS}


@pytest.fixture(scope="module")
def feature_export(tmp_path_factory):
    base = tmp_path_factory.mktemp("features")
    ckpt = synth(base / "ckpt", **FEATURES)
    out = base / "gen"
    export(ckpt, out, ExportOptions(quant="int8", predict=False))
    return out


def test_crc_combine_equals_the_crc_of_the_concatenation():
    """crc32.combine (the writer sums the weights' CRC as it writes them and prefixes the header's) against
    zlib.crc32 of the joined bytes, including empty parts and a part of over a megabyte."""
    from colibri.codegen import crc32

    for n1, n2 in [(0, 0), (0, 5), (5, 0), (1, 1), (7, 1000), (64, (1 << 20) + 3), (3, 12345)]:
        a, b = os.urandom(n1), os.urandom(n2)
        assert crc32.combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b), (n1, n2)


def test_stored_crc_is_zlibs_of_the_written_blob(feature_export):
    """The blob's crc32 field is zlib's CRC-32 of its bytes from CRC_FROM to the end, read back from the file."""
    blob = (feature_export / "model.bin").read_bytes()
    field = fmt.H["crc32"]
    assert struct.unpack_from(field.fmt, blob, field.offset)[0] == zlib.crc32(blob[fmt.CRC_FROM:])


def test_table_order_is_the_schema_order(feature_export, golden_ckpts, tmp_path):
    """The table of a written blob, named by blobread.py, is format.blob_names() of the model."""
    from colibri.codegen.spec import ModelSpec

    outs = [feature_export]
    for name, ckpt in golden_ckpts.items():
        export(ckpt, tmp_path / name, ExportOptions(quant="f16", predict=False))
        outs.append(tmp_path / name)
    for out in outs:
        raw = (out / "model.bin").read_bytes()
        spec = ModelSpec.from_json(json.loads((out / "manifest.json").read_text())["spec"])
        assert [blobread.canonical_name(e) for e in blobread.entries(raw)] == fmt.blob_names(spec)
        h = fmt.read_header(raw)
        assert fmt.n_tensors(h["flags"], h["n_layers"], h["n_experts"], len(spec.dense_layers)) == h["n_tensors"]


# The size audit's class of each canonical name, written out here rather than taken from the schema.
def _expected_group(name: str) -> str:
    rules = [(r"embed$", "embedding"), (r"lm_head$", "lm_head"), (r"(.*norm)$", "norms"),
             (r"layers\.\d+\.attn\.", "attention"), (r"layers\.\d+\.moe\.router$", "router"),
             (r"layers\.\d+\.moe\.experts\.\d+\.", "experts"), (r"layers\.\d+\.moe\.shared", "shared_expert"),
             (r"layers\.\d+\.mlp\.", "dense_mlp")]
    return next(group for pattern, group in rules if re.match(pattern, name))


def test_manifest_tensors_carry_kind_layer_and_expert(feature_export):
    """The size audit reads each tensor's class, layer and expert from the manifest: the dense MLP, the
    shared expert and its gate are no longer "other"."""
    m = load_manifest(feature_export / "manifest.json")
    assert m is not None
    names = {t.name for t in m.tensors}
    assert {"layers.1.mlp.gate", "layers.0.moe.shared.down", "layers.2.moe.shared_gate"} <= names
    for t in m.tensors:
        assert t.kind == _expected_group(t.name), t.name
        layer = re.match(r"layers\.(\d+)\.", t.name)
        expert = re.search(r"\.experts\.(\d+)\.", t.name)
        assert t.layer == (int(layer.group(1)) if layer else None), t.name
        assert t.expert == (int(expert.group(1)) if expert else None), t.name


def test_huge_counts_are_bounded_before_anything_is_listed():
    """n_tensors is arithmetic: a header claiming 2^32-1 layers of 2^32-1 experts costs nothing to count,
    and the bounds readers apply are those of the table entry's u16 layer and expert fields."""
    big = 0xFFFFFFFF
    assert fmt.n_tensors(0, big, big, 0) == 4 + big * (7 + 3 * big)  # FORMAT.md: 2 + L(7 + 3E) + 2
    assert dict(fmt.SIZE_BOUNDS) == {"n_layers": 1 << 16, "n_experts": 1 << 16}


# ---- which check refused a blob: CB_BAD records its line in -DCOLIBRI_TRACE_CHECKS builds

def _header_offset(name: str) -> tuple[int, str]:
    return next((off, code) for off, code, n in blobread.HEADER_FIELDS if n == name)


def _with(raw: bytes, name: str, value) -> bytes:
    import struct
    import zlib

    b = bytearray(raw)
    off, code = _header_offset(name)
    struct.pack_into("<" + code, b, off, value)
    struct.pack_into("<I", b, 8, zlib.crc32(bytes(b[12:])))
    return bytes(b)


@pytest.fixture(scope="module")
def traced_runtime(tmp_path_factory):
    import ctypes

    from cbuild import RUNTIME_SRC, compile_c

    out = tmp_path_factory.mktemp("traced")
    lib = compile_c(out / "libtraced.so", RUNTIME_SRC, ["-shared", "-fPIC", "-DCOLIBRI_TRACE_CHECKS"])
    plain = compile_c(out / "libplain.so", RUNTIME_SRC, ["-shared", "-fPIC"])
    return ctypes.CDLL(str(lib)), ctypes.CDLL(str(plain))


def _check_line(lib, raw: bytes) -> tuple[int, int]:
    import ctypes

    buf = (ctypes.c_uint8 * (len(raw) + 64))()
    start = -ctypes.addressof(buf) % 64  # the runtime wants a 64-byte aligned blob
    ctypes.memmove(ctypes.addressof(buf) + start, raw, len(raw))
    line = ctypes.c_uint(0)
    status = lib.colibri_debug_check(ctypes.c_void_p(ctypes.addressof(buf) + start), ctypes.c_size_t(len(raw)),
                                     ctypes.byref(line))
    return status, line.value


def test_a_malformed_field_is_reported_by_its_check(traced_runtime, feature_export):
    """Six header fields, each made wrong on its own, refused with BAD_HEADER (6) by six different checks,
    each of which names the field on its line of blob.c; a good blob reports no check."""
    lib, plain = traced_runtime
    raw = (feature_export / "model.bin").read_bytes()
    h = blobread.header(raw)
    assert _check_line(lib, raw) == (0, 0)
    source = (formatgen.ROOT / "runtime_c" / "src" / "blob.c").read_text().splitlines()
    cases = {"shared_ffn": 0, "dense_ffn": 0, "routed_scale": 2.0, "top_k": h["n_experts"] + 1,
             "rms_eps": float("nan"), "n_layers": 0xFFFFFFFF}
    lines = {}
    for name, value in cases.items():
        status, line = _check_line(lib, _with(raw, name, value))
        assert status == 6 and line > 0, (name, status, line)
        assert name in source[line - 1], f"{name}: blob.c:{line} is {source[line - 1].strip()!r}"
        lines[name] = line
    assert len(set(lines.values())) == len(cases)
    with pytest.raises(AttributeError):  # a build without the flag has no trace at all
        plain.colibri_debug_check  # noqa: B018
