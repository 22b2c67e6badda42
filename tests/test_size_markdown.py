"""`colibri size --diff OLD NEW --markdown`: the CI table's figures against binutils' own (readelf -S), the
growth limits that fail a job, the labels, bad limits."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from colibri.toolchain.size.diff import md_cell
from colibri.toolchain.targets import load_target

from conftest import BIN, require_target, synth

TARGET = "stm32h7"
SMALL = dict(layers=1, hidden=32, ffn=32, heads=4, kv_heads=2, experts=2, top_k=1, vocab=64, seed=3)
BIGGER = dict(SMALL, layers=2, ffn=48)


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory, build_model) -> tuple[Path, Path]:
    require_target(TARGET)
    base = tmp_path_factory.mktemp("sizediff")
    out = []
    for name, kw in (("small_m", SMALL), ("bigger_m", BIGGER)):
        d = build_model(synth(base / name, **kw), "int8c", TARGET)
        out.append(d / f"{name}.elf")
    return out[0], out[1]


def binutils_regions(elf: Path) -> dict[str, int]:
    """Flash and RAM bytes from `readelf -S`: allocated sections by the target's regions; a section with
    contents that lives in RAM (.data) is also in flash (its load image)."""
    t = load_target(TARGET)
    kinds = [(r["origin"], r["origin"] + r["length"], r["kind"]) for r in t.memory]
    res = subprocess.run([t.tool("readelf"), "-S", "-W", str(elf)], capture_output=True, text=True, check=True)
    flash = ram = 0
    for m in re.finditer(r"^\s*\[\s*\d+\]\s+(\S+)\s+(\S+)\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+\S+\s+(\S*)",
                         res.stdout, re.M):
        _, typ, addr, size, flags = m.groups()
        if "A" not in flags:
            continue
        addr, size = int(addr, 16), int(size, 16)
        kind = next((k for lo, hi, k in kinds if lo <= addr < hi), None)
        if kind == "flash":
            flash += size
        elif kind == "ram":
            ram += size
            if typ == "PROGBITS":
                flash += size
    return {"flash": flash, "ram": ram}


def size_diff(old: Path, new: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "colibri"), "size", "--diff", str(old), str(new), "--target", TARGET, *extra],
                          capture_output=True, text=True)


def table_row(md: str, label: str) -> list[str]:
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_markdown_figures_match_binutils(two_builds):
    old, new = two_builds
    res = size_diff(old, new, "--markdown", "--base-label", "main", "--head-label", "pr-17")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("### colibri size: main → pr-17\n")
    assert "| region | main | pr-17 | delta | % |" in res.stdout
    a, b = binutils_regions(old), binutils_regions(new)
    assert b["flash"] > a["flash"] and b["ram"] > a["ram"]  # two different models
    for region in ("flash", "ram"):
        _, o, n, delta, pct = table_row(res.stdout, f"**{region}**")
        assert int(o.replace(",", "")) == a[region]
        assert int(n.replace(",", "")) == b[region]
        assert int(delta.replace(",", "")) == b[region] - a[region]
        assert pct == f"{100 * (b[region] - a[region]) / a[region]:+.2f}%"
    # per category: the weights grew, the C library did not
    _, o, n, delta, _ = table_row(res.stdout, "model weights")
    assert int(delta.replace(",", "")) > 0
    assert table_row(res.stdout, "libc/libgcc")[3] == "+0"


def test_fail_over_limits_per_region(two_builds):
    old, new = two_builds
    a, b = binutils_regions(old), binutils_regions(new)
    grew = {r: b[r] - a[r] for r in a}
    pct = {r: 100 * grew[r] / a[r] for r in a}
    assert size_diff(old, new, "--fail-over", f"{max(pct.values()) + 1:.2f}").returncode == 0
    limit = f"{pct['flash'] - 1:.2f}"
    res = size_diff(old, new, "--markdown", "--fail-over", f"flash={limit}")
    assert res.returncode == 1
    assert res.stderr.splitlines() == [
        f"colibri size: flash grew by {grew['flash']:+,} B ({pct['flash']:+.2f}%), over --fail-over "
        f"{float(limit):g}%"]
    assert "**Over the limit:**" in res.stdout
    assert size_diff(old, new, "--fail-over-bytes", f"ram={grew['ram']}").returncode == 0
    res = size_diff(old, new, "--fail-over-bytes", f"ram={grew['ram'] - 1}")
    assert res.returncode == 1 and res.stderr.startswith(f"colibri size: ram grew by {grew['ram']:+,} B")
    assert size_diff(new, old, "--fail-over", "0", "--fail-over-bytes", "0").returncode == 0  # shrinking passes


@pytest.mark.parametrize("bad", ["x", "-1", "rom=3", "flash=", "flash=1,ram=q"])
def test_bad_limits_are_one_line(two_builds, bad):
    old, new = two_builds
    res = size_diff(old, new, "--fail-over", bad)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1 and "--fail-over" in res.stderr


def test_labels_cannot_break_the_table(two_builds):
    old, new = two_builds
    res = size_diff(old, new, "--markdown", "--base-label", "a|b\n| x |", "--head-label", "<img src=x>`")
    assert res.returncode == 0
    header = next(ln for ln in res.stdout.splitlines() if ln.startswith("| region |"))
    assert len(re.findall(r"(?<!\\)\|", header)) == 6  # five cells, whatever the labels hold
    assert "<img" not in res.stdout and md_cell("<img src=x>`") in header


def test_markdown_needs_diff(two_builds):
    res = subprocess.run([str(BIN / "colibri"), "size", str(two_builds[0]), "--markdown"], capture_output=True,
                         text=True)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1
