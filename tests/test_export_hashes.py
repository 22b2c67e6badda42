"""model.bin stays byte for byte what the exporter wrote before its speed-ups (#19): every case of
tests/export_cases.py is re-exported and its sha256 compared with tests/fixtures/export_hashes.json
(recorded by tests/fixtures/make_export_hashes.py on the exporter before they were made). Format 1.4 (attention
lanes) changed only three header fields of every blob, the minor, the CRC and arena_bytes (checked byte by byte
against the 1.3 exporter's blobs before its hashes were re-recorded; the recorded errors are the 1.3 ones)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from export_cases import CASES, CKPTS, export_case, tensor_errors

from conftest import synth

RECORDED = json.loads((Path(__file__).parent / "fixtures" / "export_hashes.json").read_text())
# the manifest's errors may differ in the last digits only (an accumulation order), never more than this
ERROR_RTOL = 1e-9


@pytest.fixture(scope="module")
def hash_ckpts(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("hashes")
    return {name: synth(base / name, **kw) for name, kw in CKPTS.items()}


def test_every_case_recorded():
    assert sorted(RECORDED) == sorted(c for c, _, _ in CASES)


@pytest.mark.parametrize("case,ckpt,opts", CASES, ids=[c for c, _, _ in CASES])
def test_blob_bytes_unchanged(hash_ckpts, tmp_path, case, ckpt, opts):
    digest, manifest = export_case(hash_ckpts[ckpt], tmp_path / "out", opts)
    assert digest == RECORDED[case]["model_bin_sha256"], f"{case}: model.bin differs from the recorded export"
    errors, want = tensor_errors(manifest), RECORDED[case]["rel_errors"]
    assert sorted(errors) == sorted(want)
    for name, fields in want.items():
        assert sorted(errors[name]) == sorted(fields), name
        for k, v in fields.items():
            assert math.isclose(errors[name][k], v, rel_tol=ERROR_RTOL, abs_tol=1e-15), (name, k, errors[name][k], v)
