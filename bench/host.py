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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quant", default="int8c")
    ap.add_argument("--prefill", type=int, default=64)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--keep", action="store_true", help="keep build/bench afterwards")
    a = ap.parse_args()

    from colibri.codegen.export import ExportOptions, export
    from colibri.codegen.synth import synth_checkpoint
    from colibri.runtime import load

    work = ROOT / "build" / "bench"
    shutil.rmtree(work, ignore_errors=True)
    ckpt = synth_checkpoint(work / "mixtral30m", **SHAPE)
    src_bytes = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))

    t0 = time.perf_counter()
    res = export(ckpt, work / "gen", ExportOptions(quant=a.quant, max_seq=256))
    export_s = time.perf_counter() - t0
    weights = res.manifest["totals"]["weights"]

    t0 = time.perf_counter()
    subprocess.run([str(Path(sys.executable).parent / "scons"), "-C", str(ROOT), "-Q", "-j2", f"BUILD={work}",
                    f"MODEL={ckpt}", f"QUANT={a.quant}", "MAX_SEQ=256"], check=True, capture_output=True)
    build_s = time.perf_counter() - t0
    out = work / "host" / ckpt.name
    so = out / f"libcolibri_{ckpt.name}.so"
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

    print(f"model: synthetic Mixtral {SHAPE}, {weights / 1e6:.1f} M weights, {a.quant}, "
          f"{res.manifest['totals']['bits_per_weight']:.3f} bits/weight")
    print(f"export: {export_s:.2f} s, {src_bytes / 1e6 / export_s:.1f} MB/s of source safetensors "
          f"({src_bytes / 1e6:.1f} MB)")
    print(f"build (host, clean): {build_s:.2f} s")
    print(f"prefill: {statistics.median(prefill):.1f} tok/s ({a.prefill} tokens, median of 3, 1 thread)")
    print(f"decode: {statistics.median(decode):.1f} tok/s ({a.decode} tokens, median of 3, 1 thread)")
    print(f"arena: {m.arena_bytes:,} bytes (max_seq 256; naive {res.manifest['arena']['naive_bytes']:,})")
    print(f"blob: {res.manifest['blob']['bytes']:,} bytes; .so: {so.stat().st_size:,} bytes")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
