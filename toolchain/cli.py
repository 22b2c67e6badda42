"""The `colibri` command: synth, export, build, run, targets."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from colibri.codegen.quantize import DEFAULT_OUTLIER_FRAC, DEFAULT_QUANT, INT4C_OUTLIER_FRAC, QUANTS

from .targets import ROOT, TargetError, all_targets, load_target


def _tokens(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of token ids: {text!r}") from None


def cmd_synth(a: argparse.Namespace) -> int:
    from colibri.codegen.synth import synth_checkpoint

    path = synth_checkpoint(
        a.ckpt, arch=a.arch, layers=a.layers, hidden=a.hidden, ffn=a.ffn, heads=a.heads, kv_heads=a.kv_heads,
        experts=a.experts, top_k=a.top_k, vocab=a.vocab, seed=a.seed, dtype=a.dtype, tie=a.tie,
        head_dim=a.head_dim, heavy_tail=a.heavy_tail, shards=a.shards,
    )
    print(f"wrote {path}")
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    from colibri.codegen.export import ExportOptions, export

    opts = ExportOptions(
        quant=a.quant, group_size=a.group_size, outlier_frac=a.outlier_frac, max_seq=a.max_seq,
        prefill_block=a.prefill_block, layout=a.layout, int8_activations=not a.float_activations,
        prompt=a.prompt or [], generate=a.generate, predict=not a.no_predict, prune_experts=a.prune_experts,
    )
    res = export(a.ckpt, a.out, opts, report=print, terminal=sys.stderr)
    print(f"wrote {res.out_dir}/: model.h model.c model_blob.S model.bin manifest.json")
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


def cmd_targets(a: argparse.Namespace) -> int:  # noqa: ARG001
    for t in all_targets():
        missing = t.missing(run=True)
        state = "ready" if not missing else f"missing {', '.join(missing)}: {t.install_hint()}"
        print(f"{t.name:<12} {t.kind:<9} {t.description}  [{state}]")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="colibri", description="MoE checkpoints to C, for any target.")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("synth", help="write a random HF-format checkpoint")
    s.add_argument("ckpt")
    s.add_argument("--arch", default="mixtral", choices=["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek"])
    for flag, default in (("layers", 2), ("hidden", 64), ("ffn", 128), ("heads", 8), ("kv-heads", 2),
                          ("experts", 4), ("top-k", 2), ("vocab", 320), ("seed", 1), ("shards", 1)):
        s.add_argument(f"--{flag}", type=int, default=default)
    s.add_argument("--head-dim", type=int, default=None)
    s.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    s.add_argument("--tie", action="store_true", help="tie lm_head to the embedding")
    s.add_argument("--heavy-tail", action="store_true", help="Student-t weights with outliers")
    s.set_defaults(fn=cmd_synth)

    e = sub.add_parser("export", help="quantize a checkpoint and generate C sources")
    e.add_argument("ckpt")
    e.add_argument("-o", "--out", required=True)
    e.add_argument("--quant", default=DEFAULT_QUANT, choices=QUANTS)
    e.add_argument("--group-size", type=int, default=0, help="inputs per scale (0: one scale per row)")
    e.add_argument("--outlier-frac", type=float, default=None,
                   help=f"int8c/int4c: fraction of fp16 corrections (default {DEFAULT_OUTLIER_FRAC} for int8c, "
                        f"{INT4C_OUTLIER_FRAC} for int4c)")
    e.add_argument("--max-seq", type=int, default=0, help="KV cache positions (0: from the model, max 256)")
    e.add_argument("--prefill-block", type=int, default=0,
                   help="tokens a prefill pushes through the layers at once, 1..128, 1..32 with --layout rows (more "
                        "arena, faster prefill; "
                        "0: as many as keep those buffers within the KV cache's size)")
    e.add_argument("--float-activations", action="store_true",
                   help="int8/int8c matrices take float activations (slower; the rounding of int8 activations "
                        "is then absent from the error)")
    e.add_argument("--layout", default="tiled16", choices=["tiled16", "rows"],
                   help="order of the int8 matrices: 16-row tiles for SIMD kernels (x86, NEON, RVV), rows for "
                        "microcontrollers (MVE, DSP); `colibri build` takes the target's")
    e.add_argument("--prompt", type=_tokens, default=None,
                   help="built-in prompt token ids (default: the checkpoint's colibri.json, else 3,17,42)")
    e.add_argument("--generate", type=int, default=0,
                   help="tokens the built-in demo generates (default: the checkpoint's colibri.json, else 16)")
    e.add_argument("--no-predict", action="store_true", help="skip the logit-error probe")
    e.add_argument("--prune-experts", metavar="CALIB", default=None,
                   help="drop experts the calibration set (token ids, a sequence per line) never routes to")
    e.set_defaults(fn=cmd_export)

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

    t = sub.add_parser("targets", help="list targets and whether their tools are installed")
    t.set_defaults(fn=cmd_targets)
    from .size.command import register as register_size
    register_size(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from colibri.codegen.errors import ExportError

    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ExportError, TargetError) as e:
        print(f"colibri: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
