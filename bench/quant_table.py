"""Quantization table for any checkpoint: colibri's formats against llama.cpp's, by KL to the f32 logits.

    .venv/bin/python bench/quant_table.py CKPT [--llamacpp NAME] [--seqs 96] [--len 16] [--by-class int8c]

Every position of SEQS random sequences of LEN token ids (seed 0; 96 x 16 = 1,536 positions) is scored:
mean KL divergence of each variant's next-token distribution from the f32 one, and top-1 agreement.
colibri's variants (f32, f16, int8, int8c, int4, int4c; int8c with float activations, int8c with
--attn-quant f16: the embedding and attention matrices in f16, the experts and lm_head int8c, the same with
--attn-quant f16:1: the embedding and the first layer's attention f16, and int4c with --attn-quant int8c;
int4 and int4c keep V 8-bit, as the exporter does) run in the
numpy reference on the exporter's own quantized weights, with the integer activations the runtime's
matmuls use (the reference's q8 hook: int8 blocks of 32, corrections times the float input), which is
what the C runtime computes (tests/test_cross.py holds the two together). bits/w counts every weight of
the checkpoint: norms, router and everything else kept in f32 included. The "calib" rows are calibrated as
`colibri export --calib` calibrates (scale migration folded into the weights, int4 searches weighted), on
--calib-seqs sequences of seed 1; their format and corrections are the uncalibrated rows', so is their speed.

Read the mean KL with its two neighbours. In an MoE the mean is carried by the positions where
quantization flips a router's choice in some layer (int8 on the three checkpoints of
bench/hf_checkpoints.py: 16-53% of the positions carry 86-87% of it), and which near-ties flip is
chance: the same int8 quantization with every scale 0.3% larger (the row "int8 scales x1.003",
--jitter) moves the mean KL by 1-14% there. "median KL" is the typical position's, which follows the
weight error; "flips" (colibri's rows: the numpy reference records its routing) is the share of
positions whose experts differ from f32's in any layer, and "KL w/o flip" the mean over the others.

--by-class QUANT adds, for each kind of matrix (attn.q, moe.experts.#.up, embed, ...: every layer's and
expert's of that kind) and then for each layer (all its matrices), two rows with only those matrices in QUANT
and every other weight f32: with integer activations where the runtime uses them ("int") and with float ones
("float"). They say where a quantization's KL comes from, and whether its weights or its activations carry it
(the mean KL of the rows does not add up to the full quantization's: a routing flip is all or nothing).

--llamacpp NAME adds llama.cpp's Q8_0, Q4_0 and Q4_K_M rows from its own logits of
$PEER/gguf/NAME-{f32,q8_0,q4_0,q4_k_m}.gguf (PEER defaults to /tmp/peer), made by
    ../shared/peer/build_llamacpp.sh --convert CKPT NAME Q4_0 Q4_K_M
and read with $PEER/tools/logits (or --logits-tool PATH: the logits.c of that script, compiled), with an
f32 K/V cache (LOGITS_EXACT=1), as colibri's. Their bits/w is the GGUF's tensor bytes over all weights.
--speed R adds decode tok/s, 1 thread, 128 tokens from a one-token prompt: every colibri variant built for
`host` with SCons (QUANT=, ATTN_QUANT=, ACTIVATIONS=float as the row says; into --work) and run as
`colibri_demo --generate 128`, and llama.cpp's GGUFs run by its own `llama-bench -p 512 -n 128 -t 1` (its tg128)
(PEER/llama.cpp/build/bin), interleaved over R rounds (the order alternating), median [min-max], with the
load average before and after. A figure taken while anything else runs on the machine is not a figure.
The checkpoints of the table: bench/hf_checkpoints.py (transformers: plain, heavy-tailed, outlier channels).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from colibri.codegen.checkpoint import open_checkpoint  # noqa: E402
from colibri.codegen.errors import ExportError  # noqa: E402
from colibri.codegen.layout import is_q8  # noqa: E402
from colibri.codegen.quantize import QUANTS, QuantTensor, default_outlier_frac  # noqa: E402
from colibri.codegen.reference import Reference, quantize_q8  # noqa: E402
from colibri.codegen.spec import canonical_names  # noqa: E402
from colibri.codegen.stream import quantize_tensor, tensor_quant  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402  (bench/speed.py: its builds and runs)
from speed import DECODE, ROOT  # noqa: E402

PEER = Path(os.environ.get("PEER", "/tmp/peer"))
LABEL_WIDTH = 27  # the table's first column: "colibri int4c attn=int8c calib"
LLAMACPP = (("f32", "f32"), ("Q8_0", "q8_0"), ("Q4_0", "q4_0"), ("Q4_K_M", "q4_k_m"))
# (label, quant, group_size, integer activations, attn_quant)
VARIANTS = (("f32", "f32", 0, False, None), ("f16", "f16", 0, False, None), ("int8", "int8", 0, True, None),
            ("int8c", "int8c", 0, True, None), ("int8c act=float", "int8c", 0, False, None),
            ("int8c attn=f16", "int8c", 0, True, "f16"), ("int8c attn=f16:1", "int8c", 0, True, "f16:1"),
            ("int8c attn=int16:1", "int8c", 0, True, "int16:1"),
            ("int4", "int4", 0, True, None), ("int4c", "int4c", 0, True, None),
            ("int4c attn=int8c", "int4c", 0, True, "int8c"))
# the same, calibrated as `colibri export --calib` calibrates (codegen/smooth.py, codegen/calibrate.py) on
# --calib-seqs sequences of seed 1, which the table's sequences (seed 0) do not hold
CALIB_VARIANTS = (("int8c calib", "int8c", None), ("int4c calib", "int4c", None),
                  ("int4c attn=int8c calib", "int4c", "int8c"))


class QuantWeights(dict):
    """Canonical name -> the float32 weights a quantization computes with, for Reference, with its q8 and
    corrections hooks: which matrices take integer activations and their sparse corrections."""

    def __init__(self, weights: dict[str, np.ndarray], quantizer: Callable[[str, np.ndarray], QuantTensor],
                 int_activations: bool = True,
                 activations: Callable[[np.ndarray], np.ndarray] = quantize_q8) -> None:
        super().__init__()
        self._q8: set[str] = set()
        self._q16: set[str] = set()
        self._corr: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.bits = 0
        self.quantize_activations = activations
        for name, w in weights.items():
            qt = quantizer(name, w)
            self.bits += qt.payload_bits()
            self[name] = qt.dequantize().reshape(w.shape)
            if int_activations and name != "embed" and is_q8(qt.dtype, qt.cols, qt.group_size):
                self._q8.add(name)
            if int_activations and name != "embed" and qt.dtype == "int16":
                self._q16.add(name)
            if qt.n_outliers:
                self._corr[name] = (qt.oidx.astype(np.int64), qt.oval.astype(np.float32))

    def q8(self, name: str) -> bool:
        return name in self._q8

    def q16(self, name: str) -> bool:
        return name in self._q16

    def corrections(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        return self._corr.get(name)


def exporter_quantizer(quant: str, group_size: int = 0, attn_quant: str | None = None, calib=None
                       ) -> Callable[[str, np.ndarray], QuantTensor]:
    """The exporter's quantization of each tensor (stream.tensor_quant decides which stay f32)."""
    def q(name: str, w: np.ndarray) -> QuantTensor:
        return quantize_tensor({name: w}, name, quant, group_size, default_outlier_frac(quant), attn_quant,
                               calib).qt
    return q


def only(quantizer: Callable[[str, np.ndarray], QuantTensor], members: set[str]
         ) -> Callable[[str, np.ndarray], QuantTensor]:
    """`quantizer` for the tensors in members, f32 for every other."""
    keep = exporter_quantizer("f32")
    return lambda name, w: (quantizer if name in members else keep)(name, w)


def tensor_groups(names: list[str], quant: str) -> dict[str, set[str]]:
    """The matrices an export with `quant` quantizes, grouped by kind (their layer and expert numbers as #:
    "attn.q", "moe.experts.#.up", "embed") and then by layer ("layer 0": all of layer 0's): the --by-class
    rows."""
    matrices = [n for n in names if tensor_quant(n, quant) != "f32"]
    kinds: dict[str, set[str]] = {}
    layers: dict[str, set[str]] = {}
    for n in matrices:
        kinds.setdefault(re.sub(r"^layers\.#\.", "", re.sub(r"(?<=\.)\d+(?=\.)", "#", n)), set()).add(n)
        m = re.match(r"layers\.(\d+)\.", n)
        if m:
            layers.setdefault(f"layer {m.group(1)}", set()).add(n)
    return {**kinds, **dict(sorted(layers.items(), key=lambda kv: int(kv[0].split()[1])))}


def calibrated(spec, weights: dict[str, np.ndarray], quant: str, attn_quant: str | None, seqs: np.ndarray,
               max_seq: int) -> tuple[dict[str, np.ndarray], Callable[[str, np.ndarray], QuantTensor]]:
    """The weights with the export's scale migration folded in, and its calibrated quantizer."""
    from colibri.codegen import export

    opts = export.ExportOptions(quant=quant, attn_quant=attn_quant, outlier_frac=default_outlier_frac(quant))
    source, calib, _ = export.calibrated(weights, spec, opts, seqs.tolist(), max_seq)
    return {n: source.get(n) for n in weights}, exporter_quantizer(quant, 0, attn_quant, calib)


def jittered(quantizer: Callable[[str, np.ndarray], QuantTensor], factor: float
             ) -> Callable[[str, np.ndarray], QuantTensor]:
    """The int8 quantizer with every scale times `factor`, the values rounded again: the same format and
    error statistics, another draw of which weights round which way (the table's noise floor)."""
    def q(name: str, w: np.ndarray) -> QuantTensor:
        qt = quantizer(name, w)
        if qt.dtype != "int8" or qt.scales is None:
            return qt
        s = (qt.scales.astype(np.float32) * np.float32(factor)).astype(qt.scales.dtype)  # stored as before
        full = np.repeat(s.astype(np.float32), qt.group_size, axis=1)[:, :qt.cols]
        qt.scales = s
        qt.data = np.clip(np.rint(w.reshape(qt.rows, qt.cols) / full), -127, 127).astype(np.int8)
        return qt
    return q


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kl_each(base: np.ndarray, other: np.ndarray) -> np.ndarray:
    """KL(base || other) at each position."""
    p, q = log_softmax(base), log_softmax(other)
    return np.sum(np.exp(p) * (p - q), axis=-1)


def sequences(vocab: int, n: int, length: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=(n, length))


def stepwise(ref: Reference, seqs: np.ndarray, routes: list[tuple] | None = None) -> np.ndarray:
    """Logits at every position of every sequence, one token at a time; with `routes`, each position's
    chosen experts of every MoE layer appended to it."""
    out = []
    for s in seqs:
        ref.reset()
        for t in s:
            out.append(ref.forward([int(t)]))
            if routes is not None:
                routes.append(tuple(tuple(sorted(np.asarray(r).ravel().tolist())) for r in ref.routing))
    return np.array(out, dtype=np.float32)


def row(label: str, bits: float, base: np.ndarray, logits: np.ndarray, flips: np.ndarray | None = None) -> str:
    """One line of the table; flips: whether each position's routing differs from f32's."""
    kl = kl_each(base, logits)
    top1 = float(np.mean(base.argmax(-1) == logits.argmax(-1)))
    tail = ("      —           —" if flips is None else
            f" {np.mean(flips):6.1%} {np.mean(kl[~flips]) if (~flips).any() else 0.0:11.3e}")
    return f"{label:<{LABEL_WIDTH}} {bits:7.3f} {np.mean(kl):10.3e} {np.median(kl):10.3e} {top1:7.2%}{tail}"


def llamacpp_logits(tool: Path, gguf: Path, seqs: np.ndarray) -> np.ndarray:
    """llama.cpp's logits at every position of each sequence (one run per sequence, f32 K/V cache)."""
    out = []
    env = {**os.environ, "LOGITS_EXACT": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "logits.bin"
        for s in seqs:
            subprocess.run([str(tool), str(gguf), str(dump), "0", *map(str, s.tolist())], check=True,
                           capture_output=True, env=env)
            raw = dump.read_bytes()
            n, vocab = struct.unpack_from("<ii", raw)
            out.extend(np.frombuffer(raw, "<f4", n * vocab, 8).reshape(n, vocab))
    return np.array(out, dtype=np.float32)


def gguf_tensor_bytes(path: Path) -> int:
    """Bytes of a GGUF file's tensor data (the file from its aligned data section on)."""
    raw = path.read_bytes()
    magic, version, n_tensors, n_kv = struct.unpack_from("<IIQQ", raw, 0)
    if magic != 0x46554747 or version < 2:
        raise ValueError(f"{path}: not a GGUF v2+ file")
    off = 24
    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    align = 32

    def skip_value(t: int, off: int) -> int:
        if t in scalar:
            return off + scalar[t]
        if t == 8:  # string
            return off + 8 + struct.unpack_from("<Q", raw, off)[0]
        if t == 9:  # array: type, count, values
            et, count = struct.unpack_from("<IQ", raw, off)
            off += 12
            if et in scalar:
                return off + scalar[et] * count
            for _ in range(count):
                off = skip_value(et, off)
            return off
        raise ValueError(f"{path}: unknown GGUF value type {t}")

    for _ in range(n_kv):
        klen = struct.unpack_from("<Q", raw, off)[0]
        key = raw[off + 8: off + 8 + klen].decode()
        off += 8 + klen
        t = struct.unpack_from("<I", raw, off)[0]
        off += 4
        if key == "general.alignment":
            align = struct.unpack_from("<I", raw, off)[0]
        off = skip_value(t, off)
    for _ in range(n_tensors):
        nlen = struct.unpack_from("<Q", raw, off)[0]
        off += 8 + nlen
        ndim = struct.unpack_from("<I", raw, off)[0]
        off += 4 + 8 * ndim + 4 + 8
    data = -(-off // align) * align
    return len(raw) - data


def build_variant(work: Path, ckpt: Path, quant: str, int_act: bool, attn: str | None) -> Path:
    """colibri_demo of one variant, built for host by SCons (bench/speed.py's build)."""
    extra = (*([f"ATTN_QUANT={attn}"] if attn else []),
             *([] if int_act or quant not in ("int8", "int8c") else ["ACTIVATIONS=float"]))
    return speed.build(work, ckpt, ["host"], quant, extra)["host"] / "colibri_demo"


def colibri_decode(demo: Path) -> float:
    return float(speed.demo_run(demo, [1], DECODE, 1)["tok/s"])


def llama_decode(gguf: Path) -> float:
    return speed.llama_sample(PEER / "llama.cpp" / "build" / "bin" / "llama-bench", gguf, 1)["decode"]


def speed_table(runs: dict[str, Callable[[], float]], rounds: int) -> None:
    """Decode tok/s of every row, interleaved round by round."""
    print(f"decode tok/s, 1 thread, tg{DECODE}, {rounds} interleaved rounds; load average {os.getloadavg()[0]:.2f}")
    got: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(rounds):
        for label in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            got[label].append(runs[label]())
    for label, xs in got.items():
        print(f"{label:<{LABEL_WIDTH}} {statistics.median(xs):9.1f} [{min(xs):.1f}-{max(xs):.1f}]")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("--seqs", type=int, default=96)
    ap.add_argument("--len", type=int, default=16, dest="length")
    ap.add_argument("--llamacpp", metavar="NAME", default=None)
    ap.add_argument("--logits-tool", type=Path, default=PEER / "tools" / "logits")
    ap.add_argument("--speed", type=int, default=0, metavar="ROUNDS", help="decode tok/s over ROUNDS rounds")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "quant_table", help="--speed's builds")
    ap.add_argument("--calib-seqs", type=int, default=64, help="calibration sequences of the calibrated rows "
                    "(seed 1, --len tokens each; 0: no such rows)")
    ap.add_argument("--jitter", type=float, default=0.003,
                    help="the noise-floor row: int8 with every scale times 1 + JITTER (0: no such row)")
    ap.add_argument("--by-class", metavar="QUANT", default=None, choices=QUANTS,
                    help="also a row per kind of matrix and per layer with only those in QUANT (int8c, ...), "
                         "the rest f32: where the KL comes from")
    a = ap.parse_args()
    c = open_checkpoint(a.ckpt)
    spec = c.spec
    weights = {n: np.asarray(c.get(n), dtype=np.float32) for n in canonical_names(spec)}
    n_weights = sum(w.size for w in weights.values())
    seqs = sequences(spec.vocab, a.seqs, a.length)
    max_seq = a.length + 1
    t0 = time.perf_counter()
    base_routes: list[tuple] = []
    base = stepwise(Reference(spec, weights, max_seq=max_seq), seqs, base_routes)
    print(f"checkpoint {a.ckpt}: {n_weights:,} weights, {len(base)} positions ({a.seqs} x {a.length}); "
          "decode tok/s: bench/speed.py")
    print(f"{'variant':<{LABEL_WIDTH}} {'bits/w':>7} {'mean KL':>10} {'median KL':>10} {'top-1':>7} {'flips':>6} "
          f"{'KL w/o flip':>11}")

    def measure(label: str, source: dict[str, np.ndarray], quantizer: Callable[[str, np.ndarray], QuantTensor],
                int_act: bool = True) -> None:
        """One row: the reference run on `source` as quantizer quantizes it (f32: the base logits)."""
        qw = QuantWeights(source, quantizer, int_activations=int_act)
        routes: list[tuple] = []
        logits = base if label == "colibri f32" else stepwise(Reference(spec, qw, max_seq=max_seq), seqs, routes)
        flips = np.array([x != y for x, y in zip(base_routes, routes or base_routes, strict=True)])
        print(row(label, qw.bits / n_weights, base, logits, flips), flush=True)

    jitter = (("int8 scales x%.3f" % (1 + a.jitter), "int8", 0, True, None),) if a.jitter else ()
    for label, quant, g, int_act, attn in VARIANTS + jitter:
        quantizer = exporter_quantizer(quant, g, attn)
        if label.startswith("int8 scales"):
            quantizer = jittered(quantizer, 1 + a.jitter)
        measure("colibri " + label, weights, quantizer, int_act)
    if a.by_class:
        print(f"only some matrices in {a.by_class}, the rest f32 (activations: int = integer where the runtime "
              "makes them so, float = float)")
        for group, members in tensor_groups(list(weights), a.by_class).items():
            for act, int_act in (("int", True), ("float", False)):
                measure(f"{group} {act}", weights, only(exporter_quantizer(a.by_class), members), int_act)
    cal_seqs = sequences(spec.vocab, a.calib_seqs, a.length, seed=1)
    for label, quant, attn in CALIB_VARIANTS if a.calib_seqs else ():
        smoothed, quantizer = calibrated(spec, weights, quant, attn, cal_seqs, max_seq)
        measure("colibri " + label, smoothed, quantizer)
    for label, suffix in LLAMACPP if a.llamacpp else ():
        gguf = PEER / "gguf" / f"{a.llamacpp}-{suffix}.gguf"
        if not gguf.is_file() or not a.logits_tool.is_file():
            print(f"{'llama.cpp ' + label:<{LABEL_WIDTH}} not run: no {gguf if not gguf.is_file() else a.logits_tool}")
            continue
        bits = 8 * gguf_tensor_bytes(gguf) / n_weights
        print(row("llama.cpp " + label, bits, base, llamacpp_logits(a.logits_tool, gguf, seqs)), flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")
    if a.speed:
        runs: dict[str, Callable[[], float]] = {}
        for label, quant, _g, int_act, attn in VARIANTS:
            demo = build_variant(a.work, a.ckpt.resolve(), quant, int_act, attn)
            runs["colibri " + label] = lambda demo=demo: colibri_decode(demo)
        for label, suffix in LLAMACPP if a.llamacpp else ():
            gguf = PEER / "gguf" / f"{a.llamacpp}-{suffix}.gguf"
            if gguf.is_file():
                runs["llama.cpp " + label] = lambda gguf=gguf: llama_decode(gguf)
        speed_table(runs, a.speed)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ExportError as e:  # a checkpoint that cannot be read: one line naming the file
        print(e, file=sys.stderr)
        sys.exit(2)
