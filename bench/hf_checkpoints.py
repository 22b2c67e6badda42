"""Make the three kinds of checkpoint the quantization table is measured on, with HuggingFace transformers.

    .venv/bin/python bench/hf_checkpoints.py OUT_DIR [--seed 0] [--layers 4 --hidden 256 ...]

writes OUT_DIR/plain, OUT_DIR/heavy and OUT_DIR/outlier, each a MixtralForCausalLM saved by
`save_pretrained` (model.safetensors + config.json):
- plain: transformers' own random initialisation (normal, std initializer_range = --init-std);
- heavy: the same model with every matrix redrawn from a Student-t (3 degrees of freedom) of the same
  standard deviation, so that a few weights lie far out in the tails;
- outlier: plain with OUTLIER_COLS input columns of every matrix (embedding included: its columns are the
  hidden features) multiplied by OUTLIER_GAIN, the outlier features real LLM weights and activations have.
Norms stay as transformers makes them (ones). Needs the dev-only torch and transformers (`dev.sh setup`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from colibri.codegen.synth import OUTLIER_CHANNEL_GAIN

OUTLIER_COLS = 4  # input columns scaled up in every matrix
OUTLIER_GAIN = OUTLIER_CHANNEL_GAIN  # the same as `colibri synth --outlier-channels`
# transformers' default initializer_range (0.02) gives a 256-wide model near-uniform next-token
# distributions, where every quantization's KL is ~1e-4; 1/sqrt(256) keeps activations at unit scale
# through the layers, so the logits are as peaked as a trained model's and KL tells formats apart
INIT_STD = 0.0625
KINDS = ("plain", "heavy", "outlier")


def _matrices(state: dict) -> list[str]:
    return [k for k, v in state.items() if v.ndim == 2]


def make(out: Path, *, seed: int, layers: int, hidden: int, ffn: int, heads: int, kv_heads: int,
         experts: int, top_k: int, vocab: int, init_std: float) -> list[Path]:
    """Write the three checkpoints under `out`; returns their directories."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    cfg = MixtralConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv_heads, num_local_experts=experts,
                        num_experts_per_tok=top_k, max_position_embeddings=256, tie_word_embeddings=False,
                        initializer_range=init_std,
                        torch_dtype="float32")
    model = MixtralForCausalLM(cfg).eval()
    plain = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(seed)
    variants: dict[str, dict] = {"plain": plain, "heavy": {}, "outlier": {}}
    for k, v in plain.items():
        if v.ndim != 2:
            variants["heavy"][k] = v.clone()
            variants["outlier"][k] = v.clone()
            continue
        std = float(v.float().std())
        t = rng.standard_t(3, size=tuple(v.shape)) / np.sqrt(3.0)  # unit variance
        variants["heavy"][k] = torch.from_numpy((t * std).astype(np.float32))
        w = v.clone()
        cols = rng.choice(v.shape[1], size=min(OUTLIER_COLS, v.shape[1]), replace=False)
        w[:, torch.from_numpy(cols)] *= OUTLIER_GAIN
        variants["outlier"][k] = w
    dirs = []
    for kind in KINDS:
        model.load_state_dict(variants[kind])
        d = out / kind
        model.save_pretrained(d, safe_serialization=True)
        dirs.append(d)
    return dirs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--init-std", type=float, default=INIT_STD,
                    help=f"std of the random weights (transformers' initializer_range; default {INIT_STD})")
    a = ap.parse_args()
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print("hf_checkpoints.py: torch and transformers are needed (bash toolchain/dev.sh setup)", file=sys.stderr)
        return 2
    for d in make(a.out, seed=a.seed, layers=a.layers, hidden=a.hidden, ffn=a.ffn, heads=a.heads,
                  kv_heads=a.kv_heads, experts=a.experts, top_k=a.top_k, vocab=a.vocab,
                  init_std=a.init_std):
        print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
