"""Host benchmark of the spine: export, build and run a ~30M-parameter synthetic Mixtral.

    .venv/bin/python bench/host.py [--quant int8c] [--keep]

Prints export seconds and MB/s, build seconds, single-threaded prefill and decode
tokens/s (median of 3), arena bytes and .so size. Scalar kernels: the SIMD issue
sets the speed targets.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPE = dict(layers=4, hidden=256, ffn=512, heads=8, kv_heads=4, experts=8, top_k=2, vocab=32000, seed=1)


def run_quant(ckpt: Path, work: Path, quant: str, a: argparse.Namespace) -> dict:
    from colibri.codegen.export import ExportOptions, export
    from colibri.runtime import load
    from colibri.toolchain.scons.layout import output_dirs

    t0 = time.perf_counter()
    res = export(ckpt, work / f"gen-{quant}", ExportOptions(quant=quant, max_seq=256))
    export_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    built = subprocess.run([str(Path(sys.executable).parent / "scons"), "-C", str(ROOT), "-Q", "-j2",
                            f"BUILD={work / quant}", f"MODEL={ckpt}", f"QUANT={quant}", "MAX_SEQ=256"],
                           check=True, capture_output=True, text=True)
    build_s = time.perf_counter() - t0
    out = output_dirs(built.stdout)["host"]
    so = out / f"libcolibri_{out.name}.so"
    m = load(so)
    prompt = [(i * 7919) % SHAPE["vocab"] for i in range(a.prefill)]
    prefill, decode = [], []
    for _ in range(3):
        m.reset()
        t0 = time.perf_counter()
        logits = m.forward(prompt)
        prefill.append(a.prefill / (time.perf_counter() - t0))
        tok = int(logits.argmax())
        t0 = time.perf_counter()
        for _ in range(a.decode):
            tok = int(m.forward([tok]).argmax())
        decode.append(a.decode / (time.perf_counter() - t0))
    return {"manifest": res.manifest, "export_s": export_s, "build_s": build_s, "so": so, "arena": m.arena_bytes,
            "prefill": statistics.median(prefill), "decode": statistics.median(decode)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quant", default="int8c,int8", help="comma list; the first is the main figure")
    ap.add_argument("--prefill", type=int, default=64)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--keep", action="store_true", help="keep build/bench afterwards")
    a = ap.parse_args()

    from colibri.codegen.synth import synth_checkpoint

    work = ROOT / "build" / "bench"
    shutil.rmtree(work, ignore_errors=True)
    ckpt = synth_checkpoint(work / "mixtral30m", **SHAPE)
    src_bytes = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
    print(f"model: synthetic Mixtral {SHAPE}")
    results = {}
    for quant in a.quant.split(","):
        r = results[quant] = run_quant(ckpt, work, quant, a)
        man = r["manifest"]
        print(f"[{quant}] {man['totals']['weights'] / 1e6:.1f} M weights, "
              f"{man['totals']['bits_per_weight']:.3f} bits/weight")
        print(f"[{quant}] export: {r['export_s']:.2f} s, {src_bytes / 1e6 / r['export_s']:.1f} MB/s of source "
              f"safetensors ({src_bytes / 1e6:.1f} MB)")
        print(f"[{quant}] build (host, clean): {r['build_s']:.2f} s")
        print(f"[{quant}] prefill: {r['prefill']:.1f} tok/s ({a.prefill} tokens, median of 3, 1 thread)")
        print(f"[{quant}] decode: {r['decode']:.1f} tok/s ({a.decode} tokens, median of 3, 1 thread)")
        print(f"[{quant}] arena: {r['arena']:,} bytes (max_seq 256; naive {man['arena']['naive_bytes']:,})")
        print(f"[{quant}] blob: {man['blob']['bytes']:,} bytes; .so: {r['so'].stat().st_size:,} bytes")
    if "int8" in results and "int8c" in results:
        print(f"compensation cost: int8c decode at {results['int8c']['decode'] / results['int8']['decode']:.3f}x "
              f"and prefill at {results['int8c']['prefill'] / results['int8']['prefill']:.3f}x the speed of int8 "
              "(same run)")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
