"""The trained demo model answers held-out sums through the C runtime, quantized."""

from __future__ import annotations

import json
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "firmware_examples/models"))

import adder_task  # noqa: E402
from ask import answer  # noqa: E402

from colibri.runtime import load  # noqa: E402

ADDER = ROOT / "firmware_examples/models/adder"
N_PROBLEMS = 200


def test_int8c_demo_model_solves_heldout_sums(build_model):
    task = json.loads((ADDER / "task.json").read_text())
    out = build_model(ADDER, "int8c")
    m = load(out / "libcolibri_adder.so")
    problems = adder_task.make_problems(task["heldout_seed"], N_PROBLEMS, task["max_digits"])
    right = sum(answer(m, prompt.rstrip("=")) == want for prompt, want in problems)
    assert right / N_PROBLEMS >= 0.99, f"{right}/{N_PROBLEMS} held-out sums right"


def test_demo_model_fits_the_stm32h7_budget(build_model):
    out = build_model(ADDER, "int8c", "stm32h7")
    report = json.loads((out / "adder.size.json").read_text())
    assert report["regions"]["flash"]["bytes"] <= 2 * 1024 * 1024
    assert report["regions"]["ram"]["bytes"] <= 1024 * 1024
