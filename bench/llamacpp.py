"""llama.cpp (CPU backend, 1 thread, Q8_0) on the same synthetic Mixtral checkpoints, measured on this machine.

    .venv/bin/python bench/llamacpp.py [--shapes 30m,288m] [--reps 5] [--json]

So that bench/speed.py can state its speed figures as ratios measured in one run instead of constants
copied from an issue. For each shape (the kwargs of bench/speed.py's SHAPES, repeated here):

1. A bench-only venv, build/bench/llamacpp-venv, is created once and reused: `llama-cpp-python` (which
   compiles its vendored llama.cpp with CMake: CPU only, -DGGML_NATIVE=ON, no OpenMP, BLAS or curl, at most
   2 build jobs, under `nice`; 6 min on the 2-core dev machine, 13.5 min while a test suite ran beside it; log
   in build/bench/llamacpp-pip.log) and `gguf` (the GGUF writer and the numpy Q8_0 quantizer). Neither is a
   dependency of colibri. Delete the venv to rebuild (e.g. for another llama-cpp-python version).
   AMX is compiled out (-mno-amx-*): this VM's CPU reports AMX and the kernel grants the tile permission,
   yet ggml's AMX Q8_0 matmul (attention and output weights; the 3-D expert tensors never use it) dies
   of SIGILL at its first ldtilecfg. Everything else -march=native has is used (AVX-512, VNNI, BF16).
   Q8_0 has no CPU_REPACK layout on x86, so all weights stay in the plain mmap'd CPU buffer.
2. colibri's own synthesiser (codegen/synth.py, what `colibri synth` runs) writes the HF Mixtral
   checkpoint to build/bench/llamacpp/mixtral<shape>/ (kept; rewritten only if config.json is missing).
3. The checkpoint is converted, under the bench venv, to build/bench/llamacpp/mixtral<shape>.q8_0.gguf
   as convert_hf_to_gguf.py does for Mixtral: arch "llama" with the stacked expert tensors
   blk.N.ffn_{gate,down,up}_exps, attn_q/attn_k rows permuted for llama.cpp's rope (LlamaModel.permute),
   2-D weights in Q8_0 (token_embd and output included), norms and the router (ffn_gate_inp) in F32, and a
   dummy SentencePiece ("llama") vocabulary of `vocab` tokens: <unk>, <s>, </s>, the 256 byte tokens, then
   placeholders (what the loader needs; the text is never used). Redone when the checkpoint is newer.
   Checked once against codegen/reference.py on the 30m shape: llama.cpp's logits correlate 0.995-0.9998
   with the float32 reference over 10 positions (0.82-0.99 without the permutation).
4. A subprocess under the bench venv drives libllama through llama_cpp's low-level ctypes API as
   llama-bench does: model loaded once (mmap), then per test a fresh context sized for it (n_ctx 512 or
   128, n_batch = n_ubatch = 512, f16 KV cache, flash attention "auto" = llama-bench's default; it turns
   on for CPU), n_threads = n_threads_batch = 1, one warm-up, then --reps runs each from a cleared KV cache
   (llama_memory_clear): prefill pp512 = one llama_decode of a 512-token batch (BOS, then random ids;
   logits for the last token only), decode tg128 = 128 single-token llama_decode calls, each followed by
   llama_synchronize. Reported: the median run in tok/s of wall time ("decode", "prefill": what
   llama-bench prints), the same over the thread's CPU time ("decode_cpu", "prefill_cpu": less
   disturbed by other processes, not immune to them: they share caches, memory bandwidth, perhaps a
   physical core), the samples, and bits per weight = GGUF file size * 8 / llama_model_n_params (the file
   includes the ~0.5 MB vocabulary).

Prints a table (shape, decode and prefill tok/s, wall and CPU time, bits/weight); with --json the table goes
to stderr and stdout gets one JSON object {"30m": {"decode": .., "prefill": .., ...}, "288m": {...}}. From
Python: `measure(["30m", "288m"], reps=5)` returns the same dict. The 1-minute load average before and after
each shape is recorded as "loadavg_1min": on 2 cores, anything else running (a test suite, a build) slows
llama.cpp as much as it slows colibri, so measure both in the same quiet run.

Measured on the dev machine (llama-cpp-python 0.3.36, load average ~1.0 = this bench alone, --reps 5):
30m decode 1002 tok/s, prefill 5398 tok/s, 8.72 bits/weight; 288m decode 76.8 tok/s, prefill 394 tok/s,
8.53 bits/weight. That is 0.49x / 0.65x / 0.32x / 0.68x the issue's figures (2050, 8300, 240, 580), which
this machine cannot reach with one thread: 288m decode reads ~110.6 MB of Q8_0 weights per token
(attention 22.3, 2 of 8 experts 53.5, output 34.8), and 76.8 tok/s is 8.5 GB/s, exactly the 1-thread
streaming read bench/speed.py's STREAM_C measures here (8.45 GB/s over 1 GiB); 240 tok/s would need 26.5.
At load average ~5 (a test suite and builds beside it) the same run gave 666 / 3780 / 53 / 272 tok/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "bench" / "llamacpp"
VENV = ROOT / "build" / "bench" / "llamacpp-venv"
# the same shapes as bench/speed.py (kept in step by hand: importing speed.py would run nothing, but it is
# being rewritten concurrently and this file must not depend on its internals)
SHAPES: dict[str, dict[str, int]] = {
    "30m": dict(layers=4, hidden=256, ffn=512, heads=8, kv_heads=4, experts=8, top_k=2, vocab=32000, seed=1),
    "288m": dict(layers=8, hidden=1024, ffn=1024, heads=8, kv_heads=2, experts=8, top_k=2, vocab=32000, seed=1),
}
PACKAGES = ("llama-cpp-python", "gguf")
# -march=native without AMX: this VM's CPU reports AMX (and the kernel grants the tile permission), yet ggml's
# AMX Q8_0 matmul dies of SIGILL at its first ldtilecfg; explicit -mno-* flags win over -march=native in GCC.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CMAKE_ARGS = ("-DGGML_NATIVE=ON -DGGML_OPENMP=OFF -DGGML_BLAS=OFF -DGGML_CCACHE=OFF -DLLAMA_CURL=OFF "
              "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF "
              f'-DCMAKE_C_FLAGS="{NO_AMX}" -DCMAKE_CXX_FLAGS="{NO_AMX}"')
N_PROMPT, N_GEN = 512, 128


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# driver side (the project's .venv)


def venv_python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv() -> Path:
    """Create build/bench/llamacpp-venv with llama-cpp-python and gguf unless it already works; its python."""
    py = venv_python()
    probe = [str(py), "-c", "import gguf, llama_cpp; print(llama_cpp.llama_print_system_info().decode())"]
    extra: list[str] = []
    if py.is_file():
        r = subprocess.run(probe, capture_output=True, text=True)
        if r.returncode == 0 and "AMX" not in r.stdout:
            return py
        if r.returncode == 0:  # built before AMX was compiled out (see the docstring): rebuild
            extra = ["--force-reinstall", "--no-deps"]
    VENV.parent.mkdir(parents=True, exist_ok=True)
    if not py.is_file():
        # the interpreter colibri's venv was made from (sys.executable may be that venv's own python)
        base = Path(sys.base_prefix) / "bin" / "python3"
        subprocess.run([str(base if base.is_file() else sys.executable), "-m", "venv", str(VENV)], check=True)
    env = dict(os.environ, CMAKE_ARGS=CMAKE_ARGS, CMAKE_BUILD_PARALLEL_LEVEL="2", MAKEFLAGS="-j2",
               FORCE_CMAKE="1")
    logfile = VENV.parent / "llamacpp-pip.log"
    log(f"building llama-cpp-python from source into {VENV} (a few minutes; log: {logfile})")
    t0 = time.perf_counter()
    with open(logfile, "w") as f:
        cmd = ["nice", "-n", "10", str(py), "-m", "pip", "install", "-v", "--no-cache-dir", *extra, *PACKAGES]
        r = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        tail = logfile.read_text(errors="replace").splitlines()[-30:]
        raise SystemExit("pip install of llama-cpp-python failed:\n" + "\n".join(tail))
    subprocess.run(probe, check=True, capture_output=True)
    log(f"llama-cpp-python built and installed in {time.perf_counter() - t0:.0f} s")
    return py


def synth(shape: str) -> Path:
    """The shape's HF Mixtral checkpoint, written by colibri's synthesiser once."""
    ckpt = WORK / f"mixtral{shape}"
    if not (ckpt / "config.json").is_file():
        from colibri.codegen.synth import synth_checkpoint

        t0 = time.perf_counter()
        synth_checkpoint(ckpt, **SHAPES[shape])
        log(f"[{shape}] synthesized {ckpt} in {time.perf_counter() - t0:.1f} s")
    return ckpt


def _newest_mtime(ckpt: Path) -> float:
    return max(p.stat().st_mtime for p in ckpt.iterdir() if p.suffix in (".json", ".safetensors"))


def convert(py: Path, ckpt: Path) -> Path:
    """ckpt -> <ckpt>.q8_0.gguf under the bench venv, unless an up-to-date one exists."""
    gguf_path = ckpt.with_name(ckpt.name + ".q8_0.gguf")
    if gguf_path.is_file() and gguf_path.stat().st_mtime >= _newest_mtime(ckpt):
        return gguf_path
    t0 = time.perf_counter()
    subprocess.run([str(py), str(Path(__file__).resolve()), "_convert", str(ckpt), str(gguf_path)], check=True)
    log(f"converted {ckpt.name} to {gguf_path.name} ({gguf_path.stat().st_size / 1e6:.1f} MB) "
        f"in {time.perf_counter() - t0:.1f} s")
    return gguf_path


def run_llama(py: Path, gguf_path: Path, reps: int) -> dict[str, Any]:
    """Measure one GGUF in a subprocess under the bench venv; its JSON result."""
    cmd = [str(py), str(Path(__file__).resolve()), "_run", str(gguf_path), str(reps)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"llama.cpp run on {gguf_path} failed ({r.returncode}):\n" + r.stderr[-4000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def measure(shapes: list[str] | tuple[str, ...], reps: int = 5) -> dict[str, dict[str, Any]]:
    """{shape: {"decode": tok/s, "prefill": tok/s, ...}} for llama.cpp, 1 thread, Q8_0, on this machine."""
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        raise ValueError(f"unknown shape(s) {unknown}; known: {', '.join(SHAPES)}")
    py = ensure_venv()
    out: dict[str, dict[str, Any]] = {}
    for shape in shapes:
        gguf_path = convert(py, synth(shape))
        load_before = os.getloadavg()[0]
        res = run_llama(py, gguf_path, reps)
        res["loadavg_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        res["gguf"] = str(gguf_path.relative_to(ROOT))
        out[shape] = res
        log(f"[{shape}] llama.cpp {res['llama_cpp_python']}: decode {res['decode']:.1f} tok/s, "
            f"prefill {res['prefill']:.1f} tok/s, {res['bits_per_weight']:.3f} bits/weight, "
            f"load average {res['loadavg_1min']}")
    return out


def table(results: dict[str, dict[str, Any]]) -> str:
    rows = ["llama.cpp, CPU, 1 thread, Q8_0: tok/s, median; 'cpu' = over the thread's CPU time",
            f"{'shape':<6} {'params':>8} {'decode tg128':>13} {'(cpu)':>8} {'prefill pp512':>14} {'(cpu)':>8} "
            f"{'bits/w':>7} {'load':>11}"]
    for shape, r in results.items():
        rows.append(f"{shape:<6} {r['params'] / 1e6:7.1f}M {r['decode']:13.1f} {r['decode_cpu']:8.1f} "
                    f"{r['prefill']:14.1f} {r['prefill_cpu']:8.1f} {r['bits_per_weight']:7.3f} "
                    f"{r['loadavg_1min'][0]:5.2f}/{r['loadavg_1min'][1]:<5.2f}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="30m,288m", help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="JSON on stdout (the table goes to stderr)")
    a = ap.parse_args(argv)
    results = measure([s for s in a.shapes.split(",") if s], a.reps)
    if a.json:
        log(table(results))
        print(json.dumps(results))
    else:
        print(table(results))


# ---------------------------------------------------------------------------------------------------------------
# worker side (the bench venv: numpy, gguf, llama_cpp)


def _read_safetensors(ckpt: Path) -> dict[str, Any]:
    """name -> numpy float32 array (memory-mapped) for every tensor of every *.safetensors in ckpt."""
    import numpy as np

    dtypes = {"F32": np.float32, "F16": np.float16}
    out: dict[str, Any] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        raw = np.memmap(f, dtype=np.uint8, mode="r", offset=8 + n)
        for name, info in header.items():
            if name == "__metadata__":
                continue
            lo, hi = info["data_offsets"]
            if info["dtype"] == "BF16":
                bits = raw[lo:hi].view("<u2").astype(np.uint32) << 16
                arr = bits.view(np.float32)
            else:
                arr = raw[lo:hi].view(dtypes[info["dtype"]])
            out[name] = arr.reshape(info["shape"])
    return out


def _permute(w: Any, n_head: int) -> Any:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF's rotate-half q/k rows -> llama.cpp's interleaved rope."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _convert(ckpt: Path, out: Path) -> None:
    import gguf
    import numpy as np

    cfg = json.loads((ckpt / "config.json").read_text())
    t = _read_safetensors(ckpt)
    n_layer, n_head, n_kv = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hidden, vocab, n_exp = cfg["hidden_size"], cfg["vocab_size"], cfg["num_local_experts"]
    head_dim = cfg.get("head_dim") or hidden // n_head
    q8 = gguf.GGMLQuantizationType.Q8_0

    tmp = out.with_name(out.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(ckpt.name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_vocab_size(vocab)
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(hidden)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(head_dim)
    if head_dim != hidden // n_head:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 1e6)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-5)))
    w.add_expert_count(n_exp)
    w.add_expert_used_count(cfg["num_experts_per_tok"])

    # a SentencePiece-shaped dummy vocabulary: what llama.cpp's loader needs, never used to tokenize
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    n_fill = vocab - len(tokens)
    if n_fill < 0:
        raise SystemExit(f"{ckpt}: vocab {vocab} is smaller than the {len(tokens)} special and byte tokens")
    tokens += [f"\u2581t{i}" for i in range(n_fill)]
    types += [gguf.TokenType.NORMAL] * n_fill
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(n_fill)])
    w.add_token_types(types)
    w.add_bos_token_id(cfg.get("bos_token_id", 1) or 1)
    w.add_eos_token_id(cfg.get("eos_token_id", 2) or 2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)

    def q(name: str, arr: Any) -> None:
        w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), q8), raw_dtype=q8)

    def f32(name: str, arr: Any) -> None:
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    q("token_embd.weight", t["model.embed_tokens.weight"])
    for i in range(n_layer):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        f32(b + "attn_norm.weight", t[p + "input_layernorm.weight"])
        q(b + "attn_q.weight", _permute(t[p + "self_attn.q_proj.weight"], n_head))
        q(b + "attn_k.weight", _permute(t[p + "self_attn.k_proj.weight"], n_kv))
        q(b + "attn_v.weight", t[p + "self_attn.v_proj.weight"])
        q(b + "attn_output.weight", t[p + "self_attn.o_proj.weight"])
        f32(b + "ffn_norm.weight", t[p + "post_attention_layernorm.weight"])
        f32(b + "ffn_gate_inp.weight", t[p + "block_sparse_moe.gate.weight"])  # F32, as convert_hf_to_gguf keeps it
        for proj, hf in (("gate", "w1"), ("down", "w2"), ("up", "w3")):
            stacked = np.stack([t[f"{p}block_sparse_moe.experts.{e}.{hf}.weight"] for e in range(n_exp)])
            q(f"{b}ffn_{proj}_exps.weight", stacked)  # numpy (E, out, in) = ggml {in, out, E}
    f32("output_norm.weight", t["model.norm.weight"])
    q("output.weight", t["lm_head.weight"] if "lm_head.weight" in t else t["model.embed_tokens.weight"])

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)


def _run(gguf_path: Path, reps: int) -> None:
    import ctypes
    import random

    import llama_cpp as L

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(str(gguf_path).encode(), mp)
    if not model:
        raise SystemExit(f"llama.cpp could not load {gguf_path}")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    bos = L.llama_vocab_bos(vocab) if L.llama_vocab_get_add_bos(vocab) else None
    rng = random.Random(1)

    def rand_tok() -> int:
        return rng.randrange(n_vocab)

    def context(n_ctx: int) -> Any:
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, N_PROMPT, N_PROMPT, 1
        cp.n_threads, cp.n_threads_batch = 1, 1
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_AUTO
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            raise SystemExit("llama_init_from_model failed")
        return ctx

    def fill(batch: Any, toks: list[int], pos0: int) -> None:
        batch.n_tokens = len(toks)
        for i, tok in enumerate(toks):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos0 + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = int(i == len(toks) - 1)

    def decode(ctx: Any, batch: Any) -> None:
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise SystemExit(f"llama_decode returned {rc}")
        L.llama_synchronize(ctx)

    def prefill(ctx: Any, batch: Any) -> tuple[float, float]:
        toks = [bos if bos is not None else rand_tok()] + [rand_tok() for _ in range(N_PROMPT - 1)]
        fill(batch, toks, 0)
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        decode(ctx, batch)
        return (time.perf_counter_ns() - t0) * 1e-9, (time.thread_time_ns() - c0) * 1e-9

    def generate(ctx: Any, batch: Any, n: int) -> tuple[float, float]:
        tok = bos if bos is not None else rand_tok()
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for i in range(n):
            fill(batch, [tok], i)
            decode(ctx, batch)
            tok = rand_tok()
        return (time.perf_counter_ns() - t0) * 1e-9, (time.thread_time_ns() - c0) * 1e-9

    samples: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for test, n_ctx, n_tok in (("prefill", N_PROMPT, N_PROMPT), ("decode", N_GEN, N_GEN)):
        ctx = context(n_ctx)  # llama-bench: one context per test, n_ctx = n_prompt + n_gen
        batch = L.llama_batch_init(n_tok, 0, 1)
        mem = L.llama_get_memory(ctx)
        times = []
        for rep in range(-1, reps):  # rep -1: the warm-up (llama-bench: the whole prompt, one generated token)
            L.llama_memory_clear(mem, False)
            wall_cpu = prefill(ctx, batch) if test == "prefill" else generate(ctx, batch, N_GEN if rep >= 0 else 1)
            if rep >= 0:
                times.append(wall_cpu)
        samples[test] = [n_tok / wall for wall, _ in times]
        cpu[test] = [n_tok / c for _, c in times]
        L.llama_batch_free(batch)
        L.llama_free(ctx)

    desc = ctypes.create_string_buffer(256)
    L.llama_model_desc(model, desc, len(desc))
    n_params = int(L.llama_model_n_params(model))
    size = gguf_path.stat().st_size
    result = {
        "decode": statistics.median(samples["decode"]),
        "prefill": statistics.median(samples["prefill"]),
        "decode_cpu": statistics.median(cpu["decode"]),
        "prefill_cpu": statistics.median(cpu["prefill"]),
        "decode_samples": [round(x, 1) for x in samples["decode"]],
        "prefill_samples": [round(x, 1) for x in samples["prefill"]],
        "params": n_params,
        "gguf_bytes": size,
        "bits_per_weight": size * 8 / n_params,
        "model": desc.value.decode(errors="replace"),
        "llama_cpp_python": L.__version__,
        "system_info": L.llama_print_system_info().decode(errors="replace").strip(),
        "threads": 1,
    }
    L.llama_model_free(model)
    print(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_convert":
        _convert(Path(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_run":
        _run(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
