"""Expert-parallel load per dispatch: how many tokens the hottest EP rank receives in one dispatch.

Why per dispatch and per layer: tokens per expert summed over layers, ranks and the whole window wash the
skew out, and the guide asks for the hot expert and the hot rank of a single operation (one MoE layer, one
microbatch, one EP group), rank balance apart from expert balance (a rank holds several experts).

How, bounded and without a host sync inside the timed steps:
- The router hook (orchestrator.job.instrument) gives, per MoE layer and counted microbatch, the rows this rank
  dispatches to each EP rank (its routing map summed over each EP rank's experts, still on the device).
  DispatchSamples keeps a systematic sample of at most `capacity` of them: every stride-th dispatch, the
  stride doubling when the sample is full. The ranks of one EP group run the same layers and microbatches,
  so they keep the same dispatch indices.
- After the last measured step, one all-reduce over the EP group sums those samples and the per-expert
  totals (orchestrator.job.instrument.RouterCounter.finish_window): the sum over senders of what went to EP rank j in
  dispatch d is what EP rank j received in d.
- `layer_summary` turns one layer's reduced numbers into the sidecar's `ep_load` entry; EP rank 0 of each
  group writes it. orchestrator.evidence.metrics.moe_evidence takes percentiles over every sampled dispatch of every
  layer.

Stdlib only at import: the tensors are handled by the caller (torch is imported there, on the node).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_CAPACITY = 64  # sampled dispatches kept per MoE layer


@dataclass
class DispatchSamples:
    """A deterministic sample of at most `capacity` dispatches of one layer: (dispatch index, per-EP-rank
    rows) for every stride-th dispatch; the stride doubles (dropping every other kept one) when full."""

    capacity: int = DEFAULT_CAPACITY
    stride: int = 1
    seen: int = 0
    kept: list[tuple[int, Any]] = field(default_factory=list)

    def add(self, per_rank: Any) -> None:
        index, self.seen = self.seen, self.seen + 1
        if index % self.stride:
            return
        self.kept.append((index, per_rank))
        if len(self.kept) > self.capacity:
            self.stride *= 2
            self.kept = [(i, t) for i, t in self.kept if i % self.stride == 0]


def layer_summary(
    layer: str, receive: Sequence[Sequence[int]], expert_tokens: Sequence[int], dispatches: int
) -> dict[str, Any]:
    """One layer's `ep_load` entry. receive: per sampled dispatch, the rows each EP rank received (summed
    over the EP group); expert_tokens: rows each expert received over the window (summed over the group)."""
    hot = [max(r) for r in receive if r]
    share = [max(r) / sum(r) if sum(r) else None for r in receive if r]
    rank = [list(r).index(max(r)) for r in receive if r]
    mean = sum(expert_tokens) / len(expert_tokens) if expert_tokens else 0.0
    top = max(range(len(expert_tokens)), key=lambda e: (expert_tokens[e], -e)) if expert_tokens else None
    return {
        "layer": layer,
        "dispatches": dispatches,
        "ep_size": len(receive[0]) if receive else None,
        "hot_rank_tokens": hot,
        "hot_rank_share": share,
        "hot_rank": rank,
        "hot_expert": top,
        "hot_expert_ratio": expert_tokens[top] / mean if top is not None and mean else None,
    }
