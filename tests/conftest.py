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


# Every Linux target's checkpoint (tests/test_cross.py); test_size audits the same builds.
CROSS_SHAPE = dict(layers=2, hidden=40, ffn=56, heads=4, kv_heads=2, experts=4, top_k=2, vocab=101, seed=21)


@pytest.fixture(scope="session")
def cross_ckpt(tmp_path_factory) -> Path:
    return synth(tmp_path_factory.mktemp("cross") / "crossm", **CROSS_SHAPE)


def output_dirs(res: subprocess.CompletedProcess) -> dict[str, Path]:
    """{target: its output directory} from the lines a build prints."""
    from colibri.toolchain.scons.layout import output_dirs as parse

    return parse(res.stdout)


def _target_dir_args(extra: tuple[str, ...]) -> tuple[list[str], bool]:
    """The sanitizers and KERNELS=scalar among a build's options: what names build/<target...>/."""
    opts = dict(e.split("=", 1) for e in extra if "=" in e)
    return [s for s in opts.get("SANITIZE", "").split(",") if s], opts.get("KERNELS") == "scalar"


def _model_key(ckpt: Path, quant: str, extra: tuple[str, ...]) -> tuple:
    return str(ckpt), quant, tuple(e for e in extra if not e.startswith(("SANITIZE=", "KERNELS=")))


@pytest.fixture(scope="session")
def build_model(tmp_path_factory):
    """build_model(ckpt, quant, target="host", *extra, only=()) -> the output directory of the build
    (build/<target>/<model>/ for the default options, see toolchain/scons/layout.py).

    Every build of the session shares one build root, so a target's model-independent objects compile
    once for all models (toolchain/scons/linux.py) and one export serves every target of its layout.
    Tests that check null builds, hostile paths or layouts call scons() with a root of their own.
    only=("colibri_demo",) builds just those files of the output directory (what a test runs); a later
    call without `only` builds the rest. build_model.many(ckpt, quant, targets, *extra, only=()) builds
    several targets of one model and options in one SCons run."""
    from colibri.toolchain.scons.layout import REGISTRY, target_dir

    root = tmp_path_factory.mktemp("build")
    dirs: dict[tuple, Path] = {}
    built: dict[tuple, set[str] | None] = {}  # the files built by name, None: everything
    names: dict[tuple, str] = {}  # the output directory's name (<key>) of a model and its export options

    def out_dir(ckpt: Path, quant: str, target: str, extra: tuple[str, ...], args: tuple[str, ...]) -> Path:
        """Where the build will put its outputs: its key is the same on every target, else ask SCons
        (reading the graph and naming the registry, which exists, as the only target builds nothing)."""
        sanitize, scalar = _target_dir_args(extra)
        model = _model_key(ckpt, quant, extra)
        if model not in names:
            names[model] = output_dirs(scons(*args, str(root / REGISTRY), build=root))[target].name
        return root / target_dir(target, sanitize, scalar) / names[model]

    def done(key: tuple, only: tuple[str, ...]) -> bool:
        have = built.get(key, set())
        return key in built and (have is None or bool(only and set(only) <= have))

    def many(ckpt: Path, quant: str, targets: list[str], *extra: str,
             only: tuple[str, ...] = ()) -> tuple[dict[str, Path], str]:
        """The builds of one model and options for several targets in one SCons run (one graph read, the
        export once, -j2 across the targets): ({target: its output directory}, what the run printed, "" if
        every build was already there)."""
        keys = {t: (str(ckpt), quant, t, extra) for t in targets}
        todo = [t for t in targets if not done(keys[t], only)]
        stdout = ""
        if todo:
            args = (f"MODEL={ckpt}", f"QUANT={quant}", f"TARGET={','.join(todo)}", *extra)
            if only:
                for t in todo:
                    dirs[keys[t]] = out_dir(ckpt, quant, t, extra, args)
                stdout = scons(*args, *(str(dirs[keys[t]] / f) for t in todo for f in only), build=root).stdout
                for t in todo:
                    built[keys[t]] = built.get(keys[t], set()) | set(only)
            else:
                res = scons(*args, build=root)
                stdout, found = res.stdout, output_dirs(res)
                for t in todo:
                    dirs[keys[t]] = found[t]
                    names.setdefault(_model_key(ckpt, quant, extra), found[t].name)
                    built[keys[t]] = None
        return {t: dirs[keys[t]] for t in targets}, stdout

    def get(ckpt: Path, quant: str = "int8c", target: str = "host", *extra: str,
            only: tuple[str, ...] = ()) -> Path:
        return many(ckpt, quant, [target], *extra, only=only)[0][target]

    get.many = many
    get.root = root  # for tests that run scons themselves on the shared root (another model, null builds)
    return get


# Parallel runs (pytest-xdist, `-n 2` in toolchain/dev.sh): the tests of one file run on one worker, so its
# module fixtures are built once; files that share session builds run on the same worker (test_size
# audits test_cross's builds). The files that take longest start first, so the two workers finish
# together rather than one waiting on a long file picked up last; the others keep their order.
XDIST_GROUP = {"test_size": "test_cross"}
# by each file's total in a full run with --durations=0 (under load, 2 workers): the 25 files over 100 s; from
# test_int4 on, reordered by single-file runs after test_kernels, test_spine, test_hostile_build and
# test_size_tokenizer were made shorter
LONGEST_FIRST = ("test_cross", "test_size", "test_dense", "test_project", "test_kv", "test_granite", "test_mla",
                 "test_families", "test_gpt_oss", "test_sliding", "test_int4", "test_firmware", "test_kernels",
                 "test_distcc", "test_tokenizer_nfc", "test_firmware_families", "test_spine", "test_hostile_build",
                 "test_size_markdown", "test_tokenizer", "test_mutation", "test_hostile_export", "test_size_tokenizer",
                 "test_partition", "test_sample_model", "test_firmware_kernels")


def _group(nodeid: str) -> str:
    stem = Path(nodeid.split("::")[0]).stem
    return XDIST_GROUP.get(stem, stem)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Work units of whole files (their groups), in collection order."""
    from xdist.scheduler import LoadFileScheduling

    class FileGroups(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return FileGroups(config, log)


def pytest_collection_modifyitems(config, items):  # noqa: ARG001 - pytest hook signature
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: file and test order kept


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
