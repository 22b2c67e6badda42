"""The exporter's bad-input matrix, through the `colibri export` command.

Every case: exit status 2, exactly one line on stderr (`colibri: error: <file>: <what>`, compared
in full), and an output directory holding a previous export left exactly as it was, with no
staging directory beside it. Plus an export killed with SIGKILL half-way through.
(test_import.py checks the same readers at the API level, test_export.py the basic CLI cases.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import BIN, synth

SMALL = dict(layers=1, hidden=16, ffn=24, heads=2, kv_heads=1, experts=3, top_k=2, vocab=32, seed=3)
PNG = b"\x89PNG\r\n\x1a\n"


def colibri(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "colibri"), *map(str, args)], capture_output=True, text=True, timeout=120, **kw)


# ---------------------------------------------------------------------------------- editing the input

def _header(st: Path) -> tuple[dict, bytes]:
    raw = st.read_bytes()
    n = struct.unpack_from("<Q", raw)[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write(st: Path, header: dict, data: bytes) -> None:
    text = json.dumps(header).encode()
    st.write_bytes(struct.pack("<Q", len(text)) + text + data)


def _edit_header(ck: Path, fn) -> dict:
    st = ck / "model.safetensors"
    header, data = _header(st)
    values = fn(header, data) or {}
    _write(st, header, data)
    return values


def _config(ck: Path, **changes) -> None:
    cfg = json.loads((ck / "config.json").read_text())
    for k, v in changes.items():
        if v is ...:
            del cfg[k]
        else:
            cfg[k] = v
    (ck / "config.json").write_text(json.dumps(cfg))


def _poison(ck: Path, name: str, dtype: str, value: float, at: tuple[int, int]) -> None:
    """Rewrite one tensor in another float dtype with one non-finite weight."""
    header, data = _header(ck / "model.safetensors")
    tensors = {}
    for key, e in header.items():
        if key == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        arr = np.frombuffer(data[begin:end], dtype="<f4").reshape(e["shape"]).copy()
        tensors[key] = arr
    w = tensors[name]
    w[at] = value
    from colibri.codegen.synth import encode, write_safetensors

    write_safetensors(ck / "model.safetensors",
                      [(k, dtype if k == name else "F32", v.shape, encode(v, dtype if k == name else "F32"))
                       for k, v in tensors.items()])


def header_truncated(ck):
    st = ck / "model.safetensors"
    raw = st.read_bytes()
    st.write_bytes(raw[:100])
    return {"n": struct.unpack_from("<Q", raw)[0]}


def header_json_invalid(ck):
    text = b'{"a": [1, 2}'
    (ck / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text)


def header_length_beyond_file(ck):
    st = ck / "model.safetensors"
    raw = bytearray(st.read_bytes())
    struct.pack_into("<Q", raw, 0, len(raw))
    st.write_bytes(bytes(raw))
    return {"n": len(raw), "after": len(raw) - 8}


def header_length_absurd(ck):
    st = ck / "model.safetensors"
    raw = bytearray(st.read_bytes())
    struct.pack_into("<Q", raw, 0, 1 << 62)
    st.write_bytes(bytes(raw))


def offsets_overlap(ck):
    def fn(h, data):
        a, b = h["model.embed_tokens.weight"], h["model.layers.0.input_layernorm.weight"]
        b["data_offsets"] = [a["data_offsets"][0] + 4, a["data_offsets"][0] + 4 + 64]
    _edit_header(ck, fn)


def offsets_past_end(ck):
    def fn(h, data):
        b, e = h["lm_head.weight"]["data_offsets"]
        h["lm_head.weight"]["data_offsets"] = [b + 64, e + 64]
        return {"b": b + 64, "e": e + 64, "size": len(data)}
    return _edit_header(ck, fn)


def offsets_beyond_64_bits(ck):
    def fn(h, data):
        h["model.norm.weight"]["data_offsets"] = [2**64 - 8, 2**64 + 56]
        return {"size": len(data)}
    return _edit_header(ck, fn)


def dtype_not_matching_length(ck):
    _edit_header(ck, lambda h, data: h["model.norm.weight"].update(dtype="F16"))


def shape_product_overflows(ck):
    _edit_header(ck, lambda h, data: h["model.norm.weight"].update(shape=[2**32, 2**32, 2**32]))


def not_safetensors_png(ck):
    (ck / "model.safetensors").write_bytes(PNG + bytes(range(256)) * 4)


def not_safetensors_zip(ck):
    (ck / "model.safetensors").write_bytes(b"PK\x03\x04" + bytes(1996))


def not_safetensors_text(ck):
    text = b"weights will be uploaded later\n"
    (ck / "model.safetensors").write_bytes(text)
    return {"n": int.from_bytes(text[:8], "little")}


def not_safetensors_empty(ck):
    (ck / "model.safetensors").write_bytes(b"")


def config_missing_hidden_size(ck):
    _config(ck, hidden_size=...)


def config_missing_num_local_experts(ck):
    _config(ck, num_local_experts=...)


def config_missing_num_experts_per_tok(ck):
    _config(ck, num_experts_per_tok=...)


def config_ffn_inconsistent_with_tensors(ck):
    _config(ck, intermediate_size=32)


def config_hidden_inconsistent_with_tensors(ck):
    _config(ck, hidden_size=32, head_dim=8)


def config_top_k_above_experts(ck):
    _config(ck, num_experts_per_tok=4)


def config_top_k_above_runtime_limit(ck):
    _config(ck, num_local_experts=20, num_experts_per_tok=17)


def config_zero_experts(ck):
    _config(ck, num_local_experts=0)


def config_negative_vocab(ck):
    _config(ck, vocab_size=-5)


def config_negative_layers(ck):
    _config(ck, num_hidden_layers=-1)


def config_dims_product_beyond_64_bits(ck):
    _config(ck, vocab_size=2**40, hidden_size=2**40)


def config_layers_beyond_64_bits(ck):
    _config(ck, num_hidden_layers=2**70)


def config_layers_times_experts_absurd(ck):
    _config(ck, num_hidden_layers=65535, num_local_experts=65535)


def config_eps_beyond_float32(ck):
    _config(ck, rms_norm_eps=1e300)


def config_eps_nan(ck):
    (ck / "config.json").write_text((ck / "config.json").read_text().replace('"rms_norm_eps": 1e-05',
                                                                              '"rms_norm_eps": NaN'))


def nan_weight_f16(ck):
    _poison(ck, "model.layers.0.block_sparse_moe.experts.2.w2.weight", "F16", np.nan, (5, 7))


def inf_weight_bf16(ck):
    _poison(ck, "model.layers.0.self_attn.o_proj.weight", "BF16", -np.inf, (0, 3))


def index_names_missing_shard(ck):
    (ck / "model-00002-of-00002.safetensors").unlink()


def safetensors_is_a_directory(ck):
    (ck / "model.safetensors").unlink()
    (ck / "model.safetensors").mkdir()


ST, CFG, IDX = "{ck}/model.safetensors", "{ck}/config.json", "{ck}/model.safetensors.index.json"
CASES = {f.__name__: (f, msg) for f, msg in [
    (header_truncated, ST + ": truncated: header length {n} exceeds the 92 bytes after the length field"),
    (header_json_invalid, ST + ": not a safetensors file: invalid header JSON: Expecting ',' delimiter: "
                               "line 1 column 12 (char 11)"),
    (header_length_beyond_file, ST + ": truncated: header length {n} exceeds the {after} bytes after the "
                                     "length field"),
    (header_length_absurd, ST + ": not a safetensors file: header length 4611686018427387904 exceeds the "
                                "100000000-byte limit of the format"),
    (offsets_overlap, ST + ": tensor model.layers.0.input_layernorm.weight: data offsets overlap those of "
                           "tensor model.embed_tokens.weight"),
    (offsets_past_end, ST + ": tensor lm_head.weight: truncated: data_offsets [{b}, {e}] run past the end of "
                            "the data section ({size} bytes)"),
    (offsets_beyond_64_bits, ST + ": tensor model.norm.weight: truncated: data_offsets [18446744073709551608, "
                                  "18446744073709551672] run past the end of the data section ({size} bytes)"),
    (dtype_not_matching_length, ST + ": tensor model.norm.weight: byte length 64 does not match dtype F16 x "
                                     "shape [16] = 32 bytes"),
    (shape_product_overflows, ST + ": tensor model.norm.weight: shape [4294967296, 4294967296, 4294967296] of "
                                   "F32 is 316912650057057350374175801344 bytes, more than a 64-bit size can hold"),
    (not_safetensors_png, ST + ": not a safetensors file: header length 727905341920923785 exceeds the "
                               "100000000-byte limit of the format"),
    (not_safetensors_zip, ST + ": not a safetensors file or truncated: header length 67324752 exceeds the 1992 "
                               "bytes after the length field"),
    (not_safetensors_text, ST + ": not a safetensors file: header length {n} exceeds the 100000000-byte limit "
                                "of the format"),
    (not_safetensors_empty, ST + ": not a safetensors file: 0 bytes, too short for the 8-byte header length"),
    (safetensors_is_a_directory, ST + ": safetensors file is a directory, not a regular file"),
    (config_missing_hidden_size, CFG + ": key 'hidden_size': missing required key"),
    (config_missing_num_local_experts, CFG + ": key 'num_local_experts': missing required key"),
    (config_missing_num_experts_per_tok, CFG + ": key 'num_experts_per_tok': missing required key"),
    (config_ffn_inconsistent_with_tensors, ST + ": tensor model.layers.0.block_sparse_moe.experts.0.w1.weight: "
                                                "shape [24, 16] does not match the config's [32, 16]"),
    (config_hidden_inconsistent_with_tensors, ST + ": tensor model.embed_tokens.weight: shape [32, 16] does not "
                                                   "match the config's [32, 32]"),
    (config_top_k_above_experts, CFG + ": key 'num_experts_per_tok': 4 exceeds num_local_experts 3"),
    (config_top_k_above_runtime_limit, CFG + ": key 'num_experts_per_tok': 17 exceeds 16, the most experts per "
                                             "token the runtime routes to"),
    (config_zero_experts, CFG + ": key 'num_local_experts': must be positive, got 0"),
    (config_negative_vocab, CFG + ": key 'vocab_size': must be positive, got -5"),
    (config_negative_layers, CFG + ": key 'num_hidden_layers': must be positive, got -1"),
    (config_dims_product_beyond_64_bits, CFG + ": key 'hidden_size': 1099511627776 exceeds 4294967295, the "
                                               "largest dimension model.bin can hold"),
    (config_layers_beyond_64_bits, CFG + ": key 'num_hidden_layers': 1180591620717411303424 exceeds 65535, the "
                                         "most layers model.bin can hold"),
    (config_layers_times_experts_absurd, CFG + ": describes 65535 layers of 65535 experts, at least 12884967422 "
                                               "tensors, but the checkpoint files hold 19"),
    (config_eps_beyond_float32, CFG + ": key 'rms_norm_eps': 1e+300 is beyond the float32 range model.bin "
                                      "stores it in"),
    (config_eps_nan, CFG + ": key 'rms_norm_eps': must be a number, got nan"),
    (nan_weight_f16, ST + ": tensor model.layers.0.block_sparse_moe.experts.2.w2.weight: 1 non-finite values "
                          "(NaN or Inf), the first at index [5, 7]"),
    (inf_weight_bf16, ST + ": tensor model.layers.0.self_attn.o_proj.weight: 1 non-finite values (NaN or Inf), "
                           "the first at index [0, 3]"),
    (index_names_missing_shard, IDX + ": shard model-00002-of-00002.safetensors listed in weight_map does not "
                                      "exist"),
]}


@pytest.fixture(scope="module")
def previous(tmp_path_factory) -> Path:
    """A finished export, copied into each case's output directory before the bad export."""
    base = tmp_path_factory.mktemp("previous")
    out = base / "out"
    res = colibri("export", synth(base / "prev", **{**SMALL, "seed": 99}), "-o", out, "--no-predict")
    assert res.returncode == 0, res.stderr
    return out


def _snapshot(d: Path) -> dict:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(d.iterdir())}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_one_line_exit_2_output_untouched(case, tmp_path, previous):
    mutate, template = CASES[case]
    ck = synth(tmp_path / "ck", **SMALL, shards=2 if case.startswith("index_") else 1)
    values = mutate(ck) or {}
    out = tmp_path / "out"
    shutil.copytree(previous, out)
    before = _snapshot(out)
    res = colibri("export", ck, "-o", out)
    assert res.returncode == 2, f"exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    assert res.stderr == f"colibri: error: {template.format(ck=ck, **values)}\n"
    assert _snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "out"]  # no staging directory left


def test_export_killed_half_way_leaves_previous_output(tmp_path, previous):
    out = tmp_path / "out"
    shutil.copytree(previous, out)
    before = _snapshot(out)
    big = synth(tmp_path / "big", layers=8, hidden=128, ffn=256, heads=4, kv_heads=2, experts=8, top_k=2,
                vocab=256, seed=5)
    # One line per tensor, ~18 KB of them after the one awaited; with the pipe at one page (and at most as
    # much again in this reader's buffer) the export blocks in a write before it can end, however late
    # this process gets to look at it.
    proc = subprocess.Popen([str(BIN / "colibri"), "export", str(big), "-o", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            pipesize=os.sysconf("SC_PAGE_SIZE"))
    try:
        for line in proc.stdout:  # one line per tensor written: stop it in layer 1 of 8
            if "layers.1.moe.experts.0.gate" in line:
                break
        assert proc.poll() is None, "the export finished before it could be killed"
        # half-way: model.bin is being written, as a file that has no name yet
        fds = [os.readlink(f) for f in Path(f"/proc/{proc.pid}/fd").iterdir()]
        assert any(".out.tmp-" in f and "(deleted)" in f for f in fds), fds
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert _snapshot(out) == before  # nothing of the killed export in the output directory
    # No partial file anywhere: at most its empty staging directory and its (empty) lock file are left, which
    # the next export removes.
    left = [p for p in tmp_path.iterdir() if p.name not in ("out", "big", ".out.lock")]
    assert all(p.name.startswith(".out.tmp-") and not any(p.iterdir()) for p in left), left
    assert not (tmp_path / ".out.lock").exists() or (tmp_path / ".out.lock").stat().st_size == 0
    res = colibri("export", big, "-o", out, "--no-predict")
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big", "out"]
    assert _snapshot(out).keys() == before.keys() and _snapshot(out) != before
