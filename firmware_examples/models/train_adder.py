"""Train colibri's demo model: a tiny Mixtral-architecture MoE that adds decimal numbers.

PyTorch is a *development-only* dependency of colibri: it is needed to (re)train this
checkpoint, never to compile or run it. Use a separate virtualenv::

    python3 -m venv /work/torchvenv
    /work/torchvenv/bin/pip install torch==2.13.0 numpy safetensors
    /work/torchvenv/bin/python firmware_examples/models/train_adder.py --out firmware_examples/models/adder

The model is written out as a HuggingFace Mixtral checkpoint (``config.json`` +
``model.safetensors`` with HF tensor names, float32) plus ``task.json`` describing the
prompt format. The module below follows HF ``MixtralForCausalLM`` exactly: RMSNorm,
rotary embeddings (rotate_half convention), grouped-query causal attention, softmax
router over all experts in float32, top-k with renormalised weights, SwiGLU experts, no
biases. If ``transformers`` is importable, the saved checkpoint is reloaded with
``MixtralForCausalLM.from_pretrained`` and its logits are compared with ours.

The task format (tokens, held-out split) lives in ``adder_task.py`` next to this file.
Training is deterministic for a given ``--seed`` (data from ``random.Random``, weights
from ``torch.manual_seed``) on a fixed thread count.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import adder_task as task  # noqa: E402


@dataclass
class Config:
    vocab_size: int = task.VOCAB_SIZE
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    num_local_experts: int = 4
    num_experts_per_tok: int = 2
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32
    router_aux_loss_coef: float = 0.02  # training only; inference ignores it

    def hf_dict(self) -> dict:
        d = asdict(self)
        d.update(
            architectures=["MixtralForCausalLM"],
            model_type="mixtral",
            hidden_act="silu",
            tie_word_embeddings=False,
            torch_dtype="float32",
            attention_dropout=0.0,
            sliding_window=None,
            output_router_logits=False,
            bos_token_id=task.BOS,
            eos_token_id=task.EOS,
            pad_token_id=task.PAD,
            initializer_range=0.02,
            use_cache=True,
        )
        return d


# --------------------------------------------------------------------------- model


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(cfg: Config, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        hd, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.q_proj = nn.Linear(cfg.hidden_size, nh * hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, nkv * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        hd, nh, nkv = self.cfg.head_dim, self.cfg.num_attention_heads, self.cfg.num_key_value_heads
        q = self.q_proj(x).view(b, t, nh, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, nkv, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, nkv, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(hd))
        return self.o_proj(y.transpose(1, 2).reshape(b, t, nh * hd))


class Expert(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.w2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.w3 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoe(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_local_experts, bias=False)
        self.experts = nn.ModuleList(Expert(cfg) for _ in range(cfg.num_local_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (output, router logits [N, E], selected experts [N, top_k])."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.gate(x)
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        weights, selected = torch.topk(probs, self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token_idx, slot = torch.where(selected == e)
            if token_idx.numel() == 0:
                continue
            y = expert(x[token_idx]) * weights[token_idx, slot, None]
            out.index_add_(0, token_idx, y)
        return out.reshape(shape), logits, selected


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.block_sparse_moe = SparseMoe(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        y, logits, selected = self.block_sparse_moe(self.post_attention_layernorm(x))
        return x + y, logits, selected


class Backbone(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class MixtralForCausalLM(nn.Module):
    """Compact re-implementation of HF MixtralForCausalLM (same parameter names)."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        cos, sin = rope_cos_sin(cfg, cfg.max_position_embeddings)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        t = ids.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.model.embed_tokens(ids)
        router_logits, selected = [], []
        for layer in self.model.layers:
            x, lg, sel = layer(x, cos, sin)
            router_logits.append(lg)
            selected.append(sel)
        return self.lm_head(self.model.norm(x)), router_logits, selected


def load_balancing_loss(router_logits: list[torch.Tensor], top_k: int, mask: torch.Tensor) -> torch.Tensor:
    """HF Mixtral's auxiliary loss (Switch Transformer style), over the non-padding tokens."""
    n_exp = router_logits[0].shape[-1]
    logits = torch.cat([lg[mask] for lg in router_logits], dim=0)
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)
    _, selected = torch.topk(probs, top_k, dim=-1)
    tokens_per_expert = F.one_hot(selected, n_exp).float().mean(dim=0)  # [top_k, E]
    prob_per_expert = probs.mean(dim=0)  # [E]
    return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * n_exp


# --------------------------------------------------------------------------- data


def training_batch(rng: random.Random, batch: int, max_digits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) for ``batch`` non-held-out problems; targets are -100 outside the answer."""
    seqs, starts = [], []
    while len(seqs) < batch:
        a = task.sample_operand(rng, max_digits)
        b = task.sample_operand(rng, max_digits)
        if task.is_heldout(a, b):
            continue
        prompt, answer = task.format_problem(a, b)
        seqs.append(task.encode_example(prompt, answer))
        starts.append(len(task.encode_prompt(prompt)))
    width = max(len(s) for s in seqs)
    ids = torch.full((batch, width), task.PAD, dtype=torch.long)
    tgt = torch.full((batch, width - 1), -100, dtype=torch.long)
    for i, (s, start) in enumerate(zip(seqs, starts, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        # position p predicts token p + 1; the answer starts at token index ``start``
        tgt[i, start - 1 : len(s) - 1] = torch.tensor(s[start:])
    return ids[:, :-1], tgt


@torch.no_grad()
def greedy_answers(model: MixtralForCausalLM, prompts: list[str], max_new: int) -> list[str]:
    """Greedy decoding (no KV cache; sequences are tiny), batched by prompt length."""
    by_len: dict[int, list[int]] = {}
    encoded = [task.encode_prompt(p) for p in prompts]
    for i, e in enumerate(encoded):
        by_len.setdefault(len(e), []).append(i)
    answers = [""] * len(prompts)
    for idxs in by_len.values():
        ids = torch.tensor([encoded[i] for i in idxs])
        start = ids.shape[1]
        for _ in range(max_new):
            logits, _, _ = model(ids)
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        for row, i in zip(ids[:, start:].tolist(), idxs, strict=True):
            answers[i] = task.decode_answer(row)
    return answers


def exact_match(model, problems: list[tuple[str, str]], max_digits: int) -> tuple[float, list]:
    model.eval()
    got = greedy_answers(model, [p for p, _ in problems], max_new=max_digits + 2)
    model.train()
    wrong = [(p, a, g) for (p, a), g in zip(problems, got, strict=True) if g != a]
    return 1.0 - len(wrong) / len(problems), wrong


def token_role(tok: int, after_eq: bool) -> str:
    if tok == task.BOS:
        return "bos"
    if tok in (ord("+"), ord("=")):
        return chr(tok)
    return "answer" if after_eq else "operand"


@torch.no_grad()
def routing_histogram(model: MixtralForCausalLM, problems: list[tuple[str, str]]) -> dict:
    """Per layer: fraction of held-out tokens routed to each expert (a token counts for
    each of its top-k experts, so a row sums to top_k), overall and by token role.
    Tokens are the teacher-forced inputs: BOS, prompt bytes and answer bytes."""
    model.eval()
    n_exp = model.cfg.num_local_experts
    n_layers = model.cfg.num_hidden_layers
    counts = [Counter() for _ in range(n_layers)]
    by_role: list[dict[str, Counter]] = [{} for _ in range(n_layers)]
    for prompt, answer in problems:
        seq = task.encode_example(prompt, answer)[:-1]
        _, _, selected = model(torch.tensor([seq]))
        roles, after_eq = [], False
        for tok in seq:
            roles.append(token_role(tok, after_eq))
            after_eq = after_eq or tok == ord("=")
        for layer, sel in enumerate(selected):
            for role, experts in zip(roles, sel.tolist(), strict=True):
                counts[layer].update(experts)
                counts[layer]["tokens"] += 1
                by_role[layer].setdefault(role, Counter()).update(experts)
                by_role[layer][role]["tokens"] += 1
    model.train()

    def frac(c: Counter) -> list[float]:
        return [round(c[e] / c["tokens"], 4) for e in range(n_exp)]

    return {
        f"layer{layer}": {
            "all": frac(counts[layer]),
            "by_role": {role: frac(c) for role, c in sorted(by_role[layer].items())},
        }
        for layer in range(n_layers)
    }


@torch.no_grad()
def int8_weight_copy(model: MixtralForCausalLM) -> MixtralForCausalLM:
    """Copy of ``model`` whose matrices went through symmetric int8 with one scale per row
    (weight-only; the norms stay float): a preview of colibri's plain ``int8`` quantization."""
    q = MixtralForCausalLM(model.cfg)
    q.load_state_dict(model.state_dict())
    for p in q.parameters():
        if p.dim() == 2:
            scale = p.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0
            scale = scale.half().float()  # colibri stores the row scales as fp16
            p.copy_(torch.clamp(torch.round(p / scale), -127, 127) * scale)
    return q


# --------------------------------------------------------------------------- export


def save_checkpoint(model: MixtralForCausalLM, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(model.cfg.hf_dict(), indent=2) + "\n")


def verify_against_hf(model: MixtralForCausalLM, out: Path, problems: list[tuple[str, str]]) -> dict:
    """Reload the saved checkpoint with transformers (if installed) and compare logits."""
    try:
        from transformers import MixtralForCausalLM as HFMixtral
    except ImportError:
        return {"checked": False, "reason": "transformers not importable"}
    hf = HFMixtral.from_pretrained(str(out), torch_dtype=torch.float32).eval()
    model.eval()
    max_diff = 0.0
    with torch.no_grad():
        for prompt, answer in problems[:64]:
            ids = torch.tensor([task.encode_example(prompt, answer)])
            ours, _, _ = model(ids)
            theirs = hf(ids).logits
            max_diff = max(max_diff, (ours - theirs).abs().max().item())
    model.train()
    import transformers

    return {"checked": True, "transformers": transformers.__version__, "max_abs_logit_diff": max_diff}


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "adder")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--heldout-seed", type=int, default=20240601)
    ap.add_argument("--n-heldout", type=int, default=1000)
    ap.add_argument("--max-digits", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--aux-coef", type=float, default=0.02)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--ffn", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--experts", type=int, default=4)
    # One intra-op thread: the matrices are tiny, and on a busy 2-core machine two OpenMP
    # threads were measured ~15x slower (each barrier waits for a descheduled thread).
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=500)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    cfg = Config(
        hidden_size=args.hidden,
        intermediate_size=args.ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        num_local_experts=args.experts,
        router_aux_loss_coef=args.aux_coef,
    )
    model = MixtralForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"config {asdict(cfg)}\nparameters {n_params}", flush=True)

    heldout = task.make_problems(args.heldout_seed, args.n_heldout, args.max_digits)
    probe = task.make_problems(args.heldout_seed + 1, 200, args.max_digits)  # progress only

    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.98),
    )

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        frac = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))

    t0 = time.time()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        ids, tgt = training_batch(rng, args.batch, args.max_digits)
        logits, router_logits, _ = model(ids)
        ce = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), tgt.reshape(-1), ignore_index=-100)
        aux = load_balancing_loss(router_logits, cfg.num_experts_per_tok, (ids != task.PAD).reshape(-1))
        loss = ce + cfg.router_aux_loss_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % args.eval_every == 0 or step == 0:
            acc, _ = exact_match(model, probe, args.max_digits)
            print(
                f"step {step + 1:5d}  ce {ce.item():.4f}  aux {aux.item():.3f}  lr {lr_at(step):.2e}  "
                f"probe {acc:.3f}  {time.time() - t0:6.0f}s",
                flush=True,
            )
    train_seconds = time.time() - t0

    acc, wrong = exact_match(model, heldout, args.max_digits)
    acc_int8, _ = exact_match(int8_weight_copy(model), heldout, args.max_digits)
    hist = routing_histogram(model, heldout)
    save_checkpoint(model, args.out)
    hf_check = verify_against_hf(model, args.out, heldout)
    task_info = {
        "bos": task.BOS,
        "eos": task.EOS,
        "pad": task.PAD,
        "vocab_size": cfg.vocab_size,
        "format": "a+b=",
        "reversed_answer": task.REVERSED_ANSWER,
        "max_digits": args.max_digits,
        "heldout_rule": f"zlib.crc32(b'a+b') % {task.HELDOUT_MODULUS} == 0",
        "heldout_seed": args.heldout_seed,
        "n_heldout": args.n_heldout,
        "max_new_tokens": args.max_digits + 2,
    }
    (args.out / "task.json").write_text(json.dumps(task_info, indent=2) + "\n")
    report = {
        "parameters": n_params,
        "train_seconds": round(train_seconds, 1),
        "torch": torch.__version__,
        "threads": args.threads,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "heldout_exact_match": acc,
        "heldout_errors": [list(w) for w in wrong[:20]],
        "heldout_exact_match_int8_weights": acc_int8,
        "routing_histogram": hist,
        "hf_check": hf_check,
    }
    (args.out / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in report if k != "args"}, indent=2))


if __name__ == "__main__":
    main()
