"""Per family: parameters, blob and arena bytes, and host decode speed against llama.cpp, at ~300M weights.

    .venv/bin/python bench/families.py [--arch mixtral,llama,...] [--rounds 3] [--no-speed] [--llamacpp]
                                       [--peer DIR] [--work DIR] [--keep]

For each family `colibri synth` writes a ~300M-weight bf16 instance (MoE families: hidden 1024, ffn 1024 per
expert, 8 layers, 8 experts top-2, 8/2 heads, vocab 32000, the 288M shape of bench/speed.py; dense families:
hidden 1024, ffn 2816, 22 layers, 8/2 heads, vocab 32000), exports it int8c with a KV cache of 4096
positions and prints: weights in total and active per token (the blob's matrices, the experts' at
top_k/n_experts, the embedding's one row not counted as active), the blob's bytes, the arena's bytes (the
export's "arena N bytes planned" line, which also says what the KV cache takes).

Unless --no-speed: host decode tok/s (`colibri_demo`, one-token prompt, 128 tokens, 1 thread), and with
--llamacpp llama.cpp's `llama-bench -p 0 -n 128 -t 1` on the Q8_0 GGUF its official converter makes of the
same checkpoint (`../shared/peer/build_llamacpp.sh --convert`; a family the converter or llama.cpp does not
take is reported as such, with the converter's last line). colibri and llama-bench alternate round by
round; medians and spreads over --rounds; the CPU and the load average before and after are printed: a
figure taken while anything else runs on the machine is not a figure.

Each family's files (~2 GB with the GGUFs) are deleted after its row unless --keep. --prepare makes and
keeps every family's files (checkpoint, export, host build, GGUF) and times nothing, so that it can run
while the machine is busy; a later run with --llamacpp reuses what a --prepare run left and only times.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from speed import BIN, PEER_SCRIPT, ROOT, cpu_flags, cpu_model, demo_run, loadavg  # noqa: E402

from colibri.codegen import format as fmt  # noqa: E402
from colibri.codegen.synth import ARCHES, DENSE_ARCHES, synth_checkpoint  # noqa: E402
from colibri.toolchain.scons.layout import output_dirs  # noqa: E402

MAX_SEQ = 4096
DECODE = 128
MOE_SHAPE = dict(layers=8, hidden=1024, ffn=1024, heads=8, kv_heads=2, experts=8, top_k=2, vocab=32000)
DENSE_SHAPE = dict(layers=22, hidden=1024, ffn=2816, heads=8, kv_heads=2, experts=1, top_k=1, vocab=32000)
EXPERT_KINDS = ("W_GATE", "W_DOWN", "W_UP")
NOT_WEIGHTS = ("ROPE_FREQ", "TOKENIZER", "PARAMS")  # derived tensors and sections


def weights(blob: Path) -> tuple[int, float]:
    """(weights in the blob's matrices and vectors, weights one decoded token reads: experts at top_k/n_experts,
    one row of the embedding)."""
    data = blob.read_bytes()
    h = fmt.read_header(data[:fmt.HEADER_BYTES])
    experts = {fmt.KIND[k].code for k in EXPERT_KINDS}
    skip = {fmt.KIND[k].code for k in NOT_WEIGHTS if k in fmt.KIND}
    total, active = 0, 0.0
    for i in range(h["n_tensors"]):
        e = fmt.entry(data, i)
        if e["kind"] in skip:
            continue
        n = e["rows"] * e["cols"]
        total += n
        if e["kind"] == fmt.KIND["EMBED"].code:
            active += e["cols"]
        else:
            active += n * (h["top_k"] / h["n_experts"] if e["kind"] in experts else 1.0)
    return total, active


def export(ckpt: Path, out: Path) -> str:
    res = subprocess.run([str(BIN / "colibri"), "export", str(ckpt), "-o", str(out), "--max-seq", str(MAX_SEQ),
                          "--no-predict"], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"colibri export {ckpt}: {res.stderr.strip()}")
    line = next((x.strip() for x in res.stdout.splitlines() if x.strip().startswith("arena ")), "arena ?")
    return line.removeprefix("arena ").replace(" bytes planned", " B").replace(f" for max_seq {MAX_SEQ}", "")


def build_demo(work: Path, ckpt: Path) -> Path:
    argv = [str(BIN / "scons"), "-C", str(ROOT), "-Q", "-j2", f"BUILD={work / 'b'}", f"MODEL={ckpt}", "TARGET=host",
            f"MAX_SEQ={DECODE + 8}"]
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return output_dirs(res.stdout)["host"] / "colibri_demo"


def gguf_of(ckpt: Path, name: str, peer: Path) -> tuple[Path | None, str]:
    gguf = peer / "gguf" / f"{name}-q8_0.gguf"
    if gguf.is_file():
        return gguf, ""
    res = subprocess.run(["bash", str(PEER_SCRIPT), "--convert", str(ckpt), name], capture_output=True, text=True,
                         env={**os.environ, "PEER": str(peer)})
    (peer / "gguf" / f"{name}-f32.gguf").unlink(missing_ok=True)  # only the Q8_0 file is measured
    if res.returncode != 0 or not gguf.is_file():
        last = (res.stderr.strip() or res.stdout.strip()).splitlines()
        return None, last[-1] if last else f"exit {res.returncode}"
    return gguf, ""


def llama_decode(bench: Path, gguf: Path) -> float | str:
    res = subprocess.run([str(bench), "-m", str(gguf), "-t", "1", "-p", "0", "-n", str(DECODE), "-r", "1", "-o",
                          "csv"], capture_output=True, text=True)
    if res.returncode != 0:
        return f"llama-bench failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}"
    rows = [r for r in res.stdout.splitlines() if r.strip()]
    head = next(r for r in rows if "avg_ts" in r).split(",")
    data = rows[-1].split(",")
    return float(data[head.index("avg_ts")].strip('"'))


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):,.1f} [{min(xs):,.1f}–{max(xs):,.1f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default=",".join(ARCHES), help=f"families (default: all: {', '.join(ARCHES)})")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-speed", action="store_true", help="sizes only")
    ap.add_argument("--llamacpp", action="store_true", help="llama-bench on the converted Q8_0 GGUF")
    ap.add_argument("--peer", default=os.environ.get("PEER", "/tmp/peer"))
    ap.add_argument("--work", default=str(ROOT / "build" / "families"))
    ap.add_argument("--keep", action="store_true", help="keep each family's checkpoint, export and GGUF")
    ap.add_argument("--prepare", action="store_true",
                    help="make and keep every family's files (with --llamacpp, the GGUF too); time nothing")
    a = ap.parse_args()
    a.keep = a.keep or a.prepare
    archs = [x for x in a.arch.split(",") if x]
    if bad := [x for x in archs if x not in ARCHES]:
        ap.error(f"unknown family {', '.join(bad)} (known: {', '.join(ARCHES)})")
    peer, work = Path(a.peer), Path(a.work)
    bench = peer / "llama.cpp" / "build" / "bin" / "llama-bench"
    if a.llamacpp and not bench.is_file():
        ap.error(f"{bench} missing: run ../shared/peer/build_llamacpp.sh first")
    print(f"CPU: {cpu_model()} ({cpu_flags()}), {os.cpu_count()} cores; load average before: {loadavg()}")
    print(f"int8c, KV cache of {MAX_SEQ} positions; decode: 1 thread, {DECODE} tokens from a one-token prompt")
    print("| family | weights | active/token | blob (int8c) | arena | colibri tok/s | llama.cpp Q8_0 tok/s | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for arch in archs:
        fam = work / arch
        shape = DENSE_SHAPE if arch in DENSE_ARCHES else MOE_SHAPE
        ckpt = fam / f"fam300m_{arch.replace('-', '_')}"
        done = fam / "prepared"  # what --prepare left: checkpoint, export and the export's arena line
        if done.is_file():
            arena = done.read_text().strip()
        else:
            shutil.rmtree(fam, ignore_errors=True)
            synth_checkpoint(ckpt, arch=arch, seed=7, dtype="bf16", **shape)
            arena = export(ckpt, fam / "export")
        blob = fam / "export" / "model.bin"
        total, active = weights(blob)
        row = [arch, f"{total / 1e6:,.1f} M", f"{active / 1e6:,.1f} M", f"{blob.stat().st_size:,} B", arena]
        if a.prepare:
            build_demo(fam, ckpt)
            gguf, why = gguf_of(ckpt, ckpt.name, peer) if a.llamacpp else (None, "")
            done.write_text(arena + "\n")
            row += ["prepared", str(gguf) if gguf else why, ""]
        elif a.no_speed:
            row += ["", "", ""]
        else:
            demo = build_demo(fam, ckpt)
            gguf, why = gguf_of(ckpt, ckpt.name, peer) if a.llamacpp else (None, "not run (--llamacpp)")
            ours, theirs = [], []
            for r in range(a.rounds):
                order = ("c", "l") if r % 2 == 0 else ("l", "c")
                for who in order:
                    if who == "c":
                        ours.append(float(demo_run(demo, [1], DECODE, 1)["tok/s"]))
                    elif gguf is not None:
                        got = llama_decode(bench, gguf)
                        if isinstance(got, str):
                            gguf, why = None, got
                        else:
                            theirs.append(got)
            row.append(med(ours))
            if theirs:
                row += [med(theirs), f"{statistics.median(ours) / statistics.median(theirs):.2f}×"]
            else:
                row += [re.sub(r"\s+", " ", why)[:120], ""]
            if gguf is not None and not a.keep:
                gguf.unlink(missing_ok=True)
        print("| " + " | ".join(row) + " |", flush=True)
        if not a.keep:
            shutil.rmtree(fam, ignore_errors=True)
    print(f"load average after: {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
