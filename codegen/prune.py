"""Compile-time expert pruning: drop the experts a calibration set never routes to.

The reference (float32, source weights) runs every calibration sequence and counts, per layer, how often
each expert is in the top-k. An expert is dropped when it is never chosen, or when its router row is all
zero; the rest are renumbered 0.. in their original order (so ties still go to the lower index).

The blob keeps one n_experts for all layers, so every layer keeps as many experts as the layer that needs
the most; a layer with fewer routed experts keeps, of its unrouted ones, those with the highest mean
routing probability on the calibration set (never fewer than top_k). The generated model.h and blob hold
only the kept experts.

Dropping experts removes their terms from the routing softmax: with norm_topk_prob the renormalised
weights of the chosen experts are unchanged (up to rounding); without it (Qwen2-MoE, OLMoE) they grow
slightly. Either way the export reports the measured change of the logits on the calibration set.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .reference import Reference
from .spec import ModelSpec, canonical_names


@dataclasses.dataclass
class PrunePlan:
    spec: ModelSpec  # the pruned model
    keep: dict[int, list[int]]  # MoE layer -> original indices of the kept experts, in new order
    counts: dict[int, list[int]]  # MoE layer -> times each original expert was routed
    zero_rows: dict[int, list[int]]  # MoE layer -> experts whose router row is all zero

    def dropped(self, n_experts: int) -> dict[int, list[int]]:
        return {layer: [e for e in range(n_experts) if e not in kept] for layer, kept in self.keep.items()}

    def to_json(self, n_experts: int) -> dict:
        return {
            "n_experts": {"before": n_experts, "after": self.spec.n_experts},
            "kept": {str(k): v for k, v in self.keep.items()},
            "dropped": {str(k): v for k, v in self.dropped(n_experts).items()},
            "routed_counts": {str(k): v for k, v in self.counts.items()},
            "zero_router_rows": {str(k): v for k, v in self.zero_rows.items() if v},
        }


def _run(spec: ModelSpec, weights, seqs: list[list[int]], max_seq: int) -> tuple[list[np.ndarray], dict, dict]:
    ref = Reference(spec, weights, max_seq=max_seq)
    logits, counts = [], {layer: np.zeros(spec.n_experts, np.int64) for layer in spec.moe_layers}
    mass = {layer: np.zeros(spec.n_experts, np.float64) for layer in spec.moe_layers}
    for seq in seqs:
        ref.reset()
        for t in seq[:max_seq]:
            logits.append(ref.forward([t]))
            for layer, chosen in enumerate(ref.routing):
                if layer in counts:
                    counts[layer][chosen] += 1
                    mass[layer] += ref.router_probs[layer]
    return logits, counts, mass


def plan_pruning(spec: ModelSpec, weights, seqs: list[list[int]], max_seq: int) -> tuple[PrunePlan, list]:
    logits, counts, mass = _run(spec, weights, seqs, max_seq)
    zero_rows, used = {}, {}
    for layer in spec.moe_layers:
        router = np.asarray(weights.get(f"layers.{layer}.moe.router"))
        zero_rows[layer] = [int(e) for e in np.flatnonzero(~router.any(axis=1))]
        used[layer] = [e for e in range(spec.n_experts) if counts[layer][e] > 0 and e not in zero_rows[layer]]
    n_keep = max([spec.top_k] + [len(u) for u in used.values()])
    keep = {}
    for layer, kept in used.items():
        spare = sorted((e for e in range(spec.n_experts) if e not in kept and e not in zero_rows[layer]),
                       key=lambda e: (-mass[layer][e], e))
        if len(kept) + len(spare) < n_keep:  # only zero rows left to fill with
            spare += [e for e in zero_rows[layer] if e not in kept]
        keep[layer] = sorted(kept + spare[: n_keep - len(kept)])
    pruned = dataclasses.replace(spec, n_experts=n_keep)
    plan = PrunePlan(pruned, keep, {k: [int(c) for c in v] for k, v in counts.items()}, zero_rows)
    return plan, logits


class PrunedWeights:
    """The source checkpoint seen through a PrunePlan: canonical names of the pruned model -> arrays."""

    def __init__(self, source, plan: PrunePlan) -> None:
        self.source = source
        self.plan = plan
        self.source_dtypes = {}
        for name in canonical_names(plan.spec):
            self.source_dtypes[name] = source.source_dtypes.get(self._source_name(name), "F32")

    def _source_name(self, name: str) -> str:
        parts = name.split(".")
        if len(parts) == 6 and parts[2:4] == ["moe", "experts"]:
            parts[4] = str(self.plan.keep[int(parts[1])][int(parts[4])])
        return ".".join(parts)

    def get(self, name: str) -> np.ndarray:
        w = self.source.get(self._source_name(name))
        parts = name.split(".")
        if len(parts) == 4 and parts[2:] == ["moe", "router"]:
            w = np.ascontiguousarray(w[self.plan.keep[int(parts[1])]])
        return w


def accuracy_change(spec: ModelSpec, weights, seqs: list[list[int]], max_seq: int, before: list) -> dict:
    """Logits of the pruned model against the unpruned ones, position by position on the calibration set."""
    ref = Reference(spec, weights, max_seq=max_seq)
    worst, agree, i = 0.0, 0, 0
    for seq in seqs:
        ref.reset()
        for t in seq[:max_seq]:
            got, want = ref.forward([t]), before[i]
            i += 1
            worst = max(worst, float(np.max(np.abs(got - want))) / (float(np.max(np.abs(want))) or 1.0))
            agree += int(np.argmax(got) == np.argmax(want))
    return {"max_rel_logit_change": worst, "argmax_agreement": agree / max(i, 1), "positions": i}
