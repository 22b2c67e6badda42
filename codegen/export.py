"""`colibri export`: checkpoint -> model.bin, model.h, model.c, model_blob.S, manifest.json."""

from __future__ import annotations

import json
import math
import mmap
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from . import __version__, sampling
from . import format as fmt
from .blob import BlobWriter, blob_flags, format_version
from .blobview import BlobWeights
from .checkpoint import open_checkpoint
from .emit import c_identifier, render_sources, staged_dir, unnamed_file
from .errors import ExportError
from .format import KV_DTYPES, Q8_BLOCK, blob_names, feature_flags, flags_not_run, tensor_fields
from .layout import DEFAULT_LAYOUT, LAYOUTS, uses_q8
from .plan import MAX_PREFILL_BLOCK, mla_cache_bytes, plan_arena
from .progress import tensor_progress
from .quantize import DEFAULT_QUANT, INT4_QUANTS, MAX_OUTLIER_FRAC, QUANTS, QuantTensor, default_outlier_frac, quantize
from .reference import Reference, WeightSource, rope_inv_freq
from .safeio import read_json
from .spec import ModelSpec, canonical_names, canonical_shape
from .stream import (
    attn_scope,
    has_int4,
    has_int16,
    matrix_quants,
    parse_attn_quant,
    pool_workers,
    quantize_all,
    tensor_quant,
)
from .tokenizer import load_tokenizer, pack

DEFAULT_MAX_SEQ_CAP = 256
MAX_SEQ_LIMIT = 1 << 20  # KV cache positions: more is no embedded model
PREDICT_MAX_PARAMS = 80_000_000  # above this the probe (which re-reads weights as it goes) takes too long
PROBE_CACHE_BYTES = 48 << 20  # per side: the probe reads weights when used and keeps at most this many
PROBE_SEQS, PROBE_LEN = 3, 12
PREDICT_MARGIN = 2.0
SOURCE_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}

# Kept in float32 whatever the quantization, and why (recorded in the manifest).
HIGHER_PRECISION = {
    "norms": "RMSNorm weights scale every activation; a vector per layer, negligible size",
    "router": "top-k routing is a discrete choice: a small error flips experts; n_experts rows only",
    "rope_freq": "rotary inverse frequencies, head_dim/2 floats",
    "biases": "q/k/v biases (Qwen2-MoE) are added unscaled to every projection; a vector each",
    "shared_gate": "the shared expert's sigmoid gate (Qwen2-MoE) is one row, like the router",
}


@dataclass
class ExportOptions:
    quant: str = DEFAULT_QUANT
    group_size: int = 0  # 0: one scale per output row
    outlier_frac: float | None = None  # None: quantize.default_outlier_frac(quant)
    attn_quant: str | None = None  # the embedding's and attention matrices' quantization; None: quant's
    max_seq: int = 0  # 0: from the model, capped at DEFAULT_MAX_SEQ_CAP
    prompt: list[int] = field(default_factory=list)  # built-in prompt; empty: colibri.json's, else 3,17,42
    generate: int = 0  # tokens the built-in demo generates; 0: colibri.json's, else 16
    prefill_block: int = 0  # tokens a prefill runs through the layers at once; 0: plan.prefill_block()
    predict: bool = True
    prune_experts: str | None = None  # calibration set (calibset.py: ids or text): drop unrouted experts
    calib: str | None = None  # calibration set (the same format): scale migration, weighted int4 searches
    workers: int = 0  # quantizing threads; 0: one per core, or none for firmware-scale models
    layout: str = DEFAULT_LAYOUT  # how int8 matrices are ordered for the target's kernels (codegen/layout.py)
    int8_activations: bool = True  # integer matmuls (format 1.2); False keeps float activations (1.0/1.1)
    max_prefill_block: int = MAX_PREFILL_BLOCK  # the largest block the target's runtime takes (its TOML's)
    tokenizer: bool = True  # compile tokenizer.json in (when the checkpoint has one); False: ids only
    kv: str = "f32"  # the KV cache precision: f32, f16 or int8 (per head per position, f32 scale)


@dataclass
class ExportResult:
    name: str
    out_dir: Path
    manifest: dict


def default_max_seq(spec: ModelSpec) -> int:
    return max(1, min(spec.max_position, DEFAULT_MAX_SEQ_CAP))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


DEMO_FILE = "colibri.json"
DEMO_KEYS = ("prompt", "generate", "sampling")


def _demo_defaults(ckpt_dir: Path, vocab: int) -> dict:
    """The checkpoint's own built-in prompt, if it ships a colibri.json: a JSON object with an optional
    "prompt" (a list of token ids in [0, vocab)) and an optional "generate" (a positive integer)."""
    path = ckpt_dir / DEMO_FILE
    if not (path.exists() or path.is_symlink()):
        return {}
    data = read_json(path, DEMO_FILE)
    if not isinstance(data, dict):
        raise ExportError(path, f"expected a JSON object {{\"prompt\": [token ids], \"generate\": n}}, "
                                f"got {type(data).__name__ if data is not None else 'null'}")
    unknown = sorted(set(data) - set(DEMO_KEYS))
    if unknown:
        raise ExportError(path, f"unknown key {unknown[0]!r} (known: {', '.join(DEMO_KEYS)})")
    out = {}
    if "prompt" in data and isinstance(data["prompt"], str):  # text: tokenized on the device (C tokenizer)
        text = data["prompt"]
        if not text:
            raise ExportError(path, "key 'prompt': an empty text")
        try:
            out["prompt_text"] = list(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise ExportError(path, "key 'prompt': the text holds a lone surrogate, not UTF-8") from None
    elif "prompt" in data:
        prompt = data["prompt"]
        if not isinstance(prompt, list):
            raise ExportError(path, f"key 'prompt': expected a list of token ids or a text, got {_short(prompt)}")
        for i, t in enumerate(prompt):
            if not _is_int(t):
                raise ExportError(path, f"key 'prompt': element {i} is {_short(t)}, not an integer token id")
            if not 0 <= t < vocab:
                raise ExportError(path, f"key 'prompt': element {i} is {_short(t)}, outside the vocabulary "
                                        f"[0, {vocab})")
        out["prompt"] = prompt
    if "generate" in data:
        generate = data["generate"]
        if not _is_int(generate) or generate < 1:
            raise ExportError(path, f"key 'generate': expected a positive integer, got {_short(generate)}")
        out["generate"] = generate
    if "sampling" in data:
        try:
            out["sampling"] = sampling.validate(data["sampling"], vocab)
        except ValueError as e:
            raise ExportError(path, str(e)) from None
    return out


def _short(v: Any) -> str:
    """A value for an error line: its repr, cut short (a prompt may hold a million digits)."""
    text = repr(v) if not isinstance(v, int) or abs(v) < 10**30 else f"an integer of {len(str(abs(v)))} digits"
    return text if len(text) <= 60 else text[:57] + "..."


def tokenizer_section(ckpt_dir: Path, vocab: int) -> bytes | None:
    """The checkpoint's tokenizer.json as a tokenizer section, or None when it has none."""
    if not (ckpt_dir / "tokenizer.json").exists():
        return None
    tok = load_tokenizer(ckpt_dir)
    if len(tok.pieces) > vocab:
        raise ExportError(ckpt_dir / "tokenizer.json", f"{len(tok.pieces)} tokens, more than the model's vocabulary "
                          f"of {vocab}")
    return pack(tok)


def _chat(ckpt_dir: Path) -> dict | None:
    """tokenizer_config.json's chat template as {"prefix", "suffix"} (codegen/chat.py), None without one.
    Stored in the manifest."""
    from .chat import ChatTemplateError, chat_parts

    path = ckpt_dir / "tokenizer_config.json"
    try:
        parts = chat_parts(ckpt_dir)
    except ChatTemplateError as e:
        raise ExportError(path, str(e)) from None
    except (OSError, ValueError) as e:
        raise ExportError(path, f"unreadable: {e}") from None
    return parts.to_json() if parts else None


def _validate_options(ckpt_dir: Path, spec: ModelSpec, opts: ExportOptions
                      ) -> tuple[int, list[int], int, dict, list[int]]:
    unrun = flags_not_run(feature_flags(spec))
    if unrun:
        raise ExportError(ckpt_dir / "config.json", f"{spec.arch}: the C runtime does not implement "
                                                    f"{', '.join(unrun)} yet (the numpy reference does)")
    if opts.quant not in QUANTS:
        raise ExportError(ckpt_dir, f"unknown quantization {opts.quant!r} (use {', '.join(QUANTS)})")
    if opts.attn_quant is not None:
        try:
            parse_attn_quant(opts.attn_quant)
        except ValueError as e:
            raise ExportError(ckpt_dir, f"--attn-quant: {e}") from None
    if attn_scope(opts.attn_quant)[0] in INT4_QUANTS and not opts.int8_activations:
        raise ExportError(ckpt_dir, f"--attn-quant {opts.attn_quant} has integer-activation kernels only "
                                    "(drop --float-activations)")
    for name in canonical_names(spec) if has_int16(opts.quant, opts.attn_quant) else ():
        cols = canonical_shape(spec, name)[-1]
        if tensor_quant(name, opts.quant, opts.attn_quant) == "int16" and cols % Q8_BLOCK:
            raise ExportError(ckpt_dir, f"int16: {name} is {cols} wide, and int16 matrices take whole blocks of "
                                        f"{Q8_BLOCK} inputs (use f16 for it)")
    if not 0.0 <= opts.outlier_frac <= MAX_OUTLIER_FRAC:
        raise ExportError(ckpt_dir, f"--outlier-frac {opts.outlier_frac} outside [0, {MAX_OUTLIER_FRAC}]")
    if opts.quant in INT4_QUANTS and not opts.int8_activations:
        raise ExportError(ckpt_dir, f"--quant {opts.quant} has integer-activation kernels only "
                                    "(drop --float-activations)")
    if opts.layout not in LAYOUTS:
        raise ExportError(ckpt_dir, f"unknown layout {opts.layout!r} (use {', '.join(LAYOUTS)})")
    if opts.group_size < 0:
        raise ExportError(ckpt_dir, f"--group-size {opts.group_size} is negative")
    if opts.kv not in KV_DTYPES:
        raise ExportError(ckpt_dir, f"--kv {_short(opts.kv)}: not one of {', '.join(KV_DTYPES)}")
    if spec.mla and opts.kv != "f32":
        raise ExportError(ckpt_dir, f"--kv {opts.kv}: an MLA model's latent cache is f32 only")
    max_seq = opts.max_seq or default_max_seq(spec)
    if not 1 <= max_seq <= MAX_SEQ_LIMIT:
        raise ExportError(ckpt_dir, f"--max-seq {max_seq} outside [1, {MAX_SEQ_LIMIT}]")
    max_block = opts.max_prefill_block
    if not 1 <= max_block <= MAX_PREFILL_BLOCK:
        raise ExportError(ckpt_dir, f"largest prefill block {max_block} outside [1, {MAX_PREFILL_BLOCK}]")
    if not 0 <= opts.prefill_block <= max_block:
        why = "" if max_block == MAX_PREFILL_BLOCK else f" (the target's runtime takes {max_block})"
        raise ExportError(ckpt_dir, f"--prefill-block {opts.prefill_block} outside [1, {max_block}]{why}")
    if opts.generate < 0:
        raise ExportError(ckpt_dir, f"--generate {opts.generate} is negative")
    demo = _demo_defaults(ckpt_dir, spec.vocab)
    # where each value comes from, for the error line: the option, colibri.json or the default
    where = ckpt_dir / DEMO_FILE
    if opts.prompt:
        prompt, prompt_from = opts.prompt, "--prompt"
    elif "prompt" in demo and demo["prompt"]:
        prompt, prompt_from = demo["prompt"], f"{where} prompt"
    else:
        prompt, prompt_from = [t % spec.vocab for t in (3, 17, 42)], "the default prompt"
    if opts.generate:
        generate, gen_from = opts.generate, "--generate"
    elif "generate" in demo:
        generate, gen_from = demo["generate"], f"{where} generate"
    else:
        generate, gen_from = 16, "the default generate"
    bad = next((t for t in prompt if not _is_int(t) or not 0 <= t < spec.vocab), None)
    if bad is not None:
        raise ExportError(ckpt_dir, f"{prompt_from}: token {_short(bad)} outside the vocabulary [0, {spec.vocab})")
    if len(prompt) + generate > max_seq:
        raise ExportError(ckpt_dir, f"{prompt_from} ({len(prompt)} tokens) + {gen_from} ({generate} tokens) exceed "
                                    f"max_seq {max_seq}, the KV cache positions of the model (--max-seq)")
    # a text prompt (its UTF-8 bytes) is the demo's default unless --prompt gives ids; it needs the tokenizer
    text = [] if opts.prompt else demo.get("prompt_text", [])
    if text and not (opts.tokenizer and (ckpt_dir / "tokenizer.json").exists()):
        raise ExportError(where, "key 'prompt': a text prompt needs the model's tokenizer (tokenizer.json, "
                                 "without --no-tokenizer)")
    return max_seq, prompt, generate, demo.get("sampling", dict(sampling.DEFAULTS)), text


def predict_logit_error(spec: ModelSpec, exact: dict | WeightSource, approx: dict | WeightSource, max_seq: int,
                        cache_bytes: int | None = None) -> dict:
    """Run the reference with the source and the dequantized weights on fixed probe
    sequences; the prediction is PREDICT_MARGIN times the worst relative deviation.
    With `cache_bytes` each side reads its weights when used and keeps at most that many bytes of them."""
    rng = np.random.default_rng(0)
    ref_a = Reference(spec, exact, max_seq=max_seq, cache_bytes=cache_bytes)
    ref_b = Reference(spec, approx, max_seq=max_seq, cache_bytes=cache_bytes)
    worst = 0.0
    n = min(PROBE_LEN, max_seq)
    for _ in range(PROBE_SEQS):
        ref_a.reset()
        ref_b.reset()
        for tok in rng.integers(0, spec.vocab, size=n):
            la, lb = ref_a.forward([int(tok)]), ref_b.forward([int(tok)])
            scale = float(np.max(np.abs(la))) or 1.0
            worst = max(worst, float(np.max(np.abs(la - lb))) / scale)
    return {
        "relative": worst * PREDICT_MARGIN,
        "measured_on_probe": worst,
        "margin": PREDICT_MARGIN,
        "probe": f"{PROBE_SEQS} random sequences of {n} tokens, seed 0",
        "definition": "max |logit - logit_fp32| / max |logit_fp32| over every probe position",
    }


def _source_bytes(source: Any, spec: ModelSpec, names: list[str]) -> dict[str, int]:
    return {n: math.prod(canonical_shape(spec, n)) * SOURCE_ITEMSIZE.get(source.source_dtypes.get(n, "F32"), 4)
            for n in names}


def _probe(spec: ModelSpec, source: Any, f: Any, order: list[str], max_seq: int) -> dict:
    """The logit-error probe against the blob just written: dequantized weights decoded from it (mmap),
    source weights re-read from the checkpoint, both only when used."""
    f.flush()
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return predict_logit_error(spec, source, BlobWeights(buf, order, spec), max_seq, PROBE_CACHE_BYTES)


def export(
    ckpt_dir: str | Path,
    out_dir: str | Path,
    opts: ExportOptions | None = None,
    report: Callable[[str], None] = lambda line: None,
    terminal: TextIO | None = None,
) -> ExportResult:
    """Export a checkpoint into out_dir, all or nothing. Raises ExportError on bad input.

    Tensors are read, quantized and written one at a time (by a pool of threads for larger models), so
    memory stays bounded whatever the model size. Each tensor's line goes to `report`, unless
    `terminal` is a TTY: then one progress line is redrawn on it instead."""
    opts = opts or ExportOptions()
    t0 = time.perf_counter()
    ckpt = open_checkpoint(ckpt_dir)
    spec = ckpt.spec
    ckpt_dir = Path(ckpt_dir)
    if opts.outlier_frac is None:  # the quantization's own default
        opts = replace(opts, outlier_frac=default_outlier_frac(opts.quant))
    max_seq, prompt, generate, sample_cfg, prompt_text = _validate_options(ckpt_dir, spec, opts)
    chat = _chat(ckpt_dir)
    source, pruning = ckpt, None
    if opts.prune_experts:
        source, pruning = _prune(ckpt, ckpt_dir, opts.prune_experts, max_seq, report)
        spec = source.plan.spec
    calibration = smoothing = None
    if opts.calib:
        source, calibration, smoothing = _calibrate(source, ckpt_dir, spec, opts, max_seq, report)
    name = c_identifier(ckpt_dir.absolute().name)
    q8 = opts.int8_activations and any(uses_q8(spec, qn, opts.group_size)
                                       for qn in matrix_quants(opts.quant, opts.attn_quant))
    plan = plan_arena(spec, max_seq, opts.prefill_block, q8=q8, max_block=opts.max_prefill_block, kv=opts.kv)
    tok_section = tokenizer_section(ckpt_dir, spec.vocab) if opts.tokenizer else None
    order = blob_names(spec, tokenizer=tok_section is not None)  # the tokenizer section last
    names = canonical_names(spec)  # order without the tensors the exporter derives (rope_freq)
    keep = opts.predict and spec.param_count() <= PREDICT_MAX_PARAMS
    src_sizes = _source_bytes(source, spec, names)
    src_bytes = sum(src_sizes.values())
    workers = pool_workers(spec.param_count(), opts.workers)
    rows: list[dict] = []
    sq_err = sq_norm = 0.0
    progress = tensor_progress(report, terminal, len(names), src_bytes)
    with staged_dir(Path(out_dir), protect=(ckpt.path,)) as tmp:
        with unnamed_file(tmp / "model.bin") as f:
            writer = BlobWriter(f, len(order), opts.layout if q8 else "rows")
            derived = {"rope_freq": lambda: QuantTensor("f32", 1, spec.head_dim // 2, rope_inv_freq(spec)[None, :])}
            try:
                for q in quantize_all(source, names, opts.quant, opts.group_size, opts.outlier_frac, workers,
                                      opts.attn_quant, calibration):
                    writer.add(q.name, q.qt)
                    row = {**q.row, **tensor_fields(q.name), "offset": writer.records[-1].offset,
                           "bytes": writer.records[-1].nbytes, "payload_bits": q.qt.payload_bits()}
                    rows.append(row)
                    sq_err += (row["rel_error"] ** 2) * q.norm2
                    sq_norm += q.norm2
                    progress.tensor_done(_tensor_line(row), src_sizes[q.name])
                    while len(writer.records) < len(order) and order[len(writer.records)] in derived:
                        writer.add(order[len(writer.records)], derived[order[len(writer.records)]]())
            finally:
                progress.close()
            params = fmt.model_params(spec)
            if params:  # the parameters section, before the tokenizer's (FORMAT.md "Parameters")
                writer.add_section("params", fmt.pack_params(params))
            if tok_section is not None:
                writer.add_section("tokenizer", tok_section)
            blob_bytes, crc = writer.finish(spec, max_seq, plan)
            prediction = _probe(spec, source, f, order, max_seq) if keep else None
        if pruning is not None:
            pruning["flash_saved_bytes"] = _pruned_bytes(ckpt.spec, spec, rows)
            report(f"pruned {pruning['n_experts']['before'] - spec.n_experts} of {ckpt.spec.n_experts} experts per "
                   f"MoE layer: about {pruning['flash_saved_bytes']:,} bytes of flash saved; on the calibration set "
                   f"max logit change {pruning['accuracy']['max_rel_logit_change']:.3e} (relative), argmax "
                   f"agreement {pruning['accuracy']['argmax_agreement']:.1%}")
        n_weights = sum(int(np.prod(r["shape"])) for r in rows)
        total_bits = sum(r["payload_bits"] for r in rows)
        export_s = time.perf_counter() - t0
        manifest = {
            "generator": f"colibri {__version__}",
            "model": name,
            "source": ckpt_dir.absolute().name,
            "spec": spec.to_json(),
            "quant": {"scheme": opts.quant, "group_size": opts.group_size, "outlier_frac": opts.outlier_frac,
                      "attn_quant": opts.attn_quant},
            "higher_precision": HIGHER_PRECISION,
            "max_seq": max_seq,
            "blob": {"file": "model.bin", "bytes": blob_bytes, "crc32": crc,
                     "format_version": format_version(spec, plan, writer.int4, writer.tokenizer),
                     "layout": opts.layout if q8 else "rows", "int8_activations": q8,
                     "kv_cache": opts.kv},
            "arena": {**plan.to_json(), **({"plain_kv_cache_bytes": mla_cache_bytes(spec, max_seq)[1]}
                                           if spec.mla else {})},
            "totals": {
                "weights": n_weights,
                "bits_per_weight": total_bits / n_weights,
                "rel_error": (sq_err / sq_norm) ** 0.5 if sq_norm else None,
            },
            "predicted_logit_error": prediction,
            "predict_requested": opts.predict,
            "pruning": pruning,
            "calibration": None if calibration is None else {**calibration.to_json(),
                                                             "smoothing": smoothing.to_json()},
            # the section inside model.bin (its TOKENIZER entry): where, and its bytes for the size audit
            "tokenizer": None if tok_section is None else {"offset": writer.records[-1].offset,
                                                           "bytes": len(tok_section)},
            "default_prompt": prompt,
            "default_prompt_text": bytes(prompt_text).decode("utf-8") if prompt_text else None,
            "default_generate": generate,
            "chat": chat,
            "default_sampling": sample_cfg,
            "tensors": rows,
        }
        with unnamed_file(tmp / "manifest.json") as f:
            f.write((json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
        render_sources(tmp, {
            "version": __version__, "source": ckpt_dir.absolute().name, "quant": opts.quant, "name": name,
            "spec": spec, "max_seq": max_seq, "blob_bytes": blob_bytes, "crc32": crc, "plan": plan,
            "prompt": prompt, "prompt_text": prompt_text, "generate": generate,
            "chat_prefix": list(chat["prefix"].encode("utf-8")) if chat else [],
            "chat_suffix": list(chat["suffix"].encode("utf-8")) if chat else [],
            "flags": blob_flags(spec, plan, writer.tokenizer),
            "int4": has_int4(opts.quant, opts.attn_quant), "int16": has_int16(opts.quant, opts.attn_quant),
            "sampling": sampling.c_values(sample_cfg), "sampling_stop": sampling.c_stop(sample_cfg),
        })
    report(_summary(manifest, src_bytes, export_s))
    return ExportResult(name, Path(out_dir), manifest)


def _prune(ckpt, ckpt_dir: Path, calib: str, max_seq: int, report: Callable[[str], None]):
    from .prune import PrunedWeights, accuracy_change, plan_pruning

    spec = ckpt.spec
    if not spec.moe_layers:
        raise ExportError(ckpt.path, "--prune-experts: the model has no MoE layers")
    seqs = _calibration_set(calib, ckpt_dir, spec.vocab, report)
    report(f"pruning: routing {sum(min(len(s), max_seq) for s in seqs)} calibration tokens through the reference")
    pplan, before = plan_pruning(spec, ckpt, seqs, max_seq)
    source = PrunedWeights(ckpt, pplan)
    info = pplan.to_json(spec.n_experts)
    info["calibration"] = {"file": str(calib), "sequences": len(seqs)}
    info["accuracy"] = accuracy_change(pplan.spec, source, seqs, max_seq, before)
    return source, info


def _calibration_set(path: str, ckpt_dir: Path, vocab: int, report: Callable[[str], None]) -> list[list[int]]:
    """A calibration file's sequences of ids (codegen/calibset.py: ids, or text for the checkpoint's tokenizer)."""
    from .calibset import read_calibration

    cs = read_calibration(path, vocab, lambda: tokenizer_section(ckpt_dir, vocab))
    report(f"calibration set {cs.describe(path)}")
    return cs.seqs


def _calibrate(source, ckpt_dir: Path, spec: ModelSpec, opts: ExportOptions, max_seq: int,
               report: Callable[[str], None]):
    """--calib: the file's sequences, then calibrated()."""
    seqs = _calibration_set(opts.calib, ckpt_dir, spec.vocab, report)
    report(f"calibration: running {sum(min(len(s), max_seq) for s in seqs)} tokens of {opts.calib} through the "
           "reference for each matrix's input statistics")
    return calibrated(source, spec, opts, seqs, max_seq, report)


def calibrated(source, spec: ModelSpec, opts: ExportOptions, seqs: list[list[int]], max_seq: int,
               report: Callable[[str], None] = lambda line: None):
    """The calibration sequences' statistics, the scale migration they choose for opts' quantization
    (codegen/smooth.py), and the source with it folded in: (source, Calibration, Smoothing)."""
    from .calibrate import calibrate
    from .layout import is_q8
    from .smooth import SmoothedWeights, plan_smoothing, smoothed_calibration
    from .stream import CALIBRATED, tensor_scheme

    calib = calibrate(spec, source, seqs, max_seq, opts.calib or "")

    def quantizer(name: str, w: np.ndarray, importance: np.ndarray | None) -> tuple[QuantTensor, bool]:
        tq, g, frac = tensor_scheme(name, opts.quant, opts.group_size, opts.outlier_frac, opts.attn_quant)
        qt = quantize(w, tq, group_size=g, outlier_frac=frac, importance=importance if tq in CALIBRATED else None)
        return qt, opts.int8_activations and is_q8(qt.dtype, qt.cols, qt.group_size)

    smoothing = plan_smoothing(spec, source, calib, quantizer, report)
    return SmoothedWeights(source, smoothing), smoothed_calibration(calib, smoothing), smoothing


def _pruned_bytes(before: ModelSpec, after: ModelSpec, rows: list[dict]) -> int:
    """Blob bytes the dropped experts would have taken: their tensors (the mean of the kept experts', exact
    unless int8c corrections differ), their table entries and their router rows."""
    from .format import ENTRY_BYTES, ROW_ALIGN
    from .plan import align_up

    n_dropped = (before.n_experts - after.n_experts) * len(after.moe_layers)
    expert_rows = [r for r in rows if ".experts." in r["name"]]
    per_expert = sum(r["bytes"] for r in expert_rows) / max(1, len(expert_rows) // 3)
    router_row = align_up(after.hidden * 4, ROW_ALIGN)
    return round(n_dropped * (per_expert + 3 * ENTRY_BYTES + router_row))


def _tensor_line(row: dict) -> str:
    line = f"  {row['name']:<34} {row['quant']:<5} {row['bits_per_weight']:6.3f} b/w  err {row['rel_error']:.2e}"
    for other in ("int8", "int8c", "int4", "int4c"):
        if f"rel_error_{other}" in row:
            line += f"  ({other} {row[f'rel_error_{other}']:.2e})"
    return line


def _latent(a: dict) -> str:
    """An MLA model's cache against the plain one, for the arena line."""
    plain = a.get("plain_kv_cache_bytes")
    return f", the MLA latent: plain K+V {plain:,} bytes, {plain / a['kv_cache_bytes']:.1f}x" if plain else ""


def _summary(m: dict, src_bytes: int, seconds: float) -> str:
    t, a = m["totals"], m["arena"]
    err = f"{t['rel_error']:.3e}" if t["rel_error"] is not None else "n/a"
    pred = m["predicted_logit_error"]
    pred_s = (f"{pred['measured_on_probe']:.3e} measured on the probe, {pred['relative']:.3e} predicted bound "
              f"({pred['margin']:g}x margin)") if pred else (
        "not computed (--no-predict)" if not m["predict_requested"] else "n/a (model too large for the probe)")
    n_corr = sum(r["n_outliers"] for r in m["tensors"])
    comp = (f"compensation: {n_corr:,} fp16 corrections ({n_corr / t['weights']:.2%} of the weights, about as many "
            "extra multiply-adds per forward pass; bench/host.py --quant int8 vs int8c measures the time)")
    return "\n".join([
        f"model {m['model']}: {t['weights']:,} weights, {m['quant']['scheme']}, "
        f"{t['bits_per_weight']:.3f} bits/weight, rel error {err}",
        f"blob {m['blob']['bytes']:,} bytes (crc32 {m['blob']['crc32']:08x})",
        f"arena {a['arena_bytes']:,} bytes planned (naive {a['naive_bytes']:,}; KV cache {a['kv_cache_bytes']:,} "
        f"bytes in {a['kv_cache_dtype']}{_latent(a)}) for max_seq {m['max_seq']}",
        f"logit error relative to max |logit|: {pred_s}",
        *([comp] if n_corr else []),
        f"export {seconds:.2f} s, {src_bytes / 1e6 / max(seconds, 1e-9):.1f} MB/s of source weights",
    ])
