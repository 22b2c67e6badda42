"""--prune-experts: experts a calibration set never routes to leave the blob and model.h."""

from __future__ import annotations

import re

import numpy as np
from safetensors.numpy import load_file, save_file

from colibri.codegen.export import ExportOptions, export
from colibri.runtime import load

from blobread import entries, header
from conftest import synth

SHAPE = dict(layers=2, hidden=48, ffn=64, heads=4, kv_heads=2, experts=6, top_k=1, vocab=97, seed=41)
CLONES = {3: 1, 5: 0}  # expert 3 is a worse copy of expert 1, 5 of 0
PROMPT = [3, 17, 42, 5]


def _ckpt_with_unroutable_experts(path):
    """Experts 3 and 5 can never be chosen, whatever the input.

    Residual dimension 0 is held at +10 (set in the embedding; no attention output or expert writes it), so
    the normed router input always has x[0] > 0; expert 3's router row is expert 1's minus 10 in dimension 0
    (5's likewise of 0's), so its logit is always well below its original's and top-1 never picks it.
    """
    ckpt = synth(path, **SHAPE)
    f = ckpt / "model.safetensors"
    t = load_file(f)
    t["model.embed_tokens.weight"][:, 0] = 10.0
    for layer in range(SHAPE["layers"]):
        p = f"model.layers.{layer}."
        t[p + "self_attn.o_proj.weight"][0] = 0.0
        for e in range(SHAPE["experts"]):
            t[p + f"block_sparse_moe.experts.{e}.w2.weight"][0] = 0.0
        router = t[p + "block_sparse_moe.gate.weight"]
        for clone, original in CLONES.items():
            router[clone] = router[original]
            router[clone, 0] -= 10.0
    save_file(t, f, metadata={"format": "pt"})
    return ckpt


def test_prune_drops_never_routed_experts(tmp_path, build_model):
    ckpt = _ckpt_with_unroutable_experts(tmp_path / "prunable")
    rng = np.random.default_rng(5)
    calib = tmp_path / "calib.txt"
    calib.write_text("# token ids, one sequence per line\n"
                     + "\n".join(",".join(map(str, rng.integers(0, SHAPE["vocab"], 24))) for _ in range(6)) + "\n")
    base = build_model(ckpt, "f32")  # the unpruned model, and the generic runtime to run both blobs
    pruned = export(ckpt, tmp_path / "pruned", ExportOptions(quant="f32", prune_experts=str(calib)))
    info = pruned.manifest["pruning"]
    assert info["dropped"] == {"0": [3, 5], "1": [3, 5]}, info
    assert info["n_experts"] == {"before": 6, "after": 4}
    assert info["accuracy"]["argmax_agreement"] == 1.0
    model_h = (tmp_path / "pruned" / "model.h").read_text()
    assert re.search(r"^#define COLIBRI_N_EXPERTS 4$", model_h, re.M)

    before = (base / "model.bin").read_bytes()
    after = (tmp_path / "pruned" / "model.bin").read_bytes()
    assert header(after)["n_experts"] == 4
    # exactly the dropped experts' bytes: their tensors, their table entries and their router rows
    # (f32, hidden 48 and ffn 64 keep every tensor a multiple of 64 bytes, so no padding moves)
    ents = entries(before)
    dropped = [e for e in ents if e["kind"] in (10, 11, 12) and e["expert"] in CLONES]
    tensor_bytes = sum(e["rows"] * e["row_stride"] for e in dropped)
    router_rows = SHAPE["layers"] * len(CLONES) * ents[8]["row_stride"]
    assert len(before) - len(after) == tensor_bytes + 64 * len(dropped) + router_rows
    assert pruned.manifest["pruning"]["flash_saved_bytes"] == len(before) - len(after)

    runtime = base / "libcolibri.so"
    full, small = load(base / "model.bin", runtime=runtime), load(tmp_path / "pruned" / "model.bin", runtime=runtime)
    assert small.generate(PROMPT, 24) == full.generate(PROMPT, 24)
