"""Per family: parameters, blob and arena bytes, and host decode speed against llama.cpp, at ~300M weights.

    .venv/bin/python bench/families.py [--arch mixtral,llama,...] [--rounds 3] [--no-speed] [--llamacpp]
                                       [--peer DIR] [--work DIR] [--keep] [--prepare]

For each family `colibri synth` writes a ~300M-weight bf16 instance (MoE families: hidden 1024, ffn 1024 per
expert, 8 layers, 8 experts top-2, 8/2 heads, bench/speed.py's 288M shape but for the vocabulary; dense
families: hidden 1024, ffn 2816, 22 layers, 8/2 heads; vocabulary 50257, GPT-2's, since llama.cpp's converter
takes only a BPE tokenizer it recognises for six of the families, see GPT2_FAMILIES), exports it int8c with a
KV cache of 4096 positions and prints: weights in total and active per token (the blob's matrices, the experts' at
top_k/n_experts, the embedding's one row not counted as active), the blob's bytes, the arena's bytes (the
export's "arena N bytes planned" line, which also says what the KV cache takes).

Unless --no-speed: host decode tok/s (`colibri_demo`, one-token prompt, 128 tokens, 1 thread), and with
--llamacpp llama.cpp's `llama-bench -p 0 -n 128 -t 1` on the Q8_0 GGUF its official converter makes of the
same checkpoint (`../shared/peer/build_llamacpp.sh --convert`; a family the converter or llama.cpp does not
take is reported as such, with the converter's last line). colibri and llama-bench alternate round by
round; medians and spreads over --rounds; the CPU and the load average before and after are printed: a
figure taken while anything else runs on the machine is not a figure.

A family is prepared in WORK/FAMILY: synth, export (for the sizes), host build of the demo, GGUF; then only
what the timing needs stays there (the demo binary, which has the blob compiled in, and the Q8_0 GGUF) and a
`prepared` file (JSON) records the sizes and those two paths; the checkpoint, the export and the build's
object files are deleted. A family is refused before it starts, naming WORK and the bytes, when the disk has
less free space than it needs (PEAK_BYTES_PER_WEIGHT). --prepare prepares every family and times nothing, so
that it can run while the machine is busy; a later run (same --work, no --prepare) finds each `prepared` file
and only times, building nothing. Without --keep a family's directory is deleted after its row.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from speed import BIN, PEER_SCRIPT, ROOT, cpu_flags, cpu_model, demo_run, loadavg  # noqa: E402

from colibri.codegen import format as fmt  # noqa: E402
from colibri.codegen.synth import ARCHES, DENSE_ARCHES, synth_checkpoint  # noqa: E402
from colibri.toolchain.scons.layout import output_dirs  # noqa: E402

MAX_SEQ = 4096
DECODE = 128
VOCAB = 50257  # GPT-2's: the size of the one BPE vocabulary llama.cpp ships that its converter recognises
MOE_SHAPE = dict(layers=8, hidden=1024, ffn=1024, heads=8, kv_heads=2, experts=8, top_k=2, vocab=VOCAB)
DENSE_SHAPE = dict(layers=22, hidden=1024, ffn=2816, heads=8, kv_heads=2, experts=1, top_k=1, vocab=VOCAB)
# per family, the real models' layout where llama.cpp takes no other: OLMoE without GQA (its loader sizes k_norm
# at n_embd: models/olmoe.cpp), DeepSeek-V2 with a q latent (it reads V2 without one only at V2-Lite's 26 or 27
# layers: models/deepseek2.cpp), gpt-oss with its 128-position sliding window (the converter writes the window
# as an integer)
FAMILY_SHAPE: dict[str, dict[str, int]] = {"olmoe": dict(kv_heads=8), "deepseek-v2": dict(q_lora_rank=512),
                                           "gpt-oss": dict(sliding_window=128)}
EXPERT_KINDS = ("W_GATE", "W_DOWN", "W_UP")
NOT_WEIGHTS = ("ROPE_FREQ", "TOKENIZER", "PARAMS")  # derived tensors and sections
# families whose llama.cpp converter reads only a GPT-2-style BPE tokenizer (TextModel._set_vocab_gpt2), and that
# one only when the hash of its encoding of a test text is one it knows (get_vocab_base_pre): a synthetic
# checkpoint has no tokenizer, the SentencePiece one build_llamacpp.sh adds is not read (transformers hands it to
# Qwen2Tokenizer as vocab.json: "UnicodeDecodeError ... byte 0x80"), so these get GPT-2's, rebuilt from the
# vocabulary file llama.cpp ships for its own tests
GPT2_FAMILIES = ("qwen2_moe", "qwen3_moe", "olmoe", "deepseek-v2", "deepseek-v3", "gpt-oss")
GPT2_VOCAB = Path("llama.cpp") / "models" / "ggml-vocab-gpt-2.gguf"  # under the peer directory
GPT2_TOKENIZER = r"""
import json, sys
from gguf import GGUFReader
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
fields = GGUFReader(src).fields
def strings(key):
    f = fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
tokens = strings("tokenizer.ggml.tokens")
if len(tokens) != n:
    sys.exit(f"{src}: {len(tokens)} tokens, the model has {n}")
tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                          merges=[tuple(m.split(" ")) for m in strings("tokenizer.ggml.merges")]))
tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
tk.decoder = decoders.ByteLevel()
tk.save(out + "/tokenizer.json")
with open(out + "/tokenizer_config.json", "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f)
"""
# disk a family needs at its peak, per weight: bf16 checkpoint 2, then export + build (blob, object, binary) ~5,
# or the f32 and Q8_0 GGUFs 4 + 1.1 beside the checkpoint and the demo; and a margin
PEAK_BYTES_PER_WEIGHT = 9
DISK_MARGIN = 1 << 30


class Refused(Exception):
    """A family that cannot start: one line for stderr."""


def weights_upper_bound(shape: dict[str, int]) -> int:
    """More weights than the family's instance of this shape has (embedding and lm_head, attention, every expert
    and up to a 2*ffn shared expert per layer)."""
    h, f = shape["hidden"], shape["ffn"]
    return 2 * shape["vocab"] * h + shape["layers"] * (4 * h * h + 3 * h * f * (shape["experts"] + 2))


def check_disk(work: Path, need: int) -> None:
    free = shutil.disk_usage(work).free
    if free < need:
        raise Refused(f"{work}: {free:,} bytes free, a family needs {need:,}; free some space first")


def weights(blob: Path) -> tuple[int, float]:
    """(weights in the blob's matrices and vectors, weights one decoded token reads: experts at top_k/n_experts,
    one row of the embedding)."""
    data = blob.read_bytes()
    h = fmt.read_header(data[:fmt.HEADER_BYTES])
    experts = {fmt.KIND[k].code for k in EXPERT_KINDS}
    skip = {fmt.KIND[k].code for k in NOT_WEIGHTS if k in fmt.KIND}
    total, active = 0, 0.0
    for i in range(h["n_tensors"]):
        e = fmt.entry(data, i)
        if e["kind"] in skip:
            continue
        n = e["rows"] * e["cols"]
        total += n
        if e["kind"] == fmt.KIND["EMBED"].code:
            active += e["cols"]
        else:
            active += n * (h["top_k"] / h["n_experts"] if e["kind"] in experts else 1.0)
    return total, active


def export(ckpt: Path, out: Path) -> str:
    res = subprocess.run([str(BIN / "colibri"), "export", str(ckpt), "-o", str(out), "--max-seq", str(MAX_SEQ),
                          "--no-predict"], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"colibri export {ckpt}: {res.stderr.strip()}")
    line = next((x.strip() for x in res.stdout.splitlines() if x.strip().startswith("arena ")), "arena ?")
    return line.removeprefix("arena ").replace(" bytes planned", " B").replace(f" for max_seq {MAX_SEQ}", "")


def build_demo(work: Path, ckpt: Path) -> Path:
    argv = [str(BIN / "scons"), "-C", str(ROOT), "-Q", "-j2", f"BUILD={work / 'b'}", f"MODEL={ckpt}", "TARGET=host",
            f"MAX_SEQ={DECODE + 8}"]
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return output_dirs(res.stdout)["host"] / "colibri_demo"


def add_gpt2_tokenizer(ckpt: Path, peer: Path, vocab: int) -> str:
    """Write GPT-2's tokenizer.json (and a tokenizer_config.json naming the fast class) into ckpt; '' or why not."""
    res = subprocess.run([str(peer / "venv" / "bin" / "python"), "-c", GPT2_TOKENIZER, str(peer / GPT2_VOCAB),
                          str(ckpt), str(vocab)], capture_output=True, text=True)
    return "" if res.returncode == 0 else (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]


def converter_reason(res: subprocess.CompletedProcess) -> str:
    """The last line of the converter's log (its exception), else the script's own last line."""
    text = (res.stderr.strip() or res.stdout.strip())
    if m := re.search(r"failed: (\S+\.log)", text):
        lines = [x for x in Path(m.group(1)).read_text(errors="replace").splitlines() if x.strip()]
        if lines:
            return f"{lines[-1].strip()} ({m.group(1)})"
    last = text.splitlines()
    return last[-1] if last else f"exit {res.returncode}"


def gguf_of(ckpt: Path, name: str, peer: Path, dest: Path) -> tuple[Path | None, str]:
    """The Q8_0 GGUF of ckpt, made by the official converter and moved to dest (the peer's f32 file and its
    hard-linked copy of the checkpoint are deleted); (None, why) when the converter does not take it."""
    res = subprocess.run(["bash", str(PEER_SCRIPT), "--convert", str(ckpt), name], capture_output=True, text=True,
                         env={**os.environ, "PEER": str(peer)})
    made = peer / "gguf" / f"{name}-q8_0.gguf"
    (peer / "gguf" / f"{name}-f32.gguf").unlink(missing_ok=True)  # only the Q8_0 file is measured
    shutil.rmtree(peer / "ckpt" / f"{name}_tok", ignore_errors=True)
    if res.returncode != 0 or not made.is_file():
        made.unlink(missing_ok=True)
        return None, converter_reason(res)
    shutil.move(made, dest)
    return dest, ""


def llama_decode(bench: Path, gguf: Path) -> float | str:
    res = subprocess.run([str(bench), "-m", str(gguf), "-t", "1", "-p", "0", "-n", str(DECODE), "-r", "1", "-o",
                          "csv"], capture_output=True, text=True)
    if res.returncode != 0:
        return f"llama-bench failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}"
    rows = [r for r in res.stdout.splitlines() if r.strip()]
    head = next(r for r in rows if "avg_ts" in r).split(",")
    data = rows[-1].split(",")
    return float(data[head.index("avg_ts")].strip('"'))


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):,.1f} [{min(xs):,.1f}–{max(xs):,.1f}]"


def prepare(arch: str, fam: Path, peer: Path, *, build: bool, llamacpp: bool) -> dict[str, object]:
    """Make a family's files and keep only what the timing needs; returns (and writes to fam/prepared) the record:
    sizes, the demo binary and the GGUF (or why there is none)."""
    shape = {**(DENSE_SHAPE if arch in DENSE_ARCHES else MOE_SHAPE), **FAMILY_SHAPE.get(arch, {})}
    check_disk(fam.parent, weights_upper_bound(shape) * PEAK_BYTES_PER_WEIGHT + DISK_MARGIN)
    shutil.rmtree(fam, ignore_errors=True)
    ckpt = fam / f"fam300m_{arch.replace('-', '_')}"
    synth_checkpoint(ckpt, arch=arch, seed=7, dtype="bf16", **shape)
    arena = export(ckpt, fam / "export")
    blob = fam / "export" / "model.bin"
    total, active = weights(blob)
    rec: dict[str, object] = {"arch": arch, "weights": total, "active": active, "blob_bytes": blob.stat().st_size,
                              "arena": arena, "demo": None, "gguf": None, "llamacpp": "not run (--llamacpp)"}
    shutil.rmtree(fam / "export")
    if build:
        demo = fam / "colibri_demo"
        shutil.copy2(build_demo(fam, ckpt), demo)  # the blob is compiled in: the binary is all the timing runs
        shutil.rmtree(fam / "b")
        rec["demo"] = str(demo)
        if llamacpp:
            why = add_gpt2_tokenizer(ckpt, peer, shape["vocab"]) if arch in GPT2_FAMILIES else ""
            gguf, why = gguf_of(ckpt, ckpt.name, peer, fam / f"{ckpt.name}-q8_0.gguf") if not why else (None, why)
            rec["gguf"], rec["llamacpp"] = (str(gguf) if gguf else None), why
    shutil.rmtree(ckpt)
    tmp = fam / "prepared.tmp"
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    tmp.replace(fam / "prepared")
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default=",".join(ARCHES), help=f"families (default: all: {', '.join(ARCHES)})")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-speed", action="store_true", help="sizes only")
    ap.add_argument("--llamacpp", action="store_true", help="llama-bench on the converted Q8_0 GGUF")
    ap.add_argument("--peer", default=os.environ.get("PEER", "/tmp/peer"))
    ap.add_argument("--work", default=str(ROOT / "build" / "families"))
    ap.add_argument("--keep", action="store_true", help="keep each family's prepared files (demo binary, GGUF)")
    ap.add_argument("--prepare", action="store_true",
                    help="prepare every family (with --llamacpp, the GGUF too) and keep the files; time nothing")
    a = ap.parse_args()
    a.keep = a.keep or a.prepare
    archs = [x for x in a.arch.split(",") if x]
    if bad := [x for x in archs if x not in ARCHES]:
        ap.error(f"unknown family {', '.join(bad)} (known: {', '.join(ARCHES)})")
    peer, work = Path(a.peer), Path(a.work)
    bench = peer / "llama.cpp" / "build" / "bin" / "llama-bench"
    if a.llamacpp and not bench.is_file():
        ap.error(f"{bench} missing: run ../shared/peer/build_llamacpp.sh first")
    work.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {cpu_model()} ({cpu_flags()}), {os.cpu_count()} cores; load average before: {loadavg()}")
    print(f"int8c, KV cache of {MAX_SEQ} positions; decode: 1 thread, {DECODE} tokens from a one-token prompt")
    print("| family | weights | active/token | blob (int8c) | arena | colibri tok/s | llama.cpp Q8_0 tok/s | ratio |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for arch in archs:
        fam = work / arch
        done = fam / "prepared"
        try:
            rec = json.loads(done.read_text()) if done.is_file() else \
                prepare(arch, fam, peer, build=not a.no_speed, llamacpp=a.llamacpp)
        except Refused as e:
            print(f"families: {e}", file=sys.stderr)
            return 2
        row = [arch, f"{rec['weights'] / 1e6:,.1f} M", f"{rec['active'] / 1e6:,.1f} M", f"{rec['blob_bytes']:,} B",
               str(rec["arena"])]
        gguf = Path(rec["gguf"]) if a.llamacpp and rec["gguf"] else None
        why = str(rec["llamacpp"]) if a.llamacpp else "not run (--llamacpp)"
        if a.prepare:
            row += ["prepared", str(gguf) if gguf else why, ""]
        elif a.no_speed or not rec["demo"]:
            row += ["", "", ""]
        else:
            demo = Path(rec["demo"])
            ours, theirs = [], []
            for r in range(a.rounds):
                order = ("c", "l") if r % 2 == 0 else ("l", "c")
                for who in order:
                    if who == "c":
                        ours.append(float(demo_run(demo, [1], DECODE, 1)["tok/s"]))
                    elif gguf is not None:
                        got = llama_decode(bench, gguf)
                        if isinstance(got, str):
                            gguf, why = None, got
                        else:
                            theirs.append(got)
            row.append(med(ours))
            if theirs:
                row += [med(theirs), f"{statistics.median(ours) / statistics.median(theirs):.2f}×"]
            else:
                row += [re.sub(r"\s+", " ", why)[:160], ""]
        print("| " + " | ".join(row) + " |", flush=True)
        if not a.keep:
            shutil.rmtree(fam, ignore_errors=True)
    print(f"load average after: {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
