"""Helpers of the robustness tests: compile runtime_c/test programs, export tiny seed blobs.

The C test programs link the generic runtime sources directly and are built with one
compiler call each into the test's own directory; they are test code (pthreads, mmap,
malloc are fine there), the runtime sources keep the build's -Werror -pedantic flags.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

from colibri.toolchain.csources import FLOAT_CFLAGS, TEXT_SRC, WARN_CFLAGS, runtime_sources

ROOT = Path(__file__).resolve().parent.parent
TEST_SRC = ROOT / "runtime_c" / "test"
RUNTIME_SRC = runtime_sources()
# fuzz_blob.c: the blob through colibri_init and forward, and its tokenizer section through the text runtime
FUZZ_SRC = [TEST_SRC / "fuzz_blob.c", *RUNTIME_SRC, *runtime_sources(TEXT_SRC)]
CFLAGS = [*WARN_CFLAGS, *FLOAT_CFLAGS, "-g", "-O1", "-fno-omit-frame-pointer", f"-I{ROOT / 'runtime_c' / 'include'}"]
# The vector kernels the host build uses (AVX2 / AVX-512 / NEON); COLIBRI_SCALAR forces the scalar ones.
NATIVE = ["-march=native"] if platform.machine() in ("x86_64", "aarch64") else []
SCALAR = ["-DCOLIBRI_SCALAR"]
ASAN = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
# Sanitizer reports end the process with a status no test expects, and say so on stderr.
SAN_ENV = {
    "ASAN_OPTIONS": "abort_on_error=0:exitcode=86:detect_leaks=1:allocator_may_return_null=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=87",
    "TSAN_OPTIONS": "halt_on_error=1:exitcode=88:second_deadlock_stack=1",
}
SAN_MARKERS = ("Sanitizer", "runtime error:", "ThreadSanitizer", "LeakSanitizer")
KNOWN = set(range(0, 20)) - {14}  # every colibri_status but MODEL_MISMATCH (a generic build)

# Tiny checkpoints whose exports seed the fuzzer and the mutation test and feed the contract
# tests: every weight dtype the blob has (f32, f16, int8, int8c with outliers), per-row and grouped
# scales, tied and untied lm_head, GQA and plain multi-head attention, top-1 and top-k routing, one
# and two layers, every model family's feature flags, and max_seq small enough for the fuzz target
# to run into SEQ_FULL. Each blob is 7-17 KiB.
SEEDS = {
    "int8c_gqa": (dict(layers=1, hidden=16, ffn=24, heads=2, kv_heads=1, experts=3, top_k=2, vocab=32, seed=21,
                       heavy_tail=True), dict(quant="int8c", outlier_frac=0.05, max_seq=8)),
    "f32_tied_top1": (dict(layers=1, hidden=16, ffn=16, heads=2, kv_heads=2, experts=2, top_k=1, vocab=24,
                           seed=22, tie=True), dict(quant="f32", max_seq=4)),
    "f16_two_layers": (dict(layers=2, hidden=16, ffn=16, heads=4, kv_heads=2, experts=2, top_k=2, vocab=20,
                            seed=23, dtype="f16"), dict(quant="f16", max_seq=6)),
    "int8_grouped": (dict(layers=1, hidden=24, ffn=20, heads=2, kv_heads=1, head_dim=6, experts=4, top_k=3,
                          vocab=28, seed=24, dtype="bf16"), dict(quant="int8", group_size=8, max_seq=8)),
    "int8c_grouped_tied": (dict(layers=1, hidden=16, ffn=16, heads=2, kv_heads=1, experts=2, top_k=2, vocab=16,
                                seed=25, tie=True, heavy_tail=True),
                           dict(quant="int8c", group_size=5, outlier_frac=0.1, max_seq=3)),
    # format 1.2 integer matmuls: int8c in 16-row tiles (vocab 20: a part tile), int8 with groups in rows
    "int8c_q8_tiled": (dict(layers=1, hidden=32, ffn=32, heads=2, kv_heads=1, experts=2, top_k=2, vocab=20,
                            seed=26, heavy_tail=True), dict(quant="int8c", outlier_frac=0.05, max_seq=6)),
    "int8_q8_rows": (dict(layers=1, hidden=64, ffn=32, heads=2, kv_heads=2, experts=2, top_k=1, vocab=18,
                          seed=27, tie=True), dict(quant="int8", group_size=32, layout="rows", max_seq=4)),
    # a tokenizer section (tests/tokvocab.py's byte-level BPE, 320 pieces) for colibri_tok_from_blob
    "f16_tokenizer": (dict(layers=1, hidden=8, ffn=8, heads=2, kv_heads=1, experts=2, top_k=1, vocab=320,
                           seed=28), dict(quant="f16", max_seq=4)),
    # the format 1.1 feature flags: q/k/v biases, gated shared expert and a dense layer (Qwen2-MoE), per-head
    # q/k norms (Qwen3-MoE), whole q/k norms without top-k renormalisation (OLMoE), ungated shared expert,
    # dense first layer and routed scale (DeepSeek-MoE)
    "qwen2_moe": (dict(arch="qwen2_moe", layers=2, hidden=16, ffn=8, heads=2, kv_heads=1, experts=4, top_k=2,
                       vocab=24, seed=31, shared_ffn=16, dense_layers=[1], dense_ffn=16),
                  dict(quant="int8c", max_seq=5)),
    "qwen3_moe": (dict(arch="qwen3_moe", layers=1, hidden=16, ffn=8, heads=4, kv_heads=2, head_dim=6, experts=3,
                       top_k=2, vocab=24, seed=32), dict(quant="f16", max_seq=5)),
    "olmoe": (dict(arch="olmoe", layers=1, hidden=16, ffn=8, heads=2, kv_heads=2, experts=3, top_k=2, vocab=24,
                   seed=33), dict(quant="int8", group_size=8, max_seq=5)),
    # a parameters section: Mistral's sliding window (3) with a ring KV cache of 3 + 2 - 1 rows under max_seq 8
    "mistral_sliding": (dict(arch="mistral", layers=2, hidden=16, ffn=16, heads=2, kv_heads=1, experts=1, top_k=1,
                             vocab=24, seed=35, sliding_window=3), dict(quant="int8c", max_seq=8, prefill_block=2)),
    # gpt-oss: sinks, o/q/k/v biases, router and expert biases, the clamped SwiGLU's f32 parameters, a sliding
    # layer then a full one
    "gpt_oss": (dict(arch="gpt-oss", layers=2, hidden=16, ffn=16, heads=2, kv_heads=1, experts=3, top_k=2,
                     vocab=24, seed=36, sliding_window=3), dict(quant="int8c", max_seq=8, prefill_block=2)),
    "deepseek": (dict(arch="deepseek", layers=2, hidden=16, ffn=8, heads=2, kv_heads=2, experts=4, top_k=2,
                      vocab=24, seed=34, shared_ffn=16, dense_layers=[0], dense_ffn=24, routed_scale=2.5),
                 dict(quant="int8c", max_seq=5)),
}


def compile_c(out: Path, sources: list[Path], flags: list[str], cc: str = "cc", libs: tuple[str, ...] = ()) -> Path:
    """One compiler call; raises AssertionError with the compiler's output on failure."""
    argv = [cc, *CFLAGS, *flags, *map(str, sources), "-o", str(out), "-lm", *libs]
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed:\n{res.stdout}{res.stderr}")
    return out


def fuzz_clang() -> str | None:
    """A clang whose runtime has libFuzzer (Debian's clang and clang-19 both do)."""
    for cc in ("clang", "clang-19", "clang-14"):
        if shutil.which(cc):
            return cc
    return None


def sanitizer_report(stderr: str) -> bool:
    return any(m in stderr for m in SAN_MARKERS)


_seed_cache: dict[Path, list[Path]] = {}


def seed_blobs(base: Path) -> list[Path]:
    """Export every SEEDS checkpoint under base (once per directory); the model.bin paths."""
    if base not in _seed_cache:
        from colibri.codegen.export import ExportOptions, export
        from colibri.codegen.synth import synth_checkpoint

        blobs = []
        for name, (synth_kw, opts) in SEEDS.items():
            ckpt = synth_checkpoint(base / "ckpt" / name, **synth_kw)
            if name.endswith("_tokenizer"):
                from tokvocab import train_bytelevel

                train_bytelevel(ckpt, synth_kw["vocab"])
            out = base / "gen" / name
            export(ckpt, out, ExportOptions(prompt=[1], generate=1, predict=False, **opts))
            blobs.append(out / "model.bin")
        _seed_cache[base] = blobs
    return _seed_cache[base]


def run_files(runner, files, timeout=600) -> list[tuple[int, int, str]]:
    """(raw status, fixed-up status, path) per file; fails on a crash, hang or sanitizer report."""
    res = subprocess.run([str(runner), *map(str, files)], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **SAN_ENV})
    last = [line for line in res.stderr.splitlines() if line.startswith("run ")][-1:]
    assert res.returncode == 0 and not sanitizer_report(res.stderr), (
        f"exit {res.returncode} on {last[0][4:] if last else '?'}:\n{res.stderr[-4000:]}")
    rows = [(int(a), int(b), p) for a, b, p in (line.split(" ", 2) for line in res.stdout.splitlines())]
    assert len(rows) == len(files)
    return rows
