"""Export speed and memory of `colibri export`, with 1 and 2 quantizing workers (issue #19).

    .venv/bin/python bench/export.py [--ckpt DIR ...] [--dtypes f32,bf16] [--workers 1,2] [--quant int8c]
                                     [--rss-gb 4] [--work DIR] [--keep]

Without --ckpt it synthesises (`colibri synth`, seed 0) the 288M shape of bench/speed.py (hidden 1024, ffn 1024,
8 layers, 8 experts top-2, 8/2 heads, vocab 32000) once per source dtype, and for the memory figure a ~4 GB
f32 one (--rss-gb; 0 skips it), deleted afterwards with the other synthesised ones unless --keep. Every export
runs in a subprocess of its own (`export()` without the logit probe, the workers given: quantizing threads);
printed per export: weights/s, MB/s of source, wall seconds, CPU seconds (user+sys of the subprocess and
any children, from wait4), and the peak RSS of its process tree (the sum over the exporter and any
children, sampled from /proc every 20 ms) with the largest single process's (ru_maxrss). The CPU model and
the load average before and after go with the figures: on a shared 2-core machine compare only pairs run
back to back.
It is a benchmark, never a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPE_288M = dict(layers=8, hidden=1024, ffn=1024, heads=8, kv_heads=2, experts=8, top_k=2, vocab=32000)
# ~4.2 GB of f32: 1.06 G weights (32 layers of the 288M shape's experts, hidden 1024, ffn 1024)
SHAPE_4GB = dict(layers=32, hidden=1024, ffn=1024, heads=8, kv_heads=2, experts=10, top_k=2, vocab=32000)
SAMPLE_S = 0.02
EXPORT = """
import json, sys
from colibri.codegen.export import ExportOptions, export
res = export(sys.argv[1], sys.argv[2], ExportOptions(quant=sys.argv[3], workers=int(sys.argv[4]), predict=False))
t = res.manifest["totals"]
print(json.dumps({"weights": t["weights"]}))
"""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _tree_rss(root: int) -> int:
    """Sum of the resident bytes of `root` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            children.setdefault(int(fields[1]), []).append(int(d))
            rss[int(d)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def synth(out: Path, shape: dict) -> Path:
    """`colibri synth` (seed 0) in a subprocess, so that this process stays small: a child's ru_maxrss starts
    from its parent's when it is spawned."""
    argv = [str(Path(sys.executable).parent / "colibri"), "synth", str(out), "--seed", "0",
            *[a for k, v in shape.items() for a in (f"--{k.replace('_', '-')}", str(v))]]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return out


def source_bytes(ckpt: Path) -> int:
    return sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))


def run_export(ckpt: Path, out: Path, quant: str, workers: int) -> dict:
    argv = [sys.executable, "-c", EXPORT, str(ckpt), str(out), quant, str(workers)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            done.wait(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout = proc.stdout.read()
    stderr = proc.stderr.read()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"bench/export.py: export of {ckpt} failed ({proc.returncode}):\n{stderr}")
    weights = json.loads(stdout.strip().splitlines()[-1])["weights"]
    return {"weights": weights, "wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "tree_rss": peak[0],
            "max_rss": ru.ru_maxrss * 1024}


def line(label: str, src: int, r: dict) -> str:
    return (f"{label:<28} {r['weights'] / r['wall'] / 1e6:7.1f} M weights/s  {src / r['wall'] / 1e6:7.1f} MB/s  "
            f"wall {r['wall']:7.2f} s  cpu {r['cpu']:7.2f} s  peak RSS tree {r['tree_rss'] / 2**20:7.0f} MiB "
            f"(largest process {r['max_rss'] / 2**20:.0f} MiB)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", type=Path, action="append", help="export this checkpoint (repeatable) instead of "
                                                                     "synthesised ones")
    ap.add_argument("--dtypes", default="f32,bf16", help="source dtypes of the synthesised 288M checkpoints")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--quant", default="int8c")
    ap.add_argument("--rss-gb", type=float, default=4.0, help="size of the memory-figure checkpoint; 0: none")
    ap.add_argument("--work", type=Path, help="directory for the checkpoints and exports, made if missing "
                    "(default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the synthesised checkpoints")
    args = ap.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    if args.work is not None:
        try:
            args.work.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            print(f"bench/export.py: --work {args.work}: {e.strerror}", file=sys.stderr)
            sys.exit(2)
    print(f"cpu: {cpu_model()} x {os.cpu_count()}; load average before: {loadavg()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-export-", dir=args.work))
    try:
        ckpts: list[tuple[str, Path]] = []
        if args.ckpt:
            ckpts += [(c.name, c) for c in args.ckpt]
        else:
            for dt in filter(None, args.dtypes.split(",")):  # --dtypes "": the memory figure only
                ckpts.append((f"288m-{dt}", synth(work / f"288m-{dt}", dict(SHAPE_288M, dtype=dt))))
            if args.rss_gb > 0:
                shape = dict(SHAPE_4GB, layers=max(1, round(SHAPE_4GB["layers"] * args.rss_gb / 4.2)))
                ckpts.append((f"{args.rss_gb:g}gb-f32", synth(work / "big", dict(shape, dtype="f32"))))
        for label, ckpt in ckpts:
            src = source_bytes(ckpt)
            print(f"{label}: {src / 1e9:.2f} GB of source, {args.quant}", flush=True)
            for w in workers:
                out = work / "out"
                r = run_export(ckpt, out, args.quant, w)
                shutil.rmtree(out, ignore_errors=True)
                print(line(f"  {w} worker{'s' if w > 1 else ''}", src, r), f" load {loadavg()}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    print(f"load average after: {loadavg()}")


if __name__ == "__main__":
    main()
