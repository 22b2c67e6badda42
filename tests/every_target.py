"""One model in one quantization on every Linux target, checked against the numpy reference; a failure names
every target that failed and how, not just the first.

Each target runs its own export (the blob of its layout, build_model.many: one SCons run for all targets,
one export per layout) through the target's colibri_run, the generic runtime (every feature read from the
blob; its objects are model-independent, so a target's colibri_run is built once and serves every model);
the host also runs colibri_demo, the runtime specialised for the model (its constants compiled in).

f32: greedy tokens equal the reference's on the checkpoint's weights, logits within 1e-4 x max|logit|.
int8c, int4c: greedy tokens equal the reference's on the blob's own dequantized weights (blobread.weights,
with the integer matmuls' int8 activations as the runtime quantizes them), and every target prints the
host build's logits bit for bit (integer matmuls: exact integer sums, fixed float steps).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from test_cross import _parse, _run

from colibri.codegen.reference import Reference

from blobread import weights as blob_weights
from conftest import require_target
from targets_under_test import HOST, cross

TARGETS = [HOST, *cross()]
QUANTS = ("f32", "int8c", "int4c")
LOGIT_TOLERANCE = 1e-4  # of max|logit|, f32


_RUNNERS: dict[tuple[str, str], Path] = {}  # (build root, target): that target's colibri_run


def _exports(build_model, ckpt: Path, quant: str, extra: tuple[str, ...]) -> tuple[dict[str, Path], dict[str, Path]]:
    """Every target's export of the model ({target: output directory}) and colibri_run, in one SCons run; the
    colibri_run programs are linked once, in the output directories of the first model asked for (the
    generic runtime reads any blob)."""
    root = str(build_model.root)
    first = any((root, t) not in _RUNNERS for t in TARGETS)
    only = ("model.bin", "colibri_run") if first else ("model.bin",)
    outs = build_model.many(ckpt, quant, TARGETS, *extra, only=only)[0]
    for t in TARGETS:
        _RUNNERS.setdefault((root, t), outs[t] / "colibri_run")
    return outs, {t: _RUNNERS[root, t] for t in TARGETS}


def _attempt(target: str, program: Path, *args: str):
    try:
        return _parse(_run(target, program, *args))
    except (AssertionError, StopIteration) as e:  # exit status, or no tokens:/logits: line
        lines = [x for x in f"{e}".splitlines() if x.strip()]
        return " / ".join(lines[:1] + lines[1:][-1:]) or type(e).__name__  # the exit status, stderr's last line


def check_every_target(build_model, ckpt: Path, quant: str, reference: Callable[[dict | None], Reference],
                       prompt: list[int], n_gen: int, *extra: str, what: str = "") -> dict[str, Path]:
    """Builds colibri_demo of ckpt for every Linux target (host included) in one SCons run and checks each
    against reference(weights) (weights None: the checkpoint's own; else the blob's dequantized weights).
    Returns {target: its output directory}."""
    for t in TARGETS:
        require_target(t)
    outs, runners = _exports(build_model, ckpt, quant, extra)
    demo = build_model.many(ckpt, quant, [HOST], *extra, only=("colibri_demo",))[0][HOST] / "colibri_demo"
    expected: dict[str, tuple[np.ndarray, list[int]]] = {}  # by the blob's hash: one export per layout

    def expectation(blob: Path) -> tuple[np.ndarray, list[int]]:
        key = hashlib.sha256(blob.read_bytes()).hexdigest()
        if key not in expected:
            ref = reference(None if quant == "f32" else blob_weights(blob))
            logits = ref.forward(prompt)
            ref.reset()
            expected[key] = (logits, ref.generate(prompt, n_gen))
        return expected[key]

    args = ("--tokens", ",".join(map(str, prompt)), "--generate", str(n_gen), "--print-logits")
    jobs = {t: (runners[t], str(outs[t] / "model.bin"), *args) for t in outs}
    jobs[f"{HOST} colibri_demo"] = (demo, *args)
    with ThreadPoolExecutor(2) as pool:  # QEMU runs two at a time: the machine's two cores
        runs = dict(zip(jobs, pool.map(lambda j: _attempt(j.split()[0], *jobs[j]), jobs), strict=True))
    failures = []
    host = runs[HOST]
    for target, got in runs.items():
        if isinstance(got, str):
            failures.append(f"{target}: {got}")
            continue
        tokens, logits = got
        want_logits, want_tokens = expectation(outs[target.split()[0]] / "model.bin")
        if tokens != want_tokens:
            failures.append(f"{target}: tokens {tokens} != the reference's {want_tokens}")
        bound = LOGIT_TOLERANCE * float(np.max(np.abs(want_logits)))
        if quant == "f32" and (err := float(np.max(np.abs(logits - want_logits)))) > bound:
            failures.append(f"{target}: max logit error {err:.3g} > {bound:.3g}")
        elif quant != "f32" and target != HOST and not isinstance(host, str) and not np.array_equal(logits, host[1]):
            failures.append(f"{target}: logits differ from the host build's bits")
    assert not failures, f"{what or ckpt.name} {quant}: " + "; ".join(failures)
    return outs
