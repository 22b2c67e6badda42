"""Flash and RAM per memory region, and instructions per token, of models on the STM32H7 targets.

    .venv/bin/python bench/memory_regions.py [--keep]

Builds the demo adder for stm32h7 and a 5 MB synthetic model (hidden 256, 4 layers, 8 experts, vocab
2048, int8c: more than the part's 2 MiB of flash) for stm32h7-qspi, each with KV=f32, f16 and int8, and
prints every region the image uses with the classes of data it holds (from the build's .size.json).
Then it boots the adder with its weights in internal flash (stm32h7) and in QSPI flash (stm32h7-qspi),
and the big model, under QEMU -icount and prints the instructions per token (prefill and decode positions
together). QEMU models no wait states: the count is the same wherever the weights are; on the part, QSPI
reads cost wait states the count does not show.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ADDER = ROOT / "firmware_examples" / "models" / "adder"
BIG = dict(layers=4, hidden=256, ffn=128, heads=8, kv_heads=2, experts=8, top_k=2, vocab=2048, seed=5)


def build(work: Path, model: Path, target: str, kv: str) -> Path:
    res = subprocess.run([str(BIN / "scons"), "-C", str(ROOT), "-Q", "-j2", f"BUILD={work / 'build'}",
                          f"MODEL={model}", f"TARGET={target}", f"KV={kv}"], capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"build of {model.name} for {target} failed:\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    return Path(re.search(rf"^colibri: {re.escape(target)}: .* -> (.*)$", res.stdout, re.M).group(1))


def regions_line(out: Path) -> str:
    r = json.loads((out / f"{out.name}.size.json").read_text())
    rows = [f"{m['name']} {m['used']:,} ({', '.join(f'{c} {n:,}' for c, n in m['classes'].items())})"
            for m in r["memory"] if m["used"]]
    return f"flash {r['regions']['flash']['bytes']:,} B, RAM {r['regions']['ram']['bytes']:,} B: " + "; ".join(rows)


def per_token(target: str, out: Path) -> str:
    res = subprocess.run([str(BIN / "colibri"), "run", "--target", target, str(out / f"{out.name}.elf")],
                         capture_output=True, text=True, check=True)
    h = (next((out.parent.parent / "gen" / out.name).glob("*/model.h"))).read_text()
    prompt = int(re.search(r"#define COLIBRI_DEFAULT_PROMPT_LEN (\d+)", h).group(1))
    n = len(re.search(r"^tokens: (.*)$", res.stdout, re.M).group(1).split(","))
    count = int(re.search(r"^instructions: (\d+)$", res.stdout, re.M).group(1))
    positions = prompt + n - 1  # the prompt, then one decode step per generated token but the last
    return f"{count:,} instructions for {positions} positions: {count // positions:,} per token"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    from colibri.codegen.synth import synth_checkpoint

    work = Path(tempfile.mkdtemp(prefix="colibri-regions-"))
    try:
        big = synth_checkpoint(work / "qspi_model", **BIG)
        for name, model, target in (("adder", ADDER, "stm32h7"), ("qspi_model", big, "stm32h7-qspi")):
            for kv in ("f32", "f16", "int8"):
                print(f"{name} on {target}, KV {kv}: {regions_line(build(work, model, target, kv))}", flush=True)
        for target, where in (("stm32h7", "internal flash"), ("stm32h7-qspi", "QSPI flash")):
            print(f"adder, weights in {where} ({target}): {per_token(target, build(work, ADDER, target, 'f32'))}")
        out = build(work, big, "stm32h7-qspi", "f32")
        print(f"qspi_model, weights in QSPI flash: {per_token('stm32h7-qspi', out)}")
        print("(QEMU models no wait states: instruction counts only)")
    finally:
        if a.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
