"""bench/ab.py, the interleaved timing of commands behind the before/after figures in closing notes: it reads a
`KEY: value` line or llama-bench's JSON, alternates the order round by round, and reports medians and per-round
ratios to the first command; malformed arguments exit 2, a failing command exits 1."""

from __future__ import annotations

import shlex
import subprocess
import sys

from conftest import ROOT

AB = ROOT / "bench" / "ab.py"


def _ab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(AB), *args], capture_output=True, text=True, timeout=120)


def _printer(tmp_path, name: str, figures: list[float], llama_json: bool = False) -> str:
    """A command printing figures[k] on its k-th run (a counter file beside it) and logging its name."""
    script = tmp_path / f"{name}.py"
    script.write_text(
        "import json, pathlib, sys\n"
        f"count = pathlib.Path({str(tmp_path / (name + '.n'))!r})\n"
        "k = int(count.read_text()) if count.exists() else 0\n"
        "count.write_text(str(k + 1))\n"
        f"with open({str(tmp_path / 'order')!r}, 'a') as f: f.write({name!r} + '\\n')\n"
        f"v = {figures!r}[k]\n"
        + ("print(json.dumps([{'test': 'pp512', 'avg_ts': v}]))\n" if llama_json
           else "print('tok/s: 1.0'); print(f'prefill tok/s: {v}')\n")
    )
    return f"{name}={shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def test_medians_ratios_and_alternating_order(tmp_path):
    a = _printer(tmp_path, "new", [200.0, 210.0, 190.0])
    b = _printer(tmp_path, "old", [100.0, 100.0, 95.0])
    c = _printer(tmp_path, "llama", [50.0, 70.0, 60.0], llama_json=True)
    res = _ab("--key", "prefill tok/s", "--rounds", "3", a, b, c)
    assert res.returncode == 0, res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines()}
    assert "200.00 [190.00-210.00]" in rows["new"] and "ratio 1.000 [1.000-1.000]" in rows["new"]
    # old/new per round: 0.5, 0.476, 0.5 -> median 0.5; llama/new: 0.25, 0.333, 0.316 -> median 0.316
    assert "100.00 [95.00-100.00]" in rows["old"] and "ratio 0.500 [0.476-0.500]" in rows["old"]
    assert "60.00 [50.00-70.00]" in rows["llama"] and "ratio 0.316 [0.250-0.333]" in rows["llama"]
    assert "rounds: 3" in res.stdout and "load average" in res.stdout
    order = (tmp_path / "order").read_text().split()
    assert order == ["new", "old", "llama", "llama", "old", "new", "new", "old", "llama"]


def test_bad_arguments_exit_2_and_a_failing_command_exits_1(tmp_path):
    for bad in (["no-equals-sign"], ["=echo"], ["x="], ["x=echo", "x=echo"]):
        res = _ab("--key", "tok/s", *bad)
        assert res.returncode == 2 and res.stderr.strip().startswith("ab.py:"), (bad, res.stderr)
    res = _ab("--key", "tok/s", "--rounds", "1", f"f={shlex.quote(sys.executable)} -c 'import sys; sys.exit(3)'")
    assert res.returncode == 1 and "f exited 3" in res.stderr
    res = _ab("--key", "tok/s", "--rounds", "1", f"m={tmp_path / 'no-such-program'}")
    assert res.returncode == 1 and "m: cannot run" in res.stderr and "Traceback" not in res.stderr
    silent = f"s={shlex.quote(sys.executable)} -c 'print(\"other: 3\")'"
    res = _ab("--key", "tok/s", "--rounds", "1", silent)
    assert res.returncode == 1 and "no 'tok/s: value' line" in res.stderr
