"""Decode and prefill speed of colibri against llama.cpp's own `llama-bench`, interleaved in one run.

    .venv/bin/python bench/speed.py [--peer DIR] [--shapes 30m,288m[,granite1b]] [--targets host,x86_64-v3]
                                    [--threads 1,2] [--rounds 5] [--quant int8c] [--peer-quant Q8_0]
                                    [--callgrind] [--work DIR]

The peer is llama.cpp as its users run it: the `llama-bench` binary that `../shared/peer/build_llamacpp.sh`
builds in its PEER directory (default $PEER, else /tmp/peer) from the llama-cpp-python 0.3.36 sdist (Release,
-DGGML_NATIVE=ON), on the GGUF that llama.cpp's official `convert_hf_to_gguf.py` made of the very checkpoint
colibri exports here: Q8_0 against int8/int8c, Q4_0 against int4/int4c (--peer-quant: any type llama-quantize
takes, made from the F32 GGUF by llama.cpp's own `llama-quantize` once and kept beside it):

- 30m  (hidden 256, ffn 512, 4 layers, 8 experts top-2, 8/4 heads, vocab 32000): PEER/ckpt/perf_tiny and
  PEER/gguf/tiny-mixtral-q8_0.gguf, made by a full run of build_llamacpp.sh;
- 288m (hidden 1024, ffn 1024, 8 layers, 8 experts top-2, 8/2 heads, vocab 32000): perf_mid, mid-mixtral-q8_0;
- granite1b (granite-3.0-1b-a400m's shape: hidden 1024, ffn 512 per expert, 24 layers, 32 experts top-8, 16/8
  heads, vocab 49155, bf16): synthesised into WORK by `colibri synth` and converted with
  `build_llamacpp.sh --convert` (once; ~2.6 GB of checkpoint, ~1.4 GB of GGUF).

colibri: one SCons build per target (int8c by default, MAX_SEQ 648), `colibri_demo` run as llama-bench runs its
tests: pp512 = one forward over a 512-token prompt ("prefill tok/s"), tg128 = 128 decoded tokens from a
one-token prompt ("tok/s"). llama-bench: `-m GGUF -t N -p 512 -n 128 -r 1 -o json` (its defaults otherwise:
a warm-up run, mmap, its default flash-attention setting), avg_ts of each test.

Each round runs, for every shape and thread count, every colibri target and llama-bench, then a streaming read
of a 1 GiB buffer with 1 and with N threads (a small C program compiled -O3 -march=native), in 4 KiB pages and in
transparent huge pages (the demos decode from a copy of the weights in those); the order within
a round alternates between rounds. Printed: per figure the median over rounds and the spread (min-max), the
ratio to llama-bench (the median and spread of the per-round ratios: each colibri run against the llama-bench
run of the same round, shape and thread count, so drift in the machine's state between rounds cancels), and
decode's fraction of the streaming read measured in the same run, the faster of the two page sizes
(weights read per decoded token, its expected value over top_k of n_experts routing, times tok/s, over
GB/s). The CPU model and the load average before and after go with the figures: on a 2-core machine a figure
taken while anything else runs is not a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from colibri.toolchain.scons.layout import output_dirs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab import paired  # noqa: E402  (bench/ab.py: the per-round ratios)

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PEER_SCRIPT = ROOT.parent / "shared" / "peer" / "build_llamacpp.sh"
PREFILL, DECODE = 512, 128  # llama-bench's pp512 and tg128
PAGES = {"4k": "4 KiB pages", "2m": "2 MiB pages"}  # the streaming read's buffer; the roofline is the faster
GOAL = {"decode": 1.3, "prefill": 1.1, "roofline": 0.85}
GRANITE = dict(layers=24, hidden=1024, ffn=512, heads=16, kv_heads=8, experts=32, top_k=8, vocab=49155, seed=1,
               dtype="bf16")
# shape -> (checkpoint under PEER/ckpt, GGUF name under PEER/gguf without "-<type>.gguf"), made by build_llamacpp.sh
PEER_SHAPES = {"30m": ("perf_tiny", "tiny-mixtral"), "288m": ("perf_mid", "mid-mixtral")}
PEER_QUANT = {"int8c": "Q8_0", "int8": "Q8_0", "int4c": "Q4_0", "int4": "Q4_0"}  # llama.cpp's type of the same bits
SCALE_BYTES = {0: 0, 1: 4, 2: 2}

STREAM_C = r"""
#define _GNU_SOURCE /* MADV_HUGEPAGE */
#include <pthread.h>
#include <sys/mman.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef struct { const uint64_t *a; size_t n; uint64_t sum; } part;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void *run(void *p) {
    part *w = p; uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 3 < w->n; i += 4) { s0 += w->a[i]; s1 += w->a[i + 1]; s2 += w->a[i + 2]; s3 += w->a[i + 3]; }
    w->sum = s0 + s1 + s2 + s3;
    return 0;
}
int main(int argc, char **argv) {
    size_t bytes = strtoull(argv[1], 0, 10) / 256 * 256, n = bytes / 8;
    int threads = argc > 2 ? atoi(argv[2]) : 1, huge = argc > 3 && strcmp(argv[3], "huge") == 0;
    uint64_t *a = aligned_alloc(2u << 20, bytes), sum = 0;
    if (huge) madvise(a, bytes, MADV_HUGEPAGE); /* before the first touch, as the demos' weights */
    memset(a, 1, bytes);
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[64]; part w[64];
        double t0 = now();
        for (int t = 0; t < threads; t++) {
            w[t].a = a + n / threads * t; w[t].n = n / threads;
            if (t) pthread_create(&th[t], 0, run, &w[t]);
        }
        run(&w[0]);
        for (int t = 1; t < threads; t++) pthread_join(th[t], 0);
        double dt = now() - t0;
        for (int t = 0; t < threads; t++) sum += w[t].sum;
        if (dt < best) best = dt;
    }
    printf("%.6f %llu\n", bytes / best / 1e9, (unsigned long long)sum & 1);
    return 0;
}
"""


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def cpu_flags() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            f = set(line.split(":", 1)[1].split())
            return ", ".join(x for x in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if x in f)
    return "?"


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def weight_bytes_per_token(blob: Path) -> int:
    """Bytes of weights one decoded token reads, expected over the routing (top_k of n_experts)."""
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
        nbytes = per_row if e["kind"] == fmt.KIND["EMBED"].code else e["rows"] * per_row + 4 * e["n_outliers"]
        total += nbytes * (h["top_k"] / h["n_experts"] if e["kind"] in expert_kinds else 1.0)
    return int(total)


def stream_exe(work: Path) -> Path:
    exe = work / "stream"
    src = work / "stream.c"
    if not exe.exists() or not src.exists() or src.read_text() != STREAM_C:
        src.write_text(STREAM_C)
        subprocess.run(["gcc", "-O3", "-march=native", "-pthread", str(src), "-o", str(exe)], check=True)
    return exe


def stream_gbs(exe: Path, threads: int, pages: str) -> float:
    """GB/s of the streaming read with threads threads over a buffer in 4 KiB pages ("4k") or in transparent
    huge pages ("2m": the demos decode from such a copy of the weights, runtime_c/demo/demo_common.h)."""
    argv = [str(exe), str(1 << 30), str(threads)] + (["huge"] if pages == "2m" else [])
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return float(out.stdout.split()[0])


def demo_run(demo: Path, prompt: list[int], generate: int, threads: int) -> dict[str, str]:
    res = subprocess.run([str(demo), "--tokens", ",".join(map(str, prompt)), "--generate", str(generate),
                          "--threads", str(threads)], capture_output=True, text=True, check=True)
    return dict(line.partition(": ")[::2] for line in res.stdout.splitlines())


def colibri_sample(demo: Path, vocab: int, threads: int) -> dict:
    pp = demo_run(demo, [(i * 7919 + 11) % vocab for i in range(PREFILL)], 1, threads)
    tg = demo_run(demo, [1], DECODE, threads)
    return {"prefill": float(pp["prefill tok/s"]), "decode": float(tg["tok/s"]), "tokens": tg["tokens"]}


def llama_sample(bench: Path, gguf: Path, threads: int) -> dict:
    argv = [str(bench), "-m", str(gguf), "-t", str(threads), "-p", str(PREFILL), "-n", str(DECODE), "-r", "1",
            "-o", "json"]
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{res.stderr[-2000:]}")
    out = {}
    for test in json.loads(res.stdout):
        key = "prefill" if test["n_prompt"] and not test["n_gen"] else "decode"
        out[key] = float(test["avg_ts"])
    return out


def build(work: Path, ckpt: Path, targets: list[str], quant: str, extra: tuple[str, ...] = ()) -> dict[str, Path]:
    """{target: output directory} of one SCons build into WORK/b; extra: more SCons options."""
    argv = [str(BIN / "scons"), "-C", str(ROOT), "-Q", "-j2", f"BUILD={work / 'b'}", f"MODEL={ckpt}",
            f"TARGET={','.join(targets)}", f"QUANT={quant}", f"MAX_SEQ={PREFILL + DECODE + 8}", *extra]
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return output_dirs(res.stdout)


def peer_gguf(peer: Path, stem: str, quant: str) -> Path:
    """PEER/gguf/<stem>-<type>.gguf; a type other than the converter's f32/q8_0 is made from the F32 GGUF by
    llama.cpp's own llama-quantize, as build_llamacpp.sh --convert does."""
    gguf = peer / "gguf" / f"{stem}-{quant.lower()}.gguf"
    f32 = peer / "gguf" / f"{stem}-f32.gguf"
    if not gguf.is_file() and quant.lower() not in ("f32", "q8_0") and f32.is_file():
        tmp = gguf.with_suffix(".tmp")
        res = subprocess.run([str(peer / "llama.cpp" / "build" / "bin" / "llama-quantize"), str(f32), str(tmp), quant],
                             capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"llama-quantize {f32} {quant} failed:\n{res.stderr[-2000:]}")
        tmp.rename(gguf)
    return gguf


def granite_inputs(work: Path, peer: Path, quant: str) -> tuple[Path, Path]:
    from colibri.codegen.synth import synth_checkpoint

    ckpt = work / "granite1b"
    if not (ckpt / "config.json").is_file():
        synth_checkpoint(ckpt, **GRANITE)
    if not (peer / "gguf" / "granite1b-f32.gguf").is_file():
        subprocess.run(["bash", str(PEER_SCRIPT), "--convert", str(ckpt), "granite1b"], check=True,
                       env={**os.environ, "PEER": str(peer)})
    return ckpt, peer_gguf(peer, "granite1b", quant)


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


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):8.1f} [{min(xs):.1f}-{max(xs):.1f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", default=os.environ.get("PEER", "/tmp/peer"))
    ap.add_argument("--shapes", default="30m,288m")
    ap.add_argument("--targets", default="host,x86_64-v3")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quant", default="int8c")
    ap.add_argument("--peer-quant", help="llama.cpp's weight type (default: Q8_0 for int8/int8c, Q4_0 for int4/int4c)")
    ap.add_argument("--callgrind", action="store_true", help="instructions per decoded token (30m only)")
    ap.add_argument("--work", default=str(ROOT / "build" / "speed"))
    a = ap.parse_args()

    peer, work = Path(a.peer), Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    bench = peer / "llama.cpp" / "build" / "bin" / "llama-bench"
    if not bench.is_file():
        sys.exit(f"{bench}: not built; run `PEER={peer} bash {PEER_SCRIPT}` first (~9 minutes)")
    targets = [t for t in a.targets.split(",") if t]
    peer_quant = a.peer_quant or PEER_QUANT.get(a.quant, "Q8_0")
    threads = [int(n) for n in a.threads.split(",") if n]
    shapes: dict[str, dict] = {}
    for s in [s for s in a.shapes.split(",") if s]:
        if s == "granite1b":
            ckpt, gguf = granite_inputs(work, peer, peer_quant)
        elif s in PEER_SHAPES:
            ckpt, gguf = peer / "ckpt" / PEER_SHAPES[s][0], peer_gguf(peer, PEER_SHAPES[s][1], peer_quant)
        else:
            sys.exit(f"--shapes: unknown shape {s!r} (30m, 288m, granite1b)")
        if not (ckpt / "config.json").is_file() or not gguf.is_file():
            sys.exit(f"{ckpt} or {gguf} missing: run `PEER={peer} bash {PEER_SCRIPT}` first")
        outs = build(work, ckpt, targets, a.quant)
        vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
        shapes[s] = {"ckpt": ckpt, "gguf": gguf, "outs": outs, "vocab": vocab,
                     "wpt": weight_bytes_per_token(outs[targets[0]] / "model.bin")}
        print(f"[{s}] {ckpt} -> {', '.join(str(outs[t]) for t in targets)}; llama.cpp {gguf.name}; "
              f"weights read per decoded token {shapes[s]['wpt'] / 1e6:.2f} MB", flush=True)

    exe = stream_exe(work)
    print(f"CPU: {cpu_model()} ({cpu_flags()}), {os.cpu_count()} cores; load average before: {loadavg()}",
          flush=True)
    samples: dict[tuple, list] = {}
    runners = [(t, "colibri") for t in targets] + [("llama.cpp", "peer")]
    for r in range(a.rounds):
        order = runners if r % 2 == 0 else runners[::-1]
        for s, sh in shapes.items():
            for n in threads:
                for name, kind in order:
                    x = (llama_sample(bench, sh["gguf"], n) if kind == "peer"
                         else colibri_sample(sh["outs"][name] / "colibri_demo", sh["vocab"], n))
                    samples.setdefault((s, n, name), []).append(x)
        for n in threads:
            for pages in PAGES:
                samples.setdefault(("stream", n, pages), []).append(stream_gbs(exe, n, pages))
        print(f"round {r + 1}/{a.rounds} done, load average {loadavg()}", flush=True)
    print(f"load average after: {loadavg()}\n")

    bw = {n: max(statistics.median(samples[("stream", n, p)]) for p in PAGES) for n in threads}
    for n in threads:
        for p in PAGES:
            print(f"streaming read, {n} thread(s), 1 GiB in {PAGES[p]}: {med(samples[('stream', n, p)])} GB/s")
    print(f"\n{'shape':<10} {'T':>2} {'runner':<10} {'decode tok/s [min-max]':>26} {'x llama [min-max]':>18} "
          f"{'roofline':>8} {'prefill tok/s [min-max]':>28} {'x llama [min-max]':>18}  tokens equal 1T")
    for s, sh in shapes.items():
        for n in threads:
            ll = samples[(s, n, "llama.cpp")]
            ll_dec = [x["decode"] for x in ll]
            ll_pre = [x["prefill"] for x in ll]
            for name, _kind in runners:
                xs = samples[(s, n, name)]
                dec = [x["decode"] for x in xs]
                pre = [x["prefill"] for x in xs]
                roof = f"{statistics.median(dec) * sh['wpt'] / 1e9 / bw[n]:8.0%}" if name != "llama.cpp" else " " * 8
                same = ("" if name == "llama.cpp" else
                        str(all(x["tokens"] == samples[(s, threads[0], name)][0]["tokens"] for x in xs)))
                print(f"{s:<10} {n:>2} {name:<10} {med(dec):>26} {paired(dec, ll_dec, 2):>18} "
                      f"{roof} {med(pre):>28} {paired(pre, ll_pre, 2):>18}  {same}")
    print(f"\ngoal: decode >= {GOAL['decode']}x and prefill >= {GOAL['prefill']}x llama-bench; 288m decode >= "
          f"{GOAL['roofline']:.0%} of the streaming read at the same thread count ('roofline' = weights read per "
          f"token x tok/s / GB/s, the faster of the two page sizes)")
    if a.callgrind and "30m" in shapes:
        for t in targets:
            ir = callgrind_per_token(shapes["30m"]["outs"][t] / "colibri_demo")
            print(f"callgrind, 30m, {t}: {ir / 1e6:.2f} M instructions per decoded token" if ir else
                  f"callgrind, 30m, {t}: n/a")
    return 0


if __name__ == "__main__":
    sys.exit(main())
