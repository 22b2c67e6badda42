"""The `colibri` command: synth, export, build, run, targets."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .targets import ROOT, TargetError, layout_max_prefill_block, load_target, scan_targets


def _tokens(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of token ids: {text!r}") from None


def _attn_quant(text: str) -> str:
    from colibri.codegen.stream import parse_attn_quant

    try:
        return parse_attn_quant(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def cmd_synth(a: argparse.Namespace) -> int:
    from colibri.codegen.synth import synth_checkpoint

    try:
        path = synth_checkpoint(
            a.ckpt, arch=a.arch, layers=a.layers, hidden=a.hidden, ffn=a.ffn, heads=a.heads, kv_heads=a.kv_heads,
            experts=a.experts, top_k=a.top_k, vocab=a.vocab, seed=a.seed, dtype=a.dtype, tie=a.tie,
            head_dim=a.head_dim, heavy_tail=a.heavy_tail, outlier_channels=a.outlier_channels, shards=a.shards,
            sliding_window=a.sliding_window, kv_lora_rank=a.kv_lora_rank, q_lora_rank=a.q_lora_rank,
        )
    except ValueError as e:  # the dimensions do not make a model; the message names the option
        if a.debug:
            raise
        return _fail(str(e))
    print(f"wrote {path}")
    return 0


def _export_options(a: argparse.Namespace, layout: str, max_prefill_block: int):
    from colibri.codegen.export import ExportOptions

    return ExportOptions(
        quant=a.quant, group_size=a.group_size, outlier_frac=a.outlier_frac, attn_quant=a.attn_quant,
        max_seq=a.max_seq,
        prefill_block=a.prefill_block, layout=layout, int8_activations=not a.float_activations,
        prompt=a.prompt or [], generate=a.generate, predict=not a.no_predict, prune_experts=a.prune_experts,
        calib=a.calib,
        max_prefill_block=max_prefill_block, tokenizer=not a.no_tokenizer, kv=a.kv,
    )


def cmd_export(a: argparse.Namespace) -> int:
    from colibri.codegen.export import export

    opts = _export_options(a, a.layout, layout_max_prefill_block(a.layout))
    try:
        res = export(a.ckpt, a.out, opts, report=print, terminal=sys.stderr)
    except OSError as e:  # the checkpoint's files are read through safeio: this is the output side
        if a.debug:
            raise
        return _fail(f"{a.out}: cannot write the export: {_os_error(e)}")
    tok = " (tokenizer inside)" if res.manifest.get("tokenizer") else ""
    print(f"wrote {res.out_dir}/: model.h model.c model_blob.S model.bin{tok} manifest.json")
    return 0


def cmd_tokenize(a: argparse.Namespace) -> int:
    from colibri.runtime.text import TokenizerError, for_model

    try:
        ids = for_model(a.model).encode(a.text, special=a.special, parse_special=not a.no_parse_special)
    except (TokenizerError, ValueError) as e:
        if a.debug:
            raise
        return _fail(f"{a.model}: {e}")
    print(",".join(map(str, ids)))
    return 0


def cmd_detokenize(a: argparse.Namespace) -> int:
    from colibri.runtime.text import TokenizerError, for_model

    try:
        ids = [int(x) for x in a.ids.replace(" ", "").split(",") if x != ""]
    except ValueError:
        return _fail(f"{printable(a.ids)}: token ids are integers separated by commas")
    try:
        text = for_model(a.model).decode(ids)
    except (TokenizerError, ValueError) as e:
        if a.debug:
            raise
        return _fail(f"{a.model}: {e}")
    print(text)
    return 0


def cmd_project(a: argparse.Namespace) -> int:
    """A self-contained CMake/Make folder of the model for one target (toolchain/project/)."""
    from .project.generate import generate

    t = load_target(a.target)
    layout = a.layout or t.weight_layout
    opts = _export_options(a, layout, t.max_prefill_block)
    try:
        res = generate(a.ckpt, a.out, t, opts, report=print)
    except ValueError as e:  # a target string no build file can hold (escape.py)
        if a.debug:
            raise
        return _fail(f"targets/{t.name}.toml: {e}")
    except OSError as e:
        if a.debug:
            raise
        return _fail(f"{a.out}: cannot write the project: {_os_error(e)}")
    print(f"wrote {res.out_dir}/: {len(res.files)} files, library colibri::{res.name} for {t.name}")
    if res.missing:
        print(f"colibri: target {t.name}: {', '.join(res.missing)} not found here; the folder's README names "
              f"the package ({t.install_hint()})", file=sys.stderr)
    return 0


def cmd_inspect(a: argparse.Namespace) -> int:
    import json

    from colibri.codegen.inspect import format_report, inspect

    info = inspect(a.path)
    print(json.dumps(info, indent=1) if a.json else format_report(info))
    return 0 if info.get("crc_ok", True) else 1


def scons_command() -> list[str]:
    exe = Path(sys.executable).parent / "scons"
    return [str(exe)] if exe.exists() else [shutil.which("scons") or "scons"]


def cmd_build(a: argparse.Namespace) -> int:
    argv = scons_command() + ["-C", str(ROOT), "-Q", f"-j{a.jobs}", f"TARGET={a.target}", f"QUANT={a.quant}"]
    if a.ckpt:
        argv.append(f"MODEL={Path(a.ckpt).absolute()}")
    if a.max_seq:
        argv.append(f"MAX_SEQ={a.max_seq}")
    return subprocess.call(argv + a.scons_args)


def runner_argv(target_name: str, program: str) -> list[str]:
    """How to run a program built for a target here: natively or under its QEMU."""
    t = load_target(target_name)
    if t.kind == "linux" and t.runner:
        argv = list(t.runner)
        if t.sysroot:
            argv += ["-L", t.sysroot]
        return argv + [program]
    if t.kind == "firmware":
        from .firmware import qemu_argv

        return qemu_argv(t, program)
    return [program]


def cmd_run(a: argparse.Namespace) -> int:
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    argv = runner_argv(a.target, a.program)
    missing = load_target(a.target).missing(run=True)
    if missing:
        print(f"colibri: target {a.target}: {', '.join(missing)} not found; install it with: "
              f"{load_target(a.target).install_hint()}", file=sys.stderr)
        return 2
    return subprocess.call(argv + args)


def cmd_targets(a: argparse.Namespace) -> int:
    """Every target and whether its tools are installed; a broken file is listed as such, the others
    still are. With --check, also each target's memory maps and tools (toolchain/target_check.py).
    Exit status 2 when a file is broken (or, with --check, a target has a problem)."""
    problems: list[str] = []
    for name, t in scan_targets():
        if isinstance(t, TargetError):
            print(f"{name:<12} {'broken':<9} {t}")
            problems.append(str(t))
            continue
        missing = t.missing(run=True)
        state = "ready" if not missing else f"missing {', '.join(missing)}: {t.install_hint()}"
        print(f"{t.name:<12} {t.kind:<9} {t.description}  [{state}]")
        if a.check:
            from .target_check import check_target

            problems += check_target(t)
    for p in problems:
        print(f"colibri: {p}", file=sys.stderr)
    return 2 if problems else 0


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line too (`colibri export -h` still shows the usage)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {printable(message)} (see {self.prog} -h)\n")


def _add_export_options(e: argparse.ArgumentParser, layout_default: str | None) -> None:
    """The options of `colibri export`, which `colibri project` takes too."""
    from colibri.codegen.format import KV_DTYPES
    from colibri.codegen.quantize import (
        DEFAULT_OUTLIER_FRAC,
        DEFAULT_QUANT,
        INT4C_OUTLIER_FRAC,
        K_OUTLIER_SCALE,
        QUANTS,
    )

    e.add_argument("ckpt")
    e.add_argument("-o", "--out", required=True)
    e.add_argument("--quant", default=DEFAULT_QUANT, choices=QUANTS)
    e.add_argument("--group-size", type=int, default=0, help="inputs per scale (0: one scale per row)")
    e.add_argument("--outlier-frac", type=float, default=None,
                   help=f"int8c/int4c: fraction of fp16 corrections (default {DEFAULT_OUTLIER_FRAC} for int8c, "
                        f"{INT4C_OUTLIER_FRAC} for int4c; int4c's K projection takes {K_OUTLIER_SCALE} times it)")
    e.add_argument("--attn-quant", default=None, type=_attn_quant, metavar="QUANT[:LAYERS]",
                   help="quantization of the token embedding and the attention matrices (default: --quant's, "
                        "with V 8-bit in int4/int4c); with :LAYERS, of the embedding and the attention of the "
                        "first LAYERS layers only (the other attention matrices then take per-row scales). "
                        "f16:1 with int8c: 8.49 bits/weight on bench/quant_table.py's checkpoints with 0.23-0.49x "
                        "llama.cpp Q8_0's KL at 0.98-1.0x int8c's decode speed (its f16 matrices take float "
                        "activations, the same bits on every target); int8c with int4c experts beats its Q4_K_M "
                        "by 2-5x under its bits")
    e.add_argument("--max-seq", type=int, default=0, help="KV cache positions (0: from the model, max 256)")
    e.add_argument("--prefill-block", type=int, default=0,
                   help="tokens a prefill pushes through the layers at once, 1..128, or up to the smallest "
                        "max_prefill_block of the targets with the --layout (rows: 32) (more arena, faster prefill; "
                        "0: as many as keep those buffers within the KV cache's size)")
    e.add_argument("--float-activations", action="store_true",
                   help="int8/int8c matrices take float activations (slower; the rounding of int8 activations "
                        "is then absent from the error)")
    e.add_argument("--layout", default=layout_default, choices=["tiled16", "rows"],
                   help="order of the int8 matrices: 16-row tiles for SIMD kernels (x86, NEON, RVV), rows for "
                        "microcontrollers (MVE, DSP); `colibri build` and `colibri project` take the target's")
    e.add_argument("--prompt", type=_tokens, default=None,
                   help="built-in prompt token ids (default: the checkpoint's colibri.json, else 3,17,42)")
    e.add_argument("--generate", type=int, default=0,
                   help="tokens the built-in demo generates (default: the checkpoint's colibri.json, else 16)")
    e.add_argument("--kv", default="f32", choices=KV_DTYPES,
                   help="KV cache precision: f32, f16, or int8 per head per position with an f32 scale")
    e.add_argument("--no-predict", action="store_true", help="skip the logit-error probe")
    e.add_argument("--no-tokenizer", action="store_true", help="do not compile tokenizer.json in (token ids only)")
    e.add_argument("--prune-experts", metavar="CALIB", default=None,
                   help="drop experts the calibration set (token ids or text, a sequence per line) never routes to")
    e.add_argument("--calib", metavar="FILE", default=None,
                   help="calibration set (token ids or text, a sequence per line): int8c/int4c corrections and int4 "
                        "scales weigh each matrix input by its mean square on it (AWQ-style salience)")


def parser() -> argparse.ArgumentParser:
    from colibri.codegen.importers import FAMILIES
    from colibri.codegen.quantize import DEFAULT_QUANT, QUANTS

    p = _Parser(prog="colibri", description="MoE checkpoints to C, for any target.")
    p.add_argument("--debug", action="store_true", help="show a traceback instead of the one-line error")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("synth", help="write a random HF-format checkpoint")
    s.add_argument("ckpt")
    s.add_argument("--arch", default=FAMILIES[0], choices=FAMILIES)
    for flag, default in (("layers", 2), ("hidden", 64), ("ffn", 128), ("heads", 8), ("kv-heads", 2),
                          ("experts", 4), ("top-k", 2), ("vocab", 320), ("seed", 1), ("shards", 1)):
        s.add_argument(f"--{flag}", type=int, default=default)
    s.add_argument("--head-dim", type=int, default=None)
    s.add_argument("--sliding-window", type=int, default=None,
                   help="attention window (mistral: every layer; gpt-oss: the sliding layers)")
    s.add_argument("--kv-lora-rank", type=int, default=None, help="MLA (deepseek-v2/v3) key/value latent width")
    s.add_argument("--q-lora-rank", type=int, default=None, help="MLA query latent width (0: a plain q_proj)")
    s.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    s.add_argument("--tie", action="store_true", help="tie lm_head to the embedding")
    s.add_argument("--heavy-tail", action="store_true", help="Student-t weights with outliers")
    s.add_argument("--outlier-channels", type=int, default=0, metavar="N",
                   help="N input columns of every matrix scaled up 8x (outlier features)")
    s.set_defaults(fn=cmd_synth)

    e = sub.add_parser("export", help="quantize a checkpoint and generate C sources")
    _add_export_options(e, layout_default="tiled16")
    e.set_defaults(fn=cmd_export)

    pr = sub.add_parser("project", help="a self-contained CMake/Make project folder of a model for a target")
    _add_export_options(pr, layout_default=None)
    pr.add_argument("--target", default="host")
    pr.set_defaults(fn=cmd_project)

    b = sub.add_parser("build", help="build a model for a target with SCons")
    b.add_argument("ckpt", nargs="?", default=None, help="checkpoint (default: the bundled model)")
    b.add_argument("--target", default="host")
    b.add_argument("--quant", default=DEFAULT_QUANT, choices=QUANTS)
    b.add_argument("--max-seq", type=int, default=0)
    b.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    b.add_argument("scons_args", nargs="*", help="extra SCons arguments (NAME=value)")
    b.set_defaults(fn=cmd_build)

    r = sub.add_parser("run", help="run a built program on its target (natively or under QEMU)")
    r.add_argument("--target", default="host")
    r.add_argument("program")
    r.add_argument("args", nargs=argparse.REMAINDER)
    r.set_defaults(fn=cmd_run)

    i = sub.add_parser("inspect", help="family, dims, parameters and sizes of a checkpoint or model.bin")
    i.add_argument("path", help="checkpoint directory or model.bin")
    i.add_argument("--json", action="store_true")
    i.set_defaults(fn=cmd_inspect)

    k = sub.add_parser("tokenize", help="text -> token ids by the model's C tokenizer")
    k.add_argument("model", help="model.bin or a model library (.so)")
    k.add_argument("text")
    k.add_argument("--special", action="store_true", help="add the BOS/EOS tokenizer_config.json asks for")
    k.add_argument("--no-parse-special", action="store_true", help="special tokens in the text are plain text")
    k.set_defaults(fn=cmd_tokenize)
    d = sub.add_parser("detokenize", help="token ids (comma-separated) -> text by the model's C tokenizer")
    d.add_argument("model", help="model.bin or a model library (.so)")
    d.add_argument("ids")
    d.set_defaults(fn=cmd_detokenize)

    t = sub.add_parser("targets", help="list targets and whether their tools are installed")
    t.add_argument("--check", action="store_true",
                   help="also check each target's memory maps and that its compiler and runner exist (exit 2 if not)")
    t.set_defaults(fn=cmd_targets)
    from .size.command import register as register_size
    register_size(sub)
    return p


def printable(text: str) -> str:
    """Text with the non-UTF-8 bytes of a file name (surrogate escapes) spelt \\xNN, like the shell does."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _fail(message: str) -> int:
    print(f"colibri: error: {printable(message)}", file=sys.stderr)
    return 2


def _os_error(e: OSError) -> str:
    """An OSError as one line: the file(s) it names and the system's reason (ENOSPC, EROFS, EACCES...)."""
    where = ": ".join(os.fsdecode(f) for f in (e.filename, e.filename2) if f is not None)
    why = e.strerror or str(e)
    return f"{where}: {why}" if where else why


def main(argv: list[str] | None = None) -> int:
    """Run one command. Every expected failure is one line on stderr and exit 2 (130 when interrupted);
    --debug shows the traceback instead."""
    from colibri.codegen.errors import ExportError

    for stream in (sys.stdout, sys.stderr):  # a file name with non-UTF-8 bytes prints as \xNN
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("colibri: interrupted", file=sys.stderr)
        return 130
    except (ExportError, TargetError) as e:
        if args.debug:
            raise
        return _fail(str(e))
    except OSError as e:
        if args.debug:
            raise
        return _fail(_os_error(e))
    except (UnicodeError, RecursionError, MemoryError) as e:
        if args.debug:
            raise
        what = {UnicodeEncodeError: "cannot encode", UnicodeDecodeError: "cannot decode",
                RecursionError: "input nested too deeply", MemoryError: "out of memory"}
        return _fail(f"{what.get(type(e), type(e).__name__)}: {e}" if str(e) else what.get(type(e), type(e).__name__))


if __name__ == "__main__":
    sys.exit(main())
