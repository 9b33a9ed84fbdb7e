"""MoE arithmetic of the guide: expert batch per dispatch, routed-weight memory, routing skew.

Why separate: these are the guide's own formulas (T_group, E[T_expert], the routed-weight table), which
tests assert to the digit, and memory/steptime build on them.
"""

from __future__ import annotations

import math


def t_group(ep: int, mbs: int, seq_length: int, cp: int) -> int:
    """Unique tokens one EP group dispatches per microbatch: T_group = EP x b S / CP."""
    return ep * mbs * seq_length // cp


def t_expert(k: int, t_group: int, num_experts: int) -> float:
    """Mean routed assignments one expert receives (uniform routing): E[T_expert] = k T_group / E."""
    return k * t_group / num_experts


def experts_per_rank(num_experts: int, ep: int) -> int:
    """Routed experts each EP rank holds per MoE layer: E / EP (EP must divide E)."""
    if num_experts % ep:
        raise ValueError(f"EP{ep} does not divide {num_experts} experts")
    return num_experts // ep


def routed_weight_gb(
    num_moe_layers: int, num_experts: int, ep: int, etp: int, p_expert: int, bytes_per_param: int = 2
) -> float:
    """Resident routed-expert weights on one GPU, decimal GB: L x (E / EP) x P_expert / ETP x bytes.

    The guide's lower bound (8 layers, BF16, ETP1): EP32/64/128 -> 12.68 / 6.34 / 3.17 GB.
    """
    return num_moe_layers * (num_experts / ep) * p_expert / etp * bytes_per_param / 1e9


def hot_rank_factor(sigma: float, experts_per_rank: int, ep: int) -> float:
    """Expected load of the hottest EP rank over the mean, for lognormal per-expert loads.

    Each expert's load is lognormal with log-sigma `sigma` (CV c = sqrt(exp(sigma^2) - 1)); a rank sums
    E/EP experts, so its CV is c / sqrt(E/EP); the maximum of EP roughly normal rank loads sits about
    sqrt(2 ln EP) deviations above the mean. sigma = 0 (balanced or force-balanced routing) gives 1.
    Hot experts are what the receive buffers and the all-to-all wait on, not the mean.
    """
    if sigma <= 0 or ep <= 1:
        return 1.0
    cv = math.sqrt(math.expm1(sigma * sigma)) / math.sqrt(max(1, experts_per_rank))
    return 1.0 + cv * math.sqrt(2.0 * math.log(ep))


def rank_skew(sigma: float, num_experts: int, ep: int, capacity_factor: float | None = None) -> float:
    """The hot-rank skew both the memory and the step-time model use: hot_rank_factor with E / EP experts per
    rank, capped by a capacity factor. Megatron caps every expert at capacity_factor x its mean share
    (megatron/core/transformer/moe/moe_utils.py:205-223, get_capacity) and drops the rest, so no rank
    receives more than capacity_factor x the mean."""
    skew = hot_rank_factor(sigma, num_experts // ep, ep)
    if capacity_factor is not None and capacity_factor > 0:
        skew = min(skew, capacity_factor)
    return skew


def traffic_skew(dispatcher: str, skew: float) -> float:
    """How much the hot rank's skew scales its dispatch traffic: not at all for the allgather dispatcher,
    which gathers every token of the TP x EP group to every rank and reduce-scatters them back whatever
    the routing (megatron/core/transformer/moe/token_dispatcher.py:314-316, 380-382)."""
    return 1.0 if dispatcher == "allgather" else skew


def dispatch_receive_tokens(t_group: int, k: int, ep: int, skew: float = 1.0) -> float:
    """Routed assignments the hottest rank receives per dispatch: (k T_group / EP) x skew."""
    return k * t_group / ep * skew


def dispatch_buffer_gb(t_group: int, k: int, ep: int, hidden: int, skew: float = 1.0, bytes_per_elem: int = 2) -> float:
    """Dispatch + combine receive buffers of one MoE layer on the hottest rank, decimal GB.

    2 buffers x received assignments x h x bytes; `skew` is rank_skew's (a capacity factor already caps it).
    """
    return 2 * dispatch_receive_tokens(t_group, k, ep, skew) * hidden * bytes_per_elem / 1e9


def min_nodes(group_size: int, gpus_per_node: int) -> int:
    """Fewest nodes a group of `group_size` GPUs can span: ceil(size / GPUs per node).

    Guide: with 8 GPUs per node EP64 spans at least 8 nodes, so expert traffic crosses the network.
    """
    return -(-group_size // gpus_per_node)
