"""Logits from HuggingFace transformers itself for a checkpoint directory (dev-only: torch, transformers).

The independent reference the numpy reference and the C runtime are held to. Used live by
test_hf_live.py and by fixtures/make_hf_families.py, which records the logits test_families.py reads
when transformers is not at hand.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# colibri families whose HF class ships with transformers (DeepSeek-MoE's is remote code)
HF_NATIVE = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")


def versions() -> dict[str, str]:
    import torch
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__}


def transformers_logits(ckpt: Path, tokens: list[int]) -> np.ndarray:
    """Logits at every position of `tokens` (one sequence from an empty cache), float32, shape (n, vocab)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].numpy().astype(np.float32)
