"""Decode/prefill speed of the C runtime against llama.cpp measured in the same run, 1 and 2 threads.

    .venv/bin/python bench/speed.py [--shapes 30m,288m] [--targets host,x86_64-v3] [--quant int8c]
                                    [--reps 5] [--threads 2] [--qemu rpi4,rpi5,riscv64-rvv] [--no-callgrind]
                                    [--llama measure|issue] [--keep]

For each synthetic Mixtral shape: export once, build every target twice with SCons (the
SIMD kernels, and KERNELS=scalar: -DCOLIBRI_SCALAR), then run each build's colibri_demo as
llama-bench measures: prefill pp512 (one forward over a 512-token prompt, the runtime's blocked
matrix-matrix path) and decode tg128 (128 tokens, one per forward, from an empty context),
--reps times, the 1-thread and the --threads runs (the demo's pthread pool behind
colibri_set_parallel) alternating so both see the same machine; medians. Then llama.cpp (Q8_0,
1 thread, bench/llamacpp.py: its own venv, built once) on the same checkpoint shape, right
after, so both see the same machine; `--llama issue` uses the issue's figures instead.
Prints per build: tok/s, the ratio to the scalar build, the N-thread/1-thread ratio (and
whether the N-thread tokens equal the 1-thread ones: they must, bit for bit), the ratio
to llama.cpp, bytes of weights read per decoded token (expected value over the top_k of
n_experts routing), the bandwidth that implies, and its fraction of a streaming read of a
buffer as large as the blob (measured in the same run by a tiny C program; a DRAM-sized one
is printed too).
Also: callgrind instructions per decoded token (valgrind has no AVX-512: builds whose
flags use it are skipped), QEMU wall-time SIMD/scalar ratios of cross builds (a proxy:
TCG emulates vector instructions, so the ratio says little about hardware), and whether
the SIMD build's greedy tokens equal the scalar build's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from colibri.toolchain.scons.layout import output_dirs

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SHAPES = {
    "30m": dict(layers=4, hidden=256, ffn=512, heads=8, kv_heads=4, experts=8, top_k=2, vocab=32000, seed=1),
    "288m": dict(layers=8, hidden=1024, ffn=1024, heads=8, kv_heads=2, experts=8, top_k=2, vocab=32000, seed=1),
}
# llama.cpp, 1 thread, Q8_0, same random checkpoints, as the issue states them (midpoints of its ranges);
# `--llama measure` (the default) measures llama.cpp on this machine in the same run instead
LLAMA_ISSUE = {"30m": {"decode": 2050.0, "prefill": 8300.0}, "288m": {"decode": 240.0, "prefill": 580.0}}
PREFILL, DECODE = 512, 128  # llama-bench's pp512 and tg128
GOAL = {"decode": 1.3, "prefill": 1.0}
SCALE_BYTES = {0: 0, 1: 4, 2: 2}

STREAM_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    size_t bytes = strtoull(argv[1], 0, 10) / 64 * 64, n = bytes / 8;
    uint64_t *a = aligned_alloc(64, bytes), s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    memset(a, 1, bytes);
    double best = 1e30;
    for (int rep = 0; rep < 7; rep++) {
        size_t passes = bytes >= (256u << 20) ? 1 : (size_t)((256u << 20) / bytes) + 1;
        double t0 = now();
        for (size_t p = 0; p < passes; p++)
            for (size_t i = 0; i < n; i += 4) { s0 += a[i]; s1 += a[i + 1]; s2 += a[i + 2]; s3 += a[i + 3]; }
        double dt = (now() - t0) / passes;
        if (dt < best) best = dt;
    }
    printf("%.6f %llu\n", bytes / best / 1e9, (unsigned long long)(s0 + s1 + s2 + s3) & 1);
    return 0;
}
"""


def weight_bytes_per_token(blob: Path) -> tuple[int, int]:
    """(bytes of weights one decoded token reads, expected over routing; the blob's bytes)."""
    from colibri.codegen import format as fmt

    with open(blob, "rb") as f:
        h = fmt.read_header(f.read(fmt.HEADER_BYTES))
        table = f.read(fmt.ENTRY_BYTES * h["n_tensors"])
    expert_kinds = {fmt.KIND[k].code for k in ("W_GATE", "W_DOWN", "W_UP")}
    total = 0.0
    for i in range(h["n_tensors"]):
        e = fmt.entry(bytes(fmt.HEADER_BYTES) + table, i)
        groups = -(-e["cols"] // e["group_size"]) if e["scale_dtype"] else 0
        per_row = e["row_stride"] + groups * SCALE_BYTES.get(e["scale_dtype"], 0)
        if e["kind"] == fmt.KIND["EMBED"].code:  # one row per token
            nbytes = per_row
        else:
            nbytes = e["rows"] * per_row + 4 * e["n_outliers"]
        total += nbytes * (h["top_k"] / h["n_experts"] if e["kind"] in expert_kinds else 1.0)
    return int(total), blob.stat().st_size


def stream_gbs(work: Path, nbytes: int) -> float:
    exe = work / "stream"
    if not exe.exists():
        src = work / "stream.c"
        src.write_text(STREAM_C)
        subprocess.run(["gcc", "-O3", "-march=native", str(src), "-o", str(exe)], check=True)
    return float(subprocess.run([str(exe), str(nbytes)], capture_output=True, text=True,
                                check=True).stdout.split()[0])


def _demo(demo: Path, prompt: list[int], generate: int, threads: int) -> dict[str, str]:
    res = subprocess.run([str(demo), "--tokens", ",".join(map(str, prompt)), "--generate", str(generate),
                          "--threads", str(threads)], capture_output=True, text=True, check=True)
    return dict(line.partition(": ")[::2] for line in res.stdout.splitlines())


def demo_rates(demo: Path, prefill: int, decode: int, threads: int) -> dict:
    """Two runs of colibri_demo, as llama-bench: a prefill-length prompt (its prefill tok/s), and decode
    tokens from a one-token prompt (tok/s; the generated tokens, which the thread counts must agree on)."""
    pp = _demo(demo, [(i * 7919 + 11) % 32000 for i in range(prefill)], 1, threads)
    tg = _demo(demo, [1], decode, threads)
    return {"decode": float(tg["tok/s"]), "prefill": float(pp["prefill tok/s"]),
            "tokens": [int(t) for t in tg["tokens"].split(",")]}


def measure(demo: Path, prefill: int, decode: int, reps: int, threads: int) -> dict[int, dict]:
    """Median rates over reps for 1 and `threads` threads, the runs interleaved."""
    runs: dict[int, list[dict]] = {1: [], threads: []}
    for _ in range(reps):
        for n in runs:
            runs[n].append(demo_rates(demo, prefill, decode, n))
    return {n: {"decode": statistics.median(r["decode"] for r in rs),
                "prefill": statistics.median(r["prefill"] for r in rs),
                "tokens": rs[-1]["tokens"], "same_tokens": all(r["tokens"] == rs[0]["tokens"] for r in rs)}
            for n, rs in runs.items()}


def scons(build: Path, ckpt: Path, targets: list[str], quant: str, max_seq: int, *extra: str) -> dict[str, Path]:
    """Build; {target: its output directory}."""
    argv = [str(BIN / "scons"), "-C", str(ROOT), "-Q", "-j2", f"BUILD={build}", f"MODEL={ckpt}",
            f"TARGET={','.join(targets)}", f"QUANT={quant}", f"MAX_SEQ={max_seq}", *extra]
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return output_dirs(res.stdout)


def callgrind_per_token(demo: Path, n: int = 4) -> float | None:
    if shutil.which("valgrind") is None:
        return None

    def instructions(gen: int) -> int:
        res = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", str(demo),
                              "--tokens", "1,2,3,4", "--generate", str(gen)], capture_output=True, text=True)
        line = next((x for x in res.stderr.splitlines() if "Collected :" in x), None)
        return int(line.split()[-1]) if line else -1

    a, b = instructions(1), instructions(1 + n)
    return (b - a) / n if a > 0 and b > 0 else None


def qemu_seconds(target: str, demo: Path, gen: int) -> float:
    from colibri.toolchain.cli import runner_argv

    t0 = time.perf_counter()
    subprocess.run(runner_argv(target, str(demo)) + ["--tokens", "1,2,3,4", "--generate", str(gen)],
                   check=True, capture_output=True)
    return time.perf_counter() - t0


def uses_avx512(target: str) -> bool:
    from colibri.toolchain.targets import load_target

    flags = " ".join(load_target(target).cflags)
    if "native" not in flags:
        return False
    out = subprocess.run(["gcc", "-march=native", "-dM", "-E", "-x", "c", "/dev/null"], capture_output=True,
                         text=True).stdout
    return "__AVX512F__" in out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="30m,288m")
    ap.add_argument("--targets", default="host,x86_64-v3")
    ap.add_argument("--quant", default="int8c")
    ap.add_argument("--prefill", type=int, default=PREFILL)
    ap.add_argument("--decode", type=int, default=DECODE)
    ap.add_argument("--llama", choices=["measure", "issue"], default="measure",
                    help="llama.cpp figures: measured now on this machine (bench/llamacpp.py), or the issue's")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="the parallel run's thread count")
    ap.add_argument("--qemu", default="rpi4,rpi5,riscv64-rvv", help="cross targets for the QEMU ratio ('' none)")
    ap.add_argument("--no-callgrind", action="store_true")
    ap.add_argument("--work", default=str(ROOT / "build" / "speed"))
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints and builds for the next run")
    a = ap.parse_args()

    from colibri.codegen.synth import synth_checkpoint
    from colibri.toolchain.targets import load_target

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    targets = [t for t in a.targets.split(",") if t]
    qemu = [t for t in a.qemu.split(",") if t and not load_target(t).missing(run=True)]
    max_seq = a.prefill + a.decode + 8
    rows = []
    llama: dict[str, dict] = {}
    if a.llama == "measure":
        sys.path.insert(0, str(ROOT / "bench"))
        import llamacpp
    for shape in [s for s in a.shapes.split(",") if s]:
        kw = SHAPES[shape]
        ckpt = work / f"mixtral{shape}"
        if not (ckpt / "config.json").is_file():
            t0 = time.perf_counter()
            synth_checkpoint(ckpt, **kw)
            print(f"[{shape}] synthesized in {time.perf_counter() - t0:.1f} s", flush=True)
        build = work / "b"
        t0 = time.perf_counter()
        cross = qemu if shape == "30m" else []
        outs = {"simd": scons(build, ckpt, targets + cross, a.quant, max_seq),
                "scalar": scons(build, ckpt, targets + cross, a.quant, max_seq, "KERNELS=scalar")}
        print(f"[{shape}] export + builds: {time.perf_counter() - t0:.1f} s", flush=True)
        wpt, blob_bytes = weight_bytes_per_token(outs["simd"][targets[0]] / "model.bin")
        bw_blob = stream_gbs(work, blob_bytes)
        bw_dram = stream_gbs(work, 1 << 30)
        print(f"[{shape}] {json.dumps(kw)}\n[{shape}] blob {blob_bytes / 1e6:.1f} MB; weights read per decoded "
              f"token {wpt / 1e6:.2f} MB; streaming read {bw_blob:.1f} GB/s over {blob_bytes / 1e6:.0f} MB, "
              f"{bw_dram:.1f} GB/s over 1 GiB", flush=True)
        if a.llama == "measure":  # just before colibri's runs, so both see the same machine
            llama[shape] = llamacpp.measure([shape], a.reps)[shape]
        else:
            llama[shape] = LLAMA_ISSUE[shape]
        print(f"[{shape}] llama.cpp ({a.llama}d): decode {llama[shape]['decode']:.1f} tok/s, prefill "
              f"{llama[shape]['prefill']:.1f} tok/s", flush=True)
        for t in targets:
            res = {}
            for kern in ("simd", "scalar"):
                out = outs[kern][t]
                both = measure(out / "colibri_demo", a.prefill, a.decode, a.reps, a.threads)
                res[kern] = both[1]
                res[kern]["par"] = both[a.threads]
                ir = None
                if not a.no_callgrind and shape == "30m" and not uses_avx512(t):
                    ir = callgrind_per_token(out / "colibri_demo")
                res[kern]["ir"] = ir
            s, c = res["simd"], res["scalar"]
            rows.append((shape, t, s, c, wpt, bw_blob))
            for kern, r in (("simd", s), ("scalar", c)):
                ir = f"{r['ir'] / 1e6:.1f} M instr/token (callgrind)" if r["ir"] else "callgrind n/a"
                gbs = r["decode"] * wpt / 1e9
                p = r["par"]
                print(f"[{shape}] {t:<10} {kern:<6} decode {r['decode']:8.1f} tok/s "
                      f"({r['decode'] / llama[shape]['decode']:.2f}x llama.cpp)  prefill {r['prefill']:8.1f} tok/s "
                      f"({r['prefill'] / llama[shape]['prefill']:.2f}x)  weights {gbs:5.1f} GB/s = "
                      f"{gbs / bw_blob:.0%} of streaming  {ir}", flush=True)
                print(f"[{shape}] {t:<10} {kern:<6} {a.threads} threads: decode {p['decode']:8.1f} tok/s "
                      f"({p['decode'] / r['decode']:.2f}x 1 thread), prefill {p['prefill']:8.1f} tok/s "
                      f"({p['prefill'] / r['prefill']:.2f}x); tokens equal 1 thread's: {p['tokens'] == r['tokens']}",
                      flush=True)
            print(f"[{shape}] {t:<10} SIMD/scalar: decode {s['decode'] / c['decode']:.2f}x, prefill "
                  f"{s['prefill'] / c['prefill']:.2f}x; greedy tokens equal: {s['tokens'] == c['tokens']}",
                  flush=True)
        for t in cross:
            secs = {}
            for kern in ("simd", "scalar"):  # 16 more decoded tokens: init (blob CRC) and prefill cancel out
                demo = outs[kern][t] / "colibri_demo"
                secs[kern] = statistics.median(qemu_seconds(t, demo, 17) - qemu_seconds(t, demo, 1)
                                               for _ in range(3))
            print(f"[{shape}] {t:<12} QEMU wall time of 16 decoded tokens: SIMD {secs['simd']:.2f} s, "
                  f"scalar {secs['scalar']:.2f} s, ratio {secs['scalar'] / secs['simd']:.2f}x", flush=True)

    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    print(f"\nload average at the end: {load} (wall-clock figures mean something only on an idle machine)")
    print(f"summary ({a.quant}, SIMD build, pp{a.prefill} / tg{a.decode}; llama.cpp Q8_0 1 thread, {a.llama}d; "
          f"goal decode >= 1.3x, prefill >= 1.0x; {a.threads}T = {a.threads} threads; 'issue' = the ratio to the "
          f"issue's llama.cpp figures)")
    print(f"{'shape':<6} {'target':<10} {'decode':>9} {'llama':>7} {'ratio':>6} {'prefill':>9} {'llama':>7} "
          f"{'ratio':>6} {f'dec {a.threads}T':>9} {'x1T':>5} {f'pre {a.threads}T':>9} {'x1T':>5} {'MB/tok':>7} "
          f"{'roofline':>8} {'issue dec':>9} {'issue pre':>9}")
    for shape, t, s, _c, wpt, bw in rows:
        ll, p = llama[shape], s["par"]
        print(f"{shape:<6} {t:<10} {s['decode']:9.1f} {ll['decode']:7.0f} {s['decode'] / ll['decode']:6.2f} "
              f"{s['prefill']:9.1f} {ll['prefill']:7.0f} {s['prefill'] / ll['prefill']:6.2f} {p['decode']:9.1f} "
              f"{p['decode'] / s['decode']:5.2f} {p['prefill']:9.1f} {p['prefill'] / s['prefill']:5.2f} "
              f"{wpt / 1e6:7.2f} {s['decode'] * wpt / 1e9 / bw:8.0%} "
              f"{s['decode'] / LLAMA_ISSUE[shape]['decode']:9.2f} {s['prefill'] / LLAMA_ISSUE[shape]['prefill']:9.2f}")
    if not a.keep:
        shutil.rmtree(work / "b", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
