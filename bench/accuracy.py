"""Task accuracy of the demo model through the C runtime, per quantization, and against llama.cpp.

    .venv/bin/python bench/accuracy.py [--ckpt firmware_examples/models/adder] [--n 1000] [--llamacpp NAME]

For f32, f16, int8, int8c (also with float activations, GROUP_SIZE=64 and ATTN_QUANT=int16:1), int4 and int4c
exports (built for the host with SCons) it prints exact-match on the held-out problems (greedy decoding in C),
bits per weight (of the quantized matrices, and over all weights: norms, router and everything else counted),
and against the fp32 numpy reference: mean KL divergence and top-1 agreement of the logits at every answer
position (teacher-forced along the fp32 answer; 1,000 problems give about 4,500 positions). Q8_0 (llama.cpp's
format, numpy) is printed beside them.

--llamacpp NAME adds llama.cpp's own Q8_0, Q4_0 and Q4_K_M rows, from its logits of GGUF files made by
llama.cpp's converter and llama-quantize: first
    ../shared/peer/build_llamacpp.sh --convert CKPT NAME Q4_0 Q4_K_M
(which writes $PEER/gguf/NAME-{f32,q8_0,q4_0,q4_k_m}.gguf, PEER defaulting to /tmp/peer, and builds
$PEER/tools/logits); the rows of files that do not exist are reported as not run.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "firmware_examples/models"), str(ROOT / "tests")]

import adder_task  # noqa: E402

from colibri.codegen.checkpoint import open_checkpoint  # noqa: E402
from colibri.codegen.reference import Reference  # noqa: E402
from colibri.codegen.spec import canonical_names  # noqa: E402
from colibri.runtime import load  # noqa: E402
from colibri.toolchain.scons.layout import output_dirs  # noqa: E402

from q8_0 import Q8_0Weights  # noqa: E402

VARIANTS = (("f32", ()), ("f16", ()), ("int8", ()), ("int8c", ()),
            ("int8", ("ACTIVATIONS=float",)), ("int8c", ("ACTIVATIONS=float",)), ("int8c", ("GROUP_SIZE=64",)),
            ("int8c", ("ATTN_QUANT=int16:1",)),
            ("int4", ()), ("int4c", ()))
# llama.cpp's formats read from its own logits (--llamacpp): GGUF file suffix, nominal bits a weight
LLAMACPP = (("Q8_0", "q8_0", 8.5), ("Q4_0", "q4_0", 4.5), ("Q4_K_M", "q4_k_m", 4.85))
PEER = Path(os.environ.get("PEER", "/tmp/peer"))


def llamacpp_logits(gguf: Path, prompts: list[list[int]], answers: list[list[int]]) -> np.ndarray:
    """llama.cpp's logits along the given answers (the rows teacher_forced gives), from $PEER/tools/logits:
    one run per sequence over prompt + answer, all positions' logits (its file: n, vocab, n*vocab f32)."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "logits.bin"
        for p, a in zip(prompts, answers, strict=True):
            ids = [*p, *a]
            subprocess.run([str(PEER / "tools" / "logits"), str(gguf), str(dump), "0", *map(str, ids)],
                           check=True, capture_output=True)
            raw = dump.read_bytes()
            n, vocab = struct.unpack_from("<ii", raw)
            rows = np.frombuffer(raw, "<f4", n * vocab, 8).reshape(n, vocab)
            out.extend(rows[len(p) - 1:])
    return np.array(out)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def teacher_forced(forward, reset, prompts: list[list[int]], answers: list[list[int]]) -> np.ndarray:
    """Logits predicting each answer token (and the EOS after it), along the given answers."""
    out = []
    for p, a in zip(prompts, answers, strict=True):
        reset()
        logits = forward(p)
        out.append(logits)
        for tok in a:
            logits = forward([tok])
            out.append(logits)
    return np.array(out)


def greedy(m, prompt: list[int], max_new: int) -> list[int]:
    """Greedy answer ids (EOS included) from anything with forward/reset: the C model or the reference."""
    m.reset()
    logits = m.forward(prompt)
    ids: list[int] = []
    for _ in range(max_new):
        tok = int(np.argmax(logits))
        ids.append(tok)
        if tok == adder_task.EOS:
            break
        logits = m.forward([tok])
    return ids


def compare(base: np.ndarray, other: np.ndarray) -> tuple[float, float]:
    p, q = log_softmax(base), log_softmax(other)
    return float(np.mean(np.sum(np.exp(p) * (p - q), axis=-1))), float(np.mean(base.argmax(-1) == other.argmax(-1)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default=str(ROOT / "firmware_examples/models/adder"))
    ap.add_argument("--n", type=int, default=0, help="held-out problems (default: task.json's n_heldout)")
    ap.add_argument("--llamacpp", metavar="NAME", default=None,
                    help="add llama.cpp's Q8_0/Q4_0/Q4_K_M rows from $PEER/gguf/NAME-<quant>.gguf (see above)")
    a = ap.parse_args()
    ckpt = Path(a.ckpt)
    task = json.loads((ckpt / "task.json").read_text())
    n = a.n or task["n_heldout"]
    problems = adder_task.make_problems(task["heldout_seed"], n, task["max_digits"])
    prompts = [adder_task.encode_prompt(p) for p, _ in problems]
    c = open_checkpoint(ckpt)
    weights = {k: c.get(k) for k in canonical_names(c.spec)}
    ref = Reference(c.spec, weights)
    fp32_answers = []
    for p in prompts:
        ref.reset()
        logits = ref.forward(p)
        ids = []
        while len(ids) < task["max_new_tokens"] and (tok := int(np.argmax(logits))) != adder_task.EOS:
            ids.append(tok)
            logits = ref.forward([tok])
        fp32_answers.append(ids)
    base = teacher_forced(ref.forward, ref.reset, prompts, fp32_answers)
    ref_exact = np.mean([adder_task.decode_answer(ids) == want
                         for ids, (_, want) in zip(fp32_answers, problems, strict=True)])

    print(f"demo model {ckpt.name}: {n} held-out problems, max_digits {task['max_digits']}")
    print(f"{'variant':<20} {'bits/w':>7} {'all w':>7} {'exact':>7} {'mean KL':>10} {'top-1':>7}  runtime")
    print(f"{'fp32 reference':<20} {32.0:7.3f} {32.0:7.3f} {ref_exact:7.2%} {0.0:10.2e} {1.0:7.2%}  numpy"
          f" ({len(base)} positions)")
    quantized = [k for k in weights if not (k.endswith("norm") or k.endswith("moe.router"))]
    q8 = Reference(c.spec, Q8_0Weights(weights, set(quantized)))  # Q8_0 weights and activations, as llama.cpp
    q8_logits = teacher_forced(q8.forward, q8.reset, prompts, fp32_answers)
    q8_exact = np.mean([adder_task.decode_answer(greedy(q8, p, task["max_new_tokens"])) == want
                        for p, (_, want) in zip(prompts, problems, strict=True)])
    kl, top1 = compare(base, q8_logits)
    print(f"{'Q8_0 (llama.cpp)':<20} {8.5:7.3f} {'':>7} {q8_exact:7.2%} {kl:10.2e} {top1:7.2%}  numpy")
    for label, suffix, bits in LLAMACPP if a.llamacpp else ():
        gguf = PEER / "gguf" / f"{a.llamacpp}-{suffix}.gguf"
        if not gguf.is_file() or not (PEER / "tools" / "logits").is_file():
            print(f"{label + ' llama.cpp':<20} not run: no {gguf} (../shared/peer/build_llamacpp.sh --convert "
                  f"{ckpt} {a.llamacpp} Q4_0 Q4_K_M)")
            continue
        kl, top1 = compare(base, llamacpp_logits(gguf, prompts, fp32_answers))
        print(f"{label + ' llama.cpp':<20} {bits:7.3f} {'':>7} {'':>7} {kl:10.2e} {top1:7.2%}  llama.cpp (own logits)")

    build = ROOT / "build" / "accuracy"
    for quant, extra in VARIANTS:
        label = quant + ("".join(f" {e.split('=')[0].lower()[:3]}={e.split('=')[1]}" for e in extra))
        broot = build / (quant + "".join(e.replace("=", "") for e in extra))
        t0 = time.perf_counter()
        res = subprocess.run([str(Path(sys.executable).parent / "scons"), "-C", str(ROOT), "-Q", "-j2",
                              f"BUILD={broot}", f"MODEL={ckpt.absolute()}", f"QUANT={quant}", *extra], check=True,
                             capture_output=True, text=True)
        out = output_dirs(res.stdout)["host"]
        manifest = json.loads((out / "manifest.json").read_text())
        rows = [t for t in manifest["tensors"] if t["name"] in quantized]
        bits = sum(t["payload_bits"] for t in rows) / sum(int(np.prod(t["shape"])) for t in rows)
        every = manifest["tensors"]
        all_bits = sum(t["payload_bits"] for t in every) / sum(int(np.prod(t["shape"])) for t in every)
        m = load(out / f"libcolibri_{out.name}.so")
        exact = np.mean([adder_task.decode_answer(greedy(m, p, task["max_new_tokens"])) == want
                         for p, (_, want) in zip(prompts, problems, strict=True)])
        kl, top1 = compare(base, teacher_forced(m.forward, m.reset, prompts, fp32_answers))
        print(f"{label:<20} {bits:7.3f} {all_bits:7.3f} {exact:7.2%} {kl:10.2e} {top1:7.2%}  "
              f"C ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
