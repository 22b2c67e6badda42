"""Shared fixtures: small synthetic checkpoints and SCons builds of them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# Three shapes that between them cover what the spine must get right.
GOLDEN = {
    # GQA (4 query heads share 2 kv heads), top-2, odd sizes, explicit head_dim != hidden/heads
    "gqa_top2": dict(layers=2, hidden=44, ffn=52, heads=4, kv_heads=2, head_dim=10, experts=5, top_k=2,
                     vocab=97, seed=11, dtype="f32"),
    # top-1 routing, tied lm_head, bf16 source weights
    "top1_tied_bf16": dict(layers=2, hidden=48, ffn=72, heads=6, kv_heads=3, experts=4, top_k=1,
                           vocab=131, seed=12, dtype="bf16", tie=True),
    # the README's default shape, f16 source, three layers
    "mixtral_f16": dict(layers=3, hidden=64, ffn=128, heads=8, kv_heads=2, experts=4, top_k=2,
                        vocab=320, seed=13, dtype="f16"),
}


def require_target(name: str):
    """The target, or a skip naming what this machine lacks to build and run for it."""
    from colibri.toolchain.targets import load_target

    t = load_target(name)
    if missing := t.missing(run=True):
        pytest.skip(f"{name}: {', '.join(missing)} not installed ({t.install_hint()})")
    if t.cpu_missing():
        pytest.skip(f"{name}: this CPU lacks {', '.join(t.cpu_missing())}")
    return t


def synth(path: Path, **kw) -> Path:
    from colibri.codegen.synth import synth_checkpoint

    return synth_checkpoint(path, **kw)


def scons(*args: str, build: Path, check: bool = True) -> subprocess.CompletedProcess:
    argv = [str(BIN / "scons"), "-C", str(ROOT), "-Q", "-j2", f"BUILD={build}", *args]
    res = subprocess.run(argv, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed:\n{res.stdout}\n{res.stderr}")
    return res


@pytest.fixture(scope="session")
def golden_ckpts(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("ckpt")
    return {name: synth(base / name, **kw) for name, kw in GOLDEN.items()}


def output_dirs(res: subprocess.CompletedProcess) -> dict[str, Path]:
    """{target: its output directory} from the lines a build prints."""
    from colibri.toolchain.scons.layout import output_dirs as parse

    return parse(res.stdout)


@pytest.fixture(scope="session")
def build_model(tmp_path_factory):
    """build_model(ckpt, quant, target="host", *extra) -> the output directory of a fresh build root
    (build/<target>/<model>/ for the default options, see toolchain/scons/layout.py)."""
    done: dict[tuple, Path] = {}

    def get(ckpt: Path, quant: str = "int8c", target: str = "host", *extra: str) -> Path:
        key = (str(ckpt), quant, target, extra)
        if key not in done:
            build = tmp_path_factory.mktemp(f"build-{quant}-{target}")
            res = scons(f"MODEL={ckpt}", f"QUANT={quant}", f"TARGET={target}", *extra, build=build)
            done[key] = output_dirs(res)[target]
        return done[key]

    return get


# Under CI=true a skip is a failure: a CI image that lost a compiler, QEMU or a dev-only extra must not
# pass by skipping what it can no longer run. (Tests that only apply to some CPUs are not collected
# where they cannot apply, rather than skipped: see the target lists.)
IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # noqa: ARG001 - pytest hook signature
    outcome = yield
    rep = outcome.get_result()
    if IN_CI and rep.skipped and not hasattr(rep, "wasxfail"):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"skipped under CI=true, which counts as a failure: {reason}"
