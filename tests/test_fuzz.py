"""libFuzzer over colibri_init + forward (runtime_c/test/fuzz_blob.c), seeded with tiny exports.

The suite fuzzes for COLIBRI_FUZZ_SECONDS (default 15) from a fixed libFuzzer seed and fails on any
crash, hang, sanitizer report or broken API promise; the input that caused it is named in the failure.
runtime_c/test/regress/ holds one blob per validator check (tests/fixtures/make_fuzz_regressions.py) and
every input that once crashed: each is replayed here with the status its name gives, and seeds the fuzzer.

    COLIBRI_FUZZ_SECONDS=600 COLIBRI_FUZZ_SEED=0 .venv/bin/python -m pytest -s tests/test_fuzz.py   # a long,
                                                                                   # randomly seeded run
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
from test_badblob import E as STATUS

from cbuild import (
    ASAN,
    FUZZ_SRC,
    KNOWN,
    NATIVE,
    RUNTIME_SRC,
    SAN_ENV,
    TEST_SRC,
    compile_c,
    fuzz_clang,
    run_files,
    sanitizer_report,
    seed_blobs,
)

FUZZ_SECONDS = int(os.environ.get("COLIBRI_FUZZ_SECONDS", "15"))
FUZZ_SEED = int(os.environ.get("COLIBRI_FUZZ_SEED", "1"))  # 0: libFuzzer picks one
REGRESS = TEST_SRC / "regress"


def _regressions() -> list:
    return sorted(REGRESS.glob("*.bin"))


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    return seed_blobs(tmp_path_factory.mktemp("fuzz-seeds"))


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    """fuzz_blob.c with its own main, ASan + UBSan: runs files once each."""
    out = tmp_path_factory.mktemp("fuzz-run") / "fuzz_run"
    return compile_c(out, FUZZ_SRC, ASAN + NATIVE + ["-DCB_FUZZ_MAIN"])


def test_seeds_and_regressions_replay_clean(seeds, runner):
    regressions = _regressions()
    assert len(regressions) >= 18, f"{REGRESS}: the per-check blobs are missing"
    rows = run_files(runner, seeds + regressions)
    for raw, fixed, path in rows:
        assert raw in KNOWN and fixed in KNOWN | {-1}, path
    assert all(raw == 0 and fixed == 0 for raw, fixed, _ in rows[: len(seeds)]), "a seed blob is refused"
    for raw, _, path in rows[len(seeds):]:  # <status name>-<what>.bin: that status, as the runtime returns it
        want = os.path.basename(path).split("-", 1)[0].upper()
        assert raw == STATUS[want], f"{path}: status {raw}, expected {want} ({STATUS[want]})"


def _final_stats(log: str) -> dict:
    stats = {k: int(v) for k, v in re.findall(r"stat::(\w+):\s+(\d+)", log)}
    cov = re.findall(r"cov: (\d+) ft: (\d+) corp: (\d+)", log)
    if cov:
        stats["edges"], stats["features"], stats["corpus_units"] = map(int, cov[-1])
    return stats


def _line_coverage(cc: str, corpus, work) -> dict | None:
    """Line and branch coverage of the runtime sources over the fuzzed corpus (None without llvm-cov)."""
    version = re.search(r"clang version (\d+)", subprocess.run([cc, "--version"], capture_output=True,
                                                                text=True).stdout)
    for suffix in ([f"-{version.group(1)}"] if version else []) + [""]:  # the profile format is per version
        profdata, cov = shutil.which(f"llvm-profdata{suffix}"), shutil.which(f"llvm-cov{suffix}")
        if profdata and cov:
            break
    else:
        return None
    exe = compile_c(work / "fuzz_cov", FUZZ_SRC,
                    ["-DCB_FUZZ_MAIN", "-fprofile-instr-generate", "-fcoverage-mapping", *NATIVE], cc=cc)
    files = sorted(p for p in corpus.iterdir() if p.is_file())
    for i in range(0, len(files), 500):  # one profile per batch of files, merged below
        subprocess.run([str(exe), *map(str, files[i:i + 500])], capture_output=True, check=True,
                       env={**os.environ, "LLVM_PROFILE_FILE": str(work / f"cov-{i}.profraw")})
    merged = work / "cov.profdata"
    subprocess.run([profdata, "merge", "-sparse", "-o", str(merged), *map(str, work.glob("cov-*.profraw"))],
                   check=True)
    report = subprocess.run([cov, "export", "-summary-only", str(exe), f"-instr-profile={merged}",
                             *map(str, RUNTIME_SRC)], capture_output=True, text=True, check=True)
    out = {}
    for f in json.loads(report.stdout)["data"][0]["files"]:
        s = f["summary"]
        out[os.path.basename(f["filename"])] = {
            "lines": f"{s['lines']['covered']}/{s['lines']['count']} ({s['lines']['percent']:.1f}%)",
            "branches": f"{s['branches']['covered']}/{s['branches']['count']} ({s['branches']['percent']:.1f}%)",
        }
    return out


def test_fuzz_init_and_forward(seeds, tmp_path):
    cc = fuzz_clang()
    if cc is None:
        pytest.skip("clang not installed (apt-get install clang): no libFuzzer")
    fuzzer = compile_c(tmp_path / "fuzz_blob", FUZZ_SRC,
                       ["-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all", *NATIVE], cc=cc)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for p in seeds:
        shutil.copy(p, corpus / f"seed-{p.parent.name}.bin")
    for p in _regressions():
        shutil.copy(p, corpus / p.name)
    argv = [str(fuzzer), f"-max_total_time={FUZZ_SECONDS}", f"-seed={FUZZ_SEED}", "-timeout=10", "-rss_limit_mb=2048",
            "-use_value_profile=1", "-print_final_stats=1", f"-artifact_prefix={tmp_path}/", str(corpus)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=FUZZ_SECONDS + 300,
                         env={**os.environ, **SAN_ENV})
    log = res.stderr
    (tmp_path / "fuzz.log").write_text(log)
    crashes = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-", "leak-")))
    assert res.returncode == 0 and not crashes, (
        f"the fuzzer found {crashes or 'a problem'} (exit {res.returncode}); add the input to {REGRESS} and fix "
        f"the runtime. Inputs are in {tmp_path}.\n{log[-6000:]}")
    assert not sanitizer_report(log)
    stats = _final_stats(log)
    assert stats.get("number_of_executed_units", 0) >= 1000, log[-3000:]
    stats["seconds"] = FUZZ_SECONDS
    stats["coverage"] = _line_coverage(cc, corpus, tmp_path)
    (tmp_path / "fuzz-stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    print(f"\nfuzz: {json.dumps(stats)}")
