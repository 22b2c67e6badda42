"""bench/speed.py's ratio to llama-bench: each colibri run against the llama-bench run of its own round, so a
round where the whole machine ran slow or fast leaves the ratio alone (the median of the medians' ratio would
not)."""

from __future__ import annotations

import importlib.util

import pytest

from conftest import ROOT


def _speed():
    spec = importlib.util.spec_from_file_location("bench_speed", ROOT / "bench" / "speed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ratio_pairs_runs_by_round():
    # rounds: 100/50 = 2.0, 200/250 = 0.8, 300/150 = 2.0; the medians' ratio would be 200/150 = 1.33
    assert _speed().paired([100.0, 200.0, 300.0], [50.0, 250.0, 150.0], 2) == "2.00 [0.80-2.00]"


def test_ratio_refuses_unpaired_samples():
    with pytest.raises(ValueError):
        _speed().paired([100.0, 200.0], [50.0], 2)
