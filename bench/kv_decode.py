"""Decode speed over a long context with the KV cache in f32, f16 and int8, on this machine (`host`).

    .venv/bin/python bench/kv_decode.py [--context 3584] [--decode 64] [--max-seq 4096] [--kv f32,f16,int8] [--keep]

One synthetic Mixtral (bench/host.py's shape, head_dim 32) exported and built per KV precision at
max_seq 4096 (`scons KV=... MAX_SEQ=4096`); the prompt of --context tokens is pushed through once, then
--decode tokens are generated one at a time, single-threaded: decode tokens/s (median of 3), with the
arena bytes beside. At that length attention reads the whole cache each step, so the cache's width is
what the figures compare (the AVX2/F16C and NEON attention over f16/int8 caches: runtime_c/src/arch/).
Run it on a quiet machine only.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPE = dict(layers=4, hidden=256, ffn=512, heads=8, kv_heads=4, experts=8, top_k=2, vocab=32000, seed=1)


def run_kv(ckpt: Path, work: Path, kv: str, a: argparse.Namespace) -> dict:
    from colibri.runtime import load
    from colibri.toolchain.scons.layout import output_dirs

    built = subprocess.run([str(Path(sys.executable).parent / "scons"), "-C", str(ROOT), "-Q", "-j2",
                            f"BUILD={work / kv}", f"MODEL={ckpt}", f"KV={kv}", f"MAX_SEQ={a.max_seq}"],
                           check=True, capture_output=True, text=True)
    out = output_dirs(built.stdout)["host"]
    m = load(out / f"libcolibri_{out.name}.so")
    prompt = [(i * 7919) % SHAPE["vocab"] for i in range(a.context)]
    decode = []
    for _ in range(3):
        m.reset()
        tok = int(m.forward(prompt).argmax())
        t0 = time.perf_counter()
        for _ in range(a.decode):
            tok = int(m.forward([tok]).argmax())
        decode.append(a.decode / (time.perf_counter() - t0))
    return {"arena": m.arena_bytes, "decode": statistics.median(decode), "spread": (min(decode), max(decode))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", default="f32,f16,int8", help="comma list of KV cache precisions")
    ap.add_argument("--max-seq", type=int, default=4096)
    ap.add_argument("--context", type=int, default=3584, help="prompt tokens before decoding")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    if a.context + a.decode > a.max_seq:  # each of the three rounds starts from a reset
        ap.error(f"--context {a.context} + --decode {a.decode} exceed --max-seq {a.max_seq}")
    from colibri.codegen.synth import synth_checkpoint

    work = Path(tempfile.mkdtemp(prefix="colibri-kvbench-"))
    try:
        ckpt = synth_checkpoint(work / "kvbench", **SHAPE)
        print(f"context {a.context} tokens, decode {a.decode}, max_seq {a.max_seq}, 1 thread")
        base = None
        for kv in a.kv.split(","):
            r = run_kv(ckpt, work, kv, a)
            base = base or r["decode"]
            print(f"KV {kv:<5} decode {r['decode']:8.1f} tok/s ({r['spread'][0]:.1f}-{r['spread'][1]:.1f}, "
                  f"x{r['decode'] / base:.2f} of the first)  arena {r['arena']:,} B")
    finally:
        if a.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
