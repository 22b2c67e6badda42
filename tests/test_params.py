"""The blob's parameters section (FORMAT.md "Parameters"): the C validator's statuses for each malformed
section, the Python readers (format.read_params, tests/blobread.py, `colibri inspect`) against the same
bytes.

The blobs are a valid export rewritten with a PARAMS entry inserted where FORMAT.md puts it (after
FINAL_NORM / LM_HEAD, before TOKENIZER), written here from FORMAT.md's words, not with the exporter's code.
"""

from __future__ import annotations

import struct
import zlib

import pytest

from colibri.codegen import format as fmt
from colibri.codegen.inspect import format_report, inspect

from blobread import PARAMS_FLAG, PARAMS_KIND, TOKENIZER_FLAG, U8, entries, entry_offset, header, params_records
from cbuild import ASAN, FUZZ_SRC, SCALAR, compile_c, run_files

S = {"OK": 0, "VERSION": 3, "BAD_HEADER": 6, "TENSOR_BOUNDS": 7, "BAD_TENSOR": 8}
ENTRY = "<HHHBBIIIIIIQQQQ"
UNKNOWN_KEY = 31  # reserved for this feature group, known to no runtime yet


def _align(n: int) -> int:
    return -(-n // 64) * 64


def with_params(raw: bytes, section: bytes, *, rows: int | None = None, dtype: int = U8, flag: bool = True,
                extra_flags: int = 0, entry: bool = True, off_delta: int = 0) -> bytes:
    """raw with a PARAMS entry (kind 28, U8, rows = len(section) unless given, cols 1, row_stride 1) holding
    `section`, 64-aligned at the blob's end; the table grows by one entry (the data moves when the table
    needs another 64 bytes), n_tensors, blob_bytes, flags and the CRC follow."""
    h = header(raw)
    es = entries(raw)
    n_old = h["n_tensors"]
    at = n_old - 1 if h["flags"] & TOKENIZER_FLAG else n_old  # before the tokenizer's entry
    n_new = n_old + (1 if entry else 0)
    hb_old, hb_new = h["header_bytes"], _align(256 + 64 * n_new)
    shift = hb_new - hb_old
    body = raw[hb_old:]
    out = bytearray(hb_new) + body
    out = out.ljust(_align(len(out)), b"\0")
    data_off = len(out)
    out += section
    out = out.ljust(_align(len(out)), b"\0")
    out[:256] = raw[:256]
    keys = ("kind", "layer", "expert", "dtype", "scale_dtype", "rows", "cols", "row_stride", "group_size",
            "n_outliers", "reserved", "data_off", "scale_off", "oidx_off", "oval_off")
    table = []
    for e in es:
        e = dict(e)
        for k in ("data_off", "scale_off", "oidx_off", "oval_off"):
            if e[k]:
                e[k] += shift
        table.append(e)
    if entry:
        table.insert(at, dict.fromkeys(keys, 0) | {
            "kind": PARAMS_KIND, "dtype": dtype, "rows": len(section) if rows is None else rows, "cols": 1,
            "row_stride": 1, "data_off": data_off + off_delta})
    for i, e in enumerate(table):
        struct.pack_into(ENTRY, out, entry_offset(i), *(e[k] for k in keys))
    struct.pack_into("<I", out, 12, hb_new)
    struct.pack_into("<Q", out, 16, len(out))
    struct.pack_into("<I", out, 24, n_new)
    struct.pack_into("<I", out, 28, h["flags"] | (PARAMS_FLAG if flag else 0) | extra_flags)
    struct.pack_into("<H", out, 6, max(h["version_minor"], 1))  # a feature flag: format 1.1 at least
    struct.pack_into("<I", out, 8, zlib.crc32(bytes(out[12:])))
    return bytes(out)


def records(*recs: tuple[int, int, int]) -> bytes:
    return b"".join(struct.pack("<HHI", *r) for r in recs)


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> bytes:
    """A small valid export (two layers, a tokenizer-less f32 blob)."""
    from colibri.codegen.export import ExportOptions, export
    from colibri.codegen.synth import synth_checkpoint

    base = tmp_path_factory.mktemp("params-seed")
    ckpt = synth_checkpoint(base / "ckpt", layers=2, hidden=16, ffn=16, heads=2, kv_heads=1, experts=2, top_k=1,
                            vocab=24, seed=41)
    export(ckpt, base / "out", ExportOptions(quant="f32", prompt=[1], generate=1, predict=False, max_seq=6))
    return (base / "out" / "model.bin").read_bytes()


@pytest.fixture(scope="module")
def validator(tmp_path_factory):
    """runtime_c/test/fuzz_blob.c's file runner (ASan + UBSan): each blob's init status."""
    runner = compile_c(tmp_path_factory.mktemp("params-runner") / "fuzz_run", FUZZ_SRC,
                       ASAN + ["-DCB_FUZZ_MAIN"] + SCALAR)

    def statuses(blobs: dict[str, bytes], where) -> dict[str, int]:
        files = []
        for name, data in blobs.items():
            path = where / f"{name}.bin"
            path.write_bytes(data)
            files.append(path)
        return {p.rsplit("/", 1)[-1][:-4]: raw for raw, _, p in run_files(runner, files)}

    return statuses


def bad_sections(seed: bytes) -> dict[str, tuple[bytes, str]]:
    """Each malformed section and the status FORMAT.md gives it."""
    k = UNKNOWN_KEY
    return {
        "unknown_key": (with_params(seed, records((k, 0, 5))), "VERSION"),
        "unknown_key_zero": (with_params(seed, records((0, 0, 5))), "VERSION"),
        "unsorted": (with_params(seed, records((k, 1, 5), (k, 0, 5))), "BAD_HEADER"),
        "unsorted_keys": (with_params(seed, records((k, 0, 5), (k - 1, 0, 5))), "BAD_HEADER"),
        "repeated": (with_params(seed, records((k, 0, 5), (k, 0, 6))), "BAD_HEADER"),
        "length_not_records": (with_params(seed, records((k, 0, 5)) + b"\0\0\0\0"), "BAD_TENSOR"),
        "length_zero": (with_params(seed, records((k, 0, 5)), rows=0), "BAD_TENSOR"),
        "not_u8": (with_params(seed, records((k, 0, 5)), dtype=1), "BAD_TENSOR"),
        "outside_payload": (with_params(seed, records((k, 0, 5)), off_delta=64), "TENSOR_BOUNDS"),
        "misaligned": (with_params(seed, records((k, 0, 5)), off_delta=8), "TENSOR_BOUNDS"),
        "flag_without_entry": (with_params(seed, b"", entry=False), "BAD_TENSOR"),
        "entry_without_flag": (with_params(seed, records((k, 0, 5)), flag=False), "BAD_TENSOR"),
    }


def test_bad_sections_get_their_status(seed, validator, tmp_path):
    assert validator({"seed": seed}, tmp_path) == {"seed": S["OK"]}
    cases = bad_sections(seed)
    got = validator({name: data for name, (data, _) in cases.items()}, tmp_path)
    assert got == {name: S[code] for name, (_, code) in cases.items()}


def test_python_readers_see_the_section(seed, tmp_path):
    sec = records((UNKNOWN_KEY, 0, 5), (UNKNOWN_KEY, 1, 7))
    blob = with_params(seed, sec)
    assert params_records(blob) == [(UNKNOWN_KEY, 0, 5), (UNKNOWN_KEY, 1, 7)]
    with pytest.raises(ValueError, match=f"key {UNKNOWN_KEY} is unknown"):
        fmt.read_params(sec, 2, PARAMS_FLAG)
    with pytest.raises(ValueError, match="unsorted or repeated"):
        fmt.read_params(records((UNKNOWN_KEY, 1, 5), (UNKNOWN_KEY, 0, 5)), 2, PARAMS_FLAG)
    with pytest.raises(ValueError, match="not a positive multiple of 8"):
        fmt.read_params(sec[:12], 2, PARAMS_FLAG)
    path = tmp_path / "model.bin"
    path.write_bytes(blob)
    info = inspect(path)
    assert info["params"] == {"problem": f"parameter key {UNKNOWN_KEY} is unknown to this version"}
    assert f"parameters section: problem: parameter key {UNKNOWN_KEY} is unknown" in format_report(info)
    assert "tokenizer_bytes" not in info and info["payload_bytes"] < len(blob)  # the section is not weights


def test_format_tables_name_the_section():
    """The reserved codes: flag 10, kind 28, U8, the table's place before TOKENIZER, 8-byte records."""
    assert fmt.FLAG["PARAMS"] == PARAMS_FLAG and fmt.KIND["PARAMS"].code == PARAMS_KIND
    assert fmt.PARAM_RECORD.size == 8 and fmt.BYTES_DTYPE == U8
    tail = [k for k, _ in fmt.GLOBAL_TAIL]
    assert tail.index("PARAMS") == tail.index("TOKENIZER") - 1
    assert all(1 <= p.code <= 63 and p.type in fmt.PARAM_TYPES and p.flag in fmt.FLAG for p in fmt.PARAMS)
