"""`colibri synth`'s dense configs carry no router keys: a dense family's HF config class has none.

A key the class lacks is not harmless: tools that read config.json directly take it at its word (llama.cpp's
converter writes a dense Llama's `num_experts_per_tok` as the expert count used, and llama.cpp then aborts on
the model: more experts used than it has). The reference is transformers' own config class for the
model_type, instantiated with defaults.
"""

from __future__ import annotations

import json

import pytest

from colibri.codegen.synth import DENSE_ARCHES

from conftest import synth

ROUTER_KEYS = ("num_experts_per_tok", "router_aux_loss_coef", "output_router_logits", "num_experts",
               "num_local_experts", "n_routed_experts", "moe_intermediate_size")


@pytest.mark.parametrize("arch", DENSE_ARCHES)
def test_dense_synth_config_has_no_router_keys(arch, tmp_path):
    transformers = pytest.importorskip("transformers")  # conftest turns a skip into a failure under CI=true
    ckpt = synth(tmp_path / arch, arch=arch, layers=1, hidden=32, ffn=32, heads=4, kv_heads=2, experts=1,
                 top_k=1, vocab=64, seed=1)
    cfg = json.loads((ckpt / "config.json").read_text())
    known = set(transformers.CONFIG_MAPPING[cfg["model_type"]]().to_dict())
    assert not [k for k in ROUTER_KEYS if k in known], "the reference class itself has router keys"
    extra = [k for k in ROUTER_KEYS if k in cfg]
    assert not extra, f"{arch}: config.json has {extra}, keys {cfg['model_type']}'s config class does not have"
