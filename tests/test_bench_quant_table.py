"""bench/quant_table.py --by-class: a row per kind of matrix and per layer, with only those matrices quantized.
The groups must cover exactly what the export quantizes (so the bits the rows save add up to what the full
quantization saves, kind by kind and again layer by layer), leave out what stays f32 (norms, router), and each
row must measure a quantization that really happened (non-zero KL)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import ROOT, synth

TABLE = ROOT / "bench" / "quant_table.py"
ROW = re.compile(r"^(?P<label>.+?)\s+(?P<bits>\d+\.\d{3})\s+(?P<kl>\S+)\s+\S+\s+\S+%")


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> dict[str, tuple[float, float]]:
    ck = synth(tmp_path_factory.mktemp("qt") / "ck", layers=2, hidden=32, ffn=64, heads=2, kv_heads=1, experts=2,
               top_k=1, vocab=64, seed=5)
    res = subprocess.run([sys.executable, str(TABLE), str(ck), "--seqs", "2", "--len", "4", "--calib-seqs", "0",
                          "--jitter", "0", "--by-class", "int8c"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    rows = {}
    for line in res.stdout.splitlines():
        m = ROW.match(line)
        if m:
            rows[m["label"]] = (float(m["bits"]), float(m["kl"]))
    return rows


KINDS = ("embed", "lm_head", "attn.q", "attn.k", "attn.v", "attn.o", "moe.experts.#.gate", "moe.experts.#.up",
         "moe.experts.#.down")
LAYERS = ("layer 0", "layer 1")


def test_the_groups_are_the_quantized_matrices(table):
    groups = {label.rsplit(" ", 1)[0] for label in table if label.endswith((" int", " float"))}
    assert groups == set(KINDS) | set(LAYERS)  # no router, no norms, no expert or layer numbers in a kind


@pytest.mark.parametrize("groups", [KINDS, ("embed", "lm_head") + LAYERS], ids=["kinds", "layers"])
def test_the_rows_savings_add_up_to_the_full_quantizations(table, groups):
    full = table["colibri int8c"][0]
    saved = sum(32.0 - table[f"{g} int"][0] for g in groups)
    assert saved == pytest.approx(32.0 - full, abs=0.0011 * (len(groups) + 1))  # the printed rounding


def test_every_row_measures_a_quantization(table):
    for g in KINDS + LAYERS:
        for act in ("int", "float"):
            bits, kl = table[f"{g} {act}"]
            assert 8.0 < bits < 32.0 and kl > 0.0, (g, act, bits, kl)
    # activations only enter where the runtime makes them integer: not in the embedding's lookup
    assert table["embed int"] == table["embed float"]
    assert table["attn.q int"] != table["attn.q float"]


def test_a_directory_without_a_checkpoint_is_one_line(tmp_path):
    res = subprocess.run([sys.executable, str(TABLE), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().count("\n") == 0 and str(tmp_path / "config.json") in res.stderr, res.stderr
    assert res.stdout == ""


def test_an_unknown_quantization_is_refused(tmp_path):
    res = subprocess.run([sys.executable, str(TABLE), str(tmp_path), "--by-class", "int7"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "int7" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert res.stdout == ""


def test_the_int16_row_is_f16_1s_matrices_at_14_bits_with_integer_activations(table):
    bits16, kl16 = table["colibri int8c attn=int16:1"]
    bits_f16, _ = table["colibri int8c attn=f16:1"]
    assert bits_f16 < bits16 < bits_f16 + 0.5  # the same matrices at 16 bits, plus an f32 scale a row
    assert 0.0 < kl16 < table["colibri int8c"][1]
