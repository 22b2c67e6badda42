"""DeepSeek-V2 and DeepSeek-V3 (multi-head latent attention, V2/V3 routing) on checkpoints transformers itself
writes (save_pretrained of a randomly initialised tiny model): the numpy reference against transformers' logits
at every position of 3 sequences, the compressed KV cache's size against the formula, the C runtime (f32,
int8c, int4c) against the reference on every Linux target (tests/every_target.py), and the refusals.

torch and transformers are dev-only extras (see README); a missing extra skips (a failure under CI=true,
conftest). The version used is written to each checkpoint's colibri_fixture.json. Each fixture is built so
that what the routing and the rope layout decide shows in the logits (the mutation tests below check it).
"""

from __future__ import annotations

import dataclasses
import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from every_target import QUANTS, check_every_target

from colibri.codegen import reference as ref_mod
from colibri.codegen.checkpoint import open_checkpoint
from colibri.codegen.errors import ExportError
from colibri.codegen.importers import deepseek_v2
from colibri.codegen.reference import Reference
from colibri.codegen.spec import canonical_names
from colibri.runtime import load

import blobread
from blobread import weights as blob_weights
from conftest import synth

VOCAB = 97
SEQ_LENS = (1, 9, 40)
_BASE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2,
             n_shared_experts=1, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
             first_k_dense_replace=1, max_position_embeddings=128, tie_word_embeddings=False)
CASES = {
    # plain q_proj, group-limited greedy (a group scored by its best expert), routed scale, interleaved rope
    # of a rope_theta of its own
    "v2": ("DeepseekV2Config", dict(_BASE, q_lora_rank=None, topk_method="group_limited_greedy", n_group=2,
                                    topk_group=1, routed_scaling_factor=1.5,
                                    rope_parameters=dict(rope_type="default", rope_theta=500.0))),
    # q through its low-rank latent, sigmoid + bias, the best 1 of 2 groups by top-2 sums, rope_interleave true,
    # an rms_norm_eps the latent norms (eps 1e-6 always) do not take
    "v3": ("DeepseekV3Config", dict(_BASE, q_lora_rank=24, n_group=2, topk_group=1, routed_scaling_factor=2.5,
                                    rms_norm_eps=1e-2)),
    # rotate_half rope (rope_interleave false), 2 of 4 groups, no renormalisation, tied embeddings
    "v3_half": ("DeepseekV3Config", dict(_BASE, q_lora_rank=24, n_group=4, topk_group=2, rope_interleave=False,
                                         norm_topk_prob=False, tie_word_embeddings=True, num_hidden_layers=2)),
}


def make_hf(path: Path, cls: str, kw: dict, seed: int) -> Path:
    """save_pretrained of a randomly initialised transformers model of config class `cls`."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**kw), dtype=torch.float32)
    with torch.no_grad():  # HF initialises norms to 1 and the expert bias to 0: make them matter
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.2)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.3)
        for name, p in model.named_parameters():  # router logits of a few units: scores far from even
            if name.endswith("mlp.gate.weight"):
                p.mul_(20.0)
    model.save_pretrained(path)
    (path / "colibri_fixture.json").write_text(json.dumps({"transformers": transformers.__version__,
                                                           "torch": torch.__version__}) + "\n")
    return path


@pytest.fixture(scope="module")
def mla_ckpts(tmp_path_factory):
    base = tmp_path_factory.mktemp("mla")
    return {c: make_hf(base / c, *CASES[c], seed=i + 11) for i, c in enumerate(sorted(CASES))}


@pytest.fixture(scope="module")
def hf_logits(mla_ckpts):
    """transformers' logits at every position of the 3 sequences, per case (one model load each)."""
    import torch
    import transformers

    rng = np.random.default_rng(7)
    seqs = [[int(t) for t in rng.integers(0, VOCAB, n)] for n in SEQ_LENS]
    out = {}
    for case, ckpt in mla_ckpts.items():
        model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        with torch.no_grad():
            out[case] = [(s, model(torch.tensor([s])).logits[0].numpy().astype(np.float32)) for s in seqs]
    return out


def reference(ckpt: Path, spec=None) -> Reference:
    c = open_checkpoint(ckpt)
    return Reference(spec or c.spec, {n: c.get(n) for n in canonical_names(c.spec)}, max_seq=64)


def worst_error(ckpt: Path, runs, spec=None) -> float:
    """max over the sequences of max|reference - transformers| / max|transformers|, every position."""
    worst = 0.0
    for tokens, want in runs:
        r = reference(ckpt, spec)
        got = np.stack([r.forward([t]) for t in tokens])
        worst = max(worst, float(np.max(np.abs(got - want)) / np.max(np.abs(want))))
    return worst


def test_spec_features(mla_ckpts):
    s = {c: open_checkpoint(p).spec for c, p in mla_ckpts.items()}
    assert s["v2"].arch == "deepseek-v2" and s["v3"].arch == "deepseek-v3"
    for spec in s.values():
        assert spec.mla and spec.kv_lora_rank == 16 and spec.head_dim == 4 and spec.qk_nope_head_dim == 8
        assert spec.v_head_dim == 6 and spec.dense_layers == (0,) and spec.dense_ffn == 48 and spec.shared_ffn == 16
    assert s["v2"].q_lora_rank == 0 and s["v3"].q_lora_rank == 24
    v2 = s["v2"]
    assert (v2.router_scoring, v2.group_score, v2.n_group, v2.topk_group) == ("softmax", "max", 2, 1)
    assert not s["v2"].norm_topk_prob and s["v2"].routed_scale == 1.5
    assert (s["v3"].router_scoring, s["v3"].group_score) == ("sigmoid", "top2_sum") and s["v3"].norm_topk_prob
    assert s["v3"].routed_scale == 2.5 and not s["v3_half"].norm_topk_prob and s["v3_half"].tied
    names = canonical_names(s["v3"])
    assert "layers.1.moe.choice_bias" in names and "layers.0.attn.q_a" in names and "layers.0.attn.k" not in names
    assert "layers.0.attn.q" in canonical_names(s["v2"]) and "layers.1.moe.choice_bias" not in canonical_names(s["v2"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_matches_transformers(case, mla_ckpts, hf_logits):
    assert worst_error(mla_ckpts[case], hf_logits[case]) <= 1e-5


@pytest.mark.parametrize("case, mutation", [
    ("v3", "bias"),            # the expert bias left out of the choice
    ("v3_half", "group_max"),  # groups scored by their best expert instead of the sum of their best two
    ("v2", "no_groups"),       # group-limited greedy taken as plain greedy
    ("v3", "no_permutation"),  # the interleaved rope rows left as they are on disk
    ("v2", "no_permutation"),
])
def test_the_fixtures_see_each_routing_and_rope_detail(case, mutation, mla_ckpts, hf_logits, monkeypatch):
    """Each detail matters for these checkpoints: the reference without it is ten times the tolerance off."""
    spec = open_checkpoint(mla_ckpts[case]).spec
    if mutation == "bias":
        real = ref_mod.route_grouped
        monkeypatch.setattr(ref_mod, "route_grouped", lambda logits, s, bias=None: real(logits, s, None))
    elif mutation == "group_max":
        monkeypatch.setattr(ref_mod, "group_scores", lambda choice, s: choice.reshape(s.n_group, -1).max(axis=1))
    elif mutation == "no_groups":
        spec = dataclasses.replace(spec, group_score="none", n_group=1, topk_group=1)
    else:
        monkeypatch.setattr(deepseek_v2, "rope_permutation", lambda n: np.arange(n))
    err = worst_error(mla_ckpts[case], hf_logits[case], spec)
    assert err > 1e-4, err  # ten times the tolerance


def test_latent_cache_is_the_formula(mla_ckpts):
    """`colibri inspect` says the compressed cache (kv_lora_rank + qk_rope_head_dim f32 per position and layer)
    and the plain one (every head's key and value), both computed here from config.json."""
    ckpt = mla_ckpts["v3"]
    cfg = json.loads((ckpt / "config.json").read_text())
    seq, layers = cfg["max_position_embeddings"], cfg["num_hidden_layers"]
    latent = 4 * layers * seq * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"])
    plain = 4 * layers * seq * cfg["num_attention_heads"] * (
        cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"] + cfg["v_head_dim"])
    out = subprocess.run([sys.executable, "-m", "colibri.toolchain.cli", "inspect", str(ckpt)], capture_output=True,
                         text=True, check=True).stdout
    assert f"KV cache at max_seq {seq}: latent {latent} bytes, plain K+V {plain} bytes" in out
    r = reference(ckpt)
    assert r.k_cache[0, 0].size + r.v_cache[0, 0].size == latent // (4 * layers * seq)


V2_CFG = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", **_BASE, "q_lora_rank": None}
V3_CFG = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", **_BASE, "q_lora_rank": 24,
          "n_group": 2, "topk_group": 1}


@pytest.mark.parametrize("cfg, key", [
    ({**V2_CFG, "qk_rope_head_dim": 7}, "qk_rope_head_dim"),  # an odd rope dim
    ({**V3_CFG, "qk_rope_head_dim": 0}, "qk_rope_head_dim"),
    ({**V3_CFG, "rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({**V3_CFG, "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "rope_theta": 1e4}}, "rope_parameters"),
    ({**V2_CFG, "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({**V2_CFG, "topk_method": "noaux_tc"}, "topk_method"),
    ({**V2_CFG, "topk_method": "group_limited_greedy", "n_group": 3, "topk_group": 1}, "n_group"),
    ({**V2_CFG, "topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 3}, "topk_group"),
    ({**V2_CFG, "scoring_func": "sigmoid"}, "scoring_func"),
    ({**V2_CFG, "norm_topk_prob": True}, "norm_topk_prob"),
    ({**V2_CFG, "moe_layer_freq": 2}, "moe_layer_freq"),
    ({**V3_CFG, "topk_method": "greedy"}, "topk_method"),
    ({**V3_CFG, "scoring_func": "softmax"}, "scoring_func"),
    ({**V3_CFG, "n_group": 8, "topk_group": 2}, "n_group"),  # groups of one expert: no top-2 sum
    ({**V3_CFG, "num_key_value_heads": 2}, "num_key_value_heads"),
    ({**V3_CFG, "attention_bias": True}, "attention_bias"),
    ({**V3_CFG, "kv_lora_rank": None}, "kv_lora_rank"),
    ({**V3_CFG, "q_lora_rank": 0}, "q_lora_rank"),
    ({**V3_CFG, "tie_word_embeddings": "yes"}, "tie_word_embeddings"),
    ({**V3_CFG, "hidden_act": "gelu"}, "hidden_act"),
])
def test_unsupported_config_names_the_key(cfg, key, tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportError, match=f"'{key}'"):
        open_checkpoint(d)


def test_class_defaults_and_spellings(tmp_path):
    """Keys a config.json leaves out take the config class's defaults; attribute_map spellings are read."""
    from colibri.codegen.importers import find_importer

    cfg = {k: v for k, v in V3_CFG.items() if k not in ("n_group", "topk_group", "n_routed_experts",
                                                          "first_k_dense_replace")}
    cfg.update(num_local_experts=16, n_group=2, topk_group=1)  # V3's attribute_map spelling
    spec = find_importer(cfg, tmp_path).parse_config(cfg, tmp_path / "config.json")
    assert spec.n_experts == 16 and spec.dense_layers == (0, 1, 2) and spec.routed_scale == 2.5
    v2 = {k: v for k, v in V2_CFG.items() if k != "n_routed_experts"} | {"num_experts": 4, "head_dim": 99}
    spec = find_importer(v2, tmp_path).parse_config(v2, tmp_path / "config.json")
    assert spec.n_experts == 4 and spec.group_score == "none" and spec.routed_scale == 1.0
    assert spec.head_dim == 4 and spec.rope_theta == 10000.0  # the classes overwrite head_dim with the rope dim


@pytest.mark.parametrize("arch, q_lora", [("deepseek-v2", 0), ("deepseek-v3", 16)])
def test_synth_writes_what_transformers_loads(arch, q_lora, tmp_path):
    """`colibri synth --arch deepseek-v2/v3`: transformers loads the checkpoint and the reference agrees."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ckpt = synth(tmp_path / arch, arch=arch, layers=2, hidden=32, ffn=16, heads=4, kv_heads=4, experts=4, top_k=2,
                 vocab=VOCAB, seed=5, dense_layers=[0], dense_ffn=24)
    spec = open_checkpoint(ckpt).spec
    assert spec.q_lora_rank == q_lora and spec.mla and spec.dense_layers == (0,)
    tokens = [3, 17, 42, 5, 9, 1, 2, 88]
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(torch.tensor([tokens])).logits[0].numpy().astype(np.float32)
    assert worst_error(ckpt, [(tokens, want)]) <= 1e-5


def test_absorbed_attention_is_the_reference(mla_ckpts):
    """The latent cache with the up-projections absorbed (q_nope·W_UK per head into latent space, the
    attention-weighted latent through W_UV): the reference's attention output up to float reassociation."""
    c = open_checkpoint(mla_ckpts["v3"])
    s, w = c.spec, {n: c.get(n).astype(np.float64) for n in canonical_names(c.spec)}
    r = reference(mla_ckpts["v3"])
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((7, s.hidden)).astype(np.float32)
    nope, rank, p = s.qk_nope_head_dim, s.kv_lora_rank, "layers.0."
    kv_b = w[p + "attn.kv_b"].reshape(s.n_heads, nope + s.v_head_dim, rank)
    w_uk, w_uv = kv_b[:, :nope], kv_b[:, nope:]
    latents, ropes = [], []
    for pos, x in enumerate(xs):
        want = r._mla(0, x)
        r.pos += 1
        q = w[p + "attn.q_b"] @ ref_mod.rms_norm(w[p + "attn.q_a"] @ x, w[p + "attn.q_a_norm"], 1e-6)
        q = q.reshape(s.n_heads, -1)
        ckv = w[p + "attn.kv_a"] @ x
        cos, sin = ref_mod.rope_cos_sin(r.inv_freq, pos)
        latents.append(ref_mod.rms_norm(ckv[:rank], w[p + "attn.kv_a_norm"], 1e-6))
        ropes.append(ref_mod.apply_rope(ckv[rank:][None], cos, sin)[0])
        q_pe = ref_mod.apply_rope(q[:, nope:], cos, sin)
        lat, kpe = np.stack(latents), np.stack(ropes)
        q_lat = np.einsum("hd,hdr->hr", q[:, :nope], w_uk)  # each head's q_nope into latent space
        scores = (q_lat @ lat.T + q_pe @ kpe.T) / np.sqrt(s.qk_head_dim)
        probs = np.exp(scores - scores.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        out = np.einsum("hvr,hr->hv", w_uv, probs @ lat)  # the weighted latent, then W_UV per head
        got = w[p + "attn.o"] @ out.reshape(-1)
        assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want)), pos


def test_v3_multi_token_prediction_layers_are_ignored(mla_ckpts, tmp_path):
    """DeepSeek-V3 checkpoints carry their MTP module as layer num_hidden_layers: transformers ignores it."""
    import shutil

    from safetensors.numpy import load_file, save_file

    ckpt = tmp_path / "v3"
    shutil.copytree(mla_ckpts["v3"], ckpt)
    tensors = load_file(ckpt / "model.safetensors")
    n = json.loads((ckpt / "config.json").read_text())["num_hidden_layers"]
    tensors[f"model.layers.{n}.eh_proj.weight"] = np.zeros((4, 4), dtype=np.float32)
    save_file(tensors, ckpt / "model.safetensors")
    assert open_checkpoint(ckpt).spec.n_layers == n
    tensors[f"model.layers.{n - 1}.self_attn.k_proj.weight"] = np.zeros((4, 4), dtype=np.float32)
    save_file(tensors, ckpt / "model.safetensors")
    with pytest.raises(ExportError, match="k_proj"):
        open_checkpoint(ckpt)


# The C runtime's cases without group-limited top-k (mla_ckpts has the group-limited ones), every other path.
C_CASES = {
    # plain q_proj, softmax greedy top-k, routed scale
    "v2_greedy": ("DeepseekV2Config", dict(_BASE, q_lora_rank=None, routed_scaling_factor=1.5)),
    # q latent, sigmoid scores with the expert bias, renormalised, routed scale 2.5, one group; an rms_norm_eps
    # the latent norms do not take
    "v3_flat": ("DeepseekV3Config", dict(_BASE, q_lora_rank=24, n_group=1, topk_group=1, rms_norm_eps=1e-2)),
}
PROMPT = [3, 17, 42, 5, 9]
N_GEN = 16


@pytest.fixture(scope="module")
def c_ckpts(tmp_path_factory):
    base = tmp_path_factory.mktemp("mla_c")
    return {c: make_hf(base / c, *C_CASES[c], seed=i + 21) for i, c in enumerate(sorted(C_CASES))}


def c_reference(ckpt: Path, weights=None) -> Reference:
    """The reference on the checkpoint's weights, or on a blob's (blobread.weights)."""
    c = open_checkpoint(ckpt)
    return Reference(c.spec, weights if weights is not None else {n: c.get(n) for n in canonical_names(c.spec)},
                     max_seq=64)


def expectation(ckpt: Path, quant: str, out: Path):
    """The reference's logits of PROMPT and its 16 greedy tokens, on the blob's dequantized weights for
    int8c (and its integer matmuls' activations)."""
    ref = c_reference(ckpt, None if quant == "f32" else blob_weights(out / "model.bin"))
    logits = ref.forward(PROMPT)
    ref.reset()
    return logits, ref.generate(PROMPT, N_GEN)


def test_c_fixtures_match_transformers(c_ckpts):
    import torch
    import transformers

    for case, ckpt in c_ckpts.items():
        model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        tokens = PROMPT + [int(t) for t in np.random.default_rng(1).integers(0, VOCAB, 20)]
        with torch.no_grad():
            want = model(torch.tensor([tokens])).logits[0].numpy().astype(np.float32)
        assert worst_error(ckpt, [(tokens, want)]) <= 1e-5, case


@pytest.mark.parametrize("quant", ["f32", "int8c"])
@pytest.mark.parametrize("case", sorted(C_CASES))
def test_host_matches_reference(case, quant, c_ckpts, build_model):
    out = build_model(c_ckpts[case], quant)
    want_logits, want_tokens = expectation(c_ckpts[case], quant, out)
    m = load(out / "model.bin")
    got = m.forward(PROMPT)
    if quant == "f32":
        assert float(np.max(np.abs(got - want_logits))) <= 1e-4 * float(np.max(np.abs(want_logits)))
    m.reset()
    assert m.generate(PROMPT, N_GEN) == want_tokens, f"{case} {quant}: greedy tokens differ"
    m.reset()  # a prefill of the prompt in one block equals it token by token
    step = [m.forward([t]) for t in PROMPT][-1]
    assert float(np.max(np.abs(step - got))) <= 1e-5 * float(np.max(np.abs(got)))


@pytest.mark.parametrize("case", ["v2", "v3"])
def test_host_group_limited_matches_reference(case, mla_ckpts, build_model):
    """Group-limited top-k in C (GROUP_TOPK with its N_GROUP, TOPK_GROUP parameters): V2's groups by their
    best softmax score, V3's by the sum of their best two biased sigmoid scores, as the reference."""
    out = build_model(mla_ckpts[case], "f32")
    recs = {k: v for k, _, v in blobread.params_records((out / "model.bin").read_bytes())}
    assert (recs[32], recs[33]) == (2, 1)  # N_GROUP, TOPK_GROUP as config.json says
    want_logits, want_tokens = expectation(mla_ckpts[case], "f32", out)
    m = load(out / "model.bin")
    got = m.forward(PROMPT)
    assert float(np.max(np.abs(got - want_logits))) <= 1e-4 * float(np.max(np.abs(want_logits)))
    m.reset()
    assert m.generate(PROMPT, N_GEN) == want_tokens, f"{case}: greedy tokens differ"


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("case", sorted(C_CASES))
def test_every_target_matches_reference(case, quant, c_ckpts, build_model):
    ckpt = c_ckpts[case]
    check_every_target(build_model, ckpt, quant, lambda w: c_reference(ckpt, w), PROMPT, N_GEN, what=case)


def test_every_target_group_limited_matches_reference(mla_ckpts, build_model):
    """V3's group-limited top-k (GROUP_TOPK) on every target."""
    ckpt = mla_ckpts["v3"]
    check_every_target(build_model, ckpt, "f32", lambda w: c_reference(ckpt, w), PROMPT, N_GEN, what="v3 groups")


def test_arena_holds_the_latent_cache(c_ckpts, build_model):
    """The planned KV cache is the latent formula: kv_lora_rank + qk_rope_head_dim f32 per position and
    layer (each cache 64-byte aligned), computed here from config.json and the export's max_seq; the
    export's arena line says it against the plain K+V."""
    out = build_model(c_ckpts["v3_flat"], "f32")
    cfg = json.loads((c_ckpts["v3_flat"] / "config.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    seq, layers = manifest["max_seq"], cfg["num_hidden_layers"]
    assert seq == cfg["max_position_embeddings"]

    def aligned(n):
        return -(-n // 64) * 64

    want = aligned(4 * layers * seq * cfg["kv_lora_rank"]) + aligned(4 * layers * seq * cfg["qk_rope_head_dim"])
    assert manifest["arena"]["kv_cache_bytes"] == want
    plain = 4 * layers * seq * cfg["num_attention_heads"] * (
        cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"] + cfg["v_head_dim"])
    assert manifest["arena"]["plain_kv_cache_bytes"] == plain


def _index(raw: bytes, name: str) -> int:
    return next(i for i, e in enumerate(blobread.entries(raw)) if blobread.canonical_name(e) == name)


def _flag(bit: int):
    def mutate(b: bytearray) -> bytearray:
        struct.pack_into("<I", b, 28, struct.unpack_from("<I", b, 28)[0] | 1 << bit)
        return b
    return mutate


def _field(name: str, offset: int, delta: int):
    def mutate(b: bytearray) -> bytearray:
        at = blobread.entry_offset(_index(bytes(b), name)) + offset
        struct.pack_into("<I", b, at, struct.unpack_from("<I", b, at)[0] + delta)
        return b
    return mutate


BAD_MLA = {  # (mutation, status): FORMAT.md "MLA"; 6 BAD_HEADER, 8 BAD_TENSOR
    "group-limited top-k without its parameters": (_flag(23), 6),
    "MLA with a 16-bit cache": (_flag(14), 6),
    "MLA with q/k/v biases": (_flag(1), 6),
    "layer 0 kv_b rows not whole heads": (_field("layers.0.attn.kv_b", 8, 1), 8),
    "layer 1 kv_b of another latent width": (_field("layers.1.attn.kv_b", 12, 1), 8),
    "layer 0 q_b rows of another nope width": (_field("layers.0.attn.q_b", 8, 4), 8),
    "layer 1 q_a of another q latent": (_field("layers.1.attn.q_a", 8, 1), 8),
    "router bias of another expert count": (_field("layers.1.moe.choice_bias", 12, 1), 8),
}


@pytest.mark.parametrize("case", sorted(BAD_MLA))
def test_bad_mla_blob_returns_its_code(case, c_ckpts, build_model, tmp_path):
    """A malformed MLA blob: its status from colibri_run, never a crash."""
    out = build_model(c_ckpts["v3_flat"], "f32")
    mutate, status = BAD_MLA[case]
    raw = bytearray((out / "model.bin").read_bytes())
    bad = mutate(raw)
    struct.pack_into("<I", bad, 8, zlib.crc32(bytes(bad[12:])))
    blob = tmp_path / "bad.bin"
    blob.write_bytes(bytes(bad))
    res = subprocess.run([out / "colibri_run", blob, "--generate", "2"], capture_output=True, text=True)
    assert res.returncode == 3, f"exit {res.returncode}: {res.stderr}"
    assert f"(status {status})" in res.stderr, res.stderr


def _param(key: int, value: int):
    """Sets the value of the blob's parameter record of `key` (FORMAT.md "Parameters")."""
    def mutate(b: bytearray) -> bytearray:
        e = blobread.entries(bytes(b))[-2 if blobread.header(bytes(b))["flags"] & blobread.TOKENIZER_FLAG else -1]
        at = next(e["data_off"] + 8 * i for i, r in enumerate(blobread.params_records(bytes(b))) if r[0] == key)
        struct.pack_into("<I", b, at + 4, value)
        return b
    return mutate


BAD_GROUPS = {  # the v3 fixture: 8 experts, top_k 2, N_GROUP (32) 2, TOPK_GROUP (33) 1; all BAD_HEADER (6)
    "N_GROUP 0": _param(32, 0),
    "N_GROUP 3 not dividing 8 experts": _param(32, 3),
    "N_GROUP 8: one group of one expert holds fewer than top_k": _param(32, 8),
    "TOPK_GROUP 0": _param(33, 0),
    "TOPK_GROUP 3 above N_GROUP": _param(33, 3),
}


@pytest.mark.parametrize("case", sorted(BAD_GROUPS))
def test_bad_group_params_return_bad_header(case, mla_ckpts, build_model, tmp_path):
    out = build_model(mla_ckpts["v3"], "f32")
    bad = BAD_GROUPS[case](bytearray((out / "model.bin").read_bytes()))
    struct.pack_into("<I", bad, 8, zlib.crc32(bytes(bad[12:])))
    blob = tmp_path / "bad.bin"
    blob.write_bytes(bytes(bad))
    res = subprocess.run([out / "colibri_run", blob, "--generate", "2"], capture_output=True, text=True)
    assert res.returncode == 3, f"exit {res.returncode}: {res.stderr}"
    assert "(status 6)" in res.stderr, res.stderr


# DeepSeek's YaRN: the attention factor from mscale / mscale_all_dim on cos and sin, the softmax scale times
# get_mscale(factor, mscale_all_dim)²; positions past original_max_position_embeddings (32).
YARN_V3 = dict(_BASE, q_lora_rank=24, n_group=1, topk_group=1, rope_parameters=dict(
    rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=32, mscale=1.0,
    mscale_all_dim=0.7))


@pytest.fixture(scope="module")
def yarn_v3(tmp_path_factory):
    return make_hf(tmp_path_factory.mktemp("mla_yarn") / "v3_yarn", "DeepseekV3Config", YARN_V3, seed=31)


def test_yarn_reference_matches_transformers(yarn_v3, monkeypatch):
    import torch
    import transformers

    from colibri.codegen import rope

    spec = open_checkpoint(yarn_v3).spec
    assert spec.rope_type == "yarn" and spec.rope_mscale_all_dim == 0.7
    model = transformers.AutoModelForCausalLM.from_pretrained(yarn_v3, dtype=torch.float32).eval()
    tokens = [int(t) for t in np.random.default_rng(2).integers(0, VOCAB, 40)]
    with torch.no_grad():
        want = model(torch.tensor([tokens])).logits[0].numpy().astype(np.float32)
    assert worst_error(yarn_v3, [(tokens, want)]) <= 1e-5
    monkeypatch.setattr(rope, "softmax_mscale", lambda s: 1.0)  # the mscale_all_dim factor matters here
    assert worst_error(yarn_v3, [(tokens, want)]) > 1e-4


def test_yarn_host_matches_reference(yarn_v3, build_model):
    out = build_model(yarn_v3, "f32")
    want_logits, want_tokens = expectation(yarn_v3, "f32", out)
    m = load(out / "model.bin")
    got = m.forward(PROMPT)
    assert float(np.max(np.abs(got - want_logits))) <= 1e-4 * float(np.max(np.abs(want_logits)))
    m.reset()
    assert m.generate(PROMPT, N_GEN) == want_tokens
