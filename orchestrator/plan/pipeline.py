"""Pipeline arithmetic: microbatches m, the bubble, the 61-block split and Megatron's hybrid pattern.

Why: B = b x D_a x m fixes m, and m decides the bubble (guide: p=8, m=32/4/16 -> 17.9%/63.6%/30.4%).
61 blocks do not divide by 8, and the first/last segments carry embedding, output head, loss and MTP,
so the split is balanced on estimated time, then written as Megatron dev's hybrid layer pattern with
'|' between pipeline segments (segment i runs on PP rank i % PP, virtual chunk i // PP) and '/' before
each MTP depth. That path forbids --pipeline-model-parallel-layout and the old VPP flags.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, TypeVar

from orchestrator.core.schema import ModelConfig, StageConfig
from orchestrator.plan.layout import Layout
from orchestrator.plan.params import (
    RATIO_SYMBOL,
    ModelKey,
    _Frozen,
    block_ratios,
    effective_layers,
    is_v4,
    model_key,
    mtp_ratio,
)

N = TypeVar("N", int, float)
ATTENTION_SYMBOLS = frozenset("CHWD*+")  # one per block in an attention+MLP pattern
MOE_SYMBOL, MLP_SYMBOL, PIPE, MTP_SEPARATOR = "E", "-", "|", "/"
GPT_EMBEDDING, GPT_MTP, GPT_LOSS = "E", "m", "L"  # --pipeline-model-parallel-layout symbols besides 't'


def microbatches(global_batch: int, mbs: int, d_a: int) -> int:
    """m = B / (b D_a): microbatches each pipeline accumulates per update."""
    denom = mbs * d_a
    if denom <= 0 or global_batch % denom or global_batch < denom:
        raise ValueError(f"B={global_batch} is not a positive multiple of b x D_a = {mbs} x {d_a}")
    return global_batch // denom


def bubble(pp: int, m: int, vpp: int = 1) -> float:
    """Idle fraction of a balanced 1F1B pipeline: (p-1)/(m+p-1); interleaved: (p-1)/(v m + p-1)."""
    if pp <= 1:
        return 0.0
    return (pp - 1) / (vpp * m + pp - 1)


def segments_of_rank(rank: int, pp: int, vpp: int) -> tuple[int, ...]:
    """Pattern segments that PP rank `rank` runs: rank, rank + PP, ... (one per virtual chunk)."""
    return tuple(rank + v * pp for v in range(vpp))


def cumulative(xs: Iterable[N]) -> tuple[N, ...]:
    """Prefix sums with a leading 0: sum(xs[a:z]) = out[z] - out[a]."""
    out: list[N] = []
    s: Any = 0
    out.append(s)
    for x in xs:
        s += x
        out.append(s)
    return tuple(out)


def rank_sums(
    prefixes: Sequence[Sequence[float]], blocks_per_segment: Sequence[int], pp: int, vpp: int
) -> tuple[tuple[float, ...], ...]:
    """Per PP rank, each per-block quantity (given as its `cumulative` prefix sums) summed over the blocks
    of the rank's segments (segments_of_rank): O(segments) per rank whatever the block count. The memory
    and step-time models both split their per-block sums this way."""
    starts = cumulative(blocks_per_segment)
    out = []
    for r in range(pp):
        acc: list[float] = [0] * len(prefixes)  # an int prefix (block counts) sums to an int
        for s in segments_of_rank(r, pp, vpp):
            a, z = starts[s], starts[s + 1]
            for j, arr in enumerate(prefixes):
                acc[j] += arr[z] - arr[a]
        out.append(tuple(acc))
    return tuple(out)


def split_blocks(
    num_blocks: int,
    segments: int,
    costs: Sequence[float] | None = None,
    first_extra: float = 0.0,
    last_extra: float = 0.0,
    min_first: int = 1,
) -> list[int]:
    """Split num_blocks contiguous blocks into `segments` pieces minimizing the slowest piece.

    costs: per-block estimated time (default 1 each); first_extra: embedding work on segment 0;
    last_extra: output head, loss and MTP work on the last segment. Every segment gets >= 1 block
    (the first >= min_first) and the counts sum to num_blocks. Deterministic: the smallest feasible
    cap on the slowest segment is found by bisection over greedy packings; among splits meeting it,
    the evenest (cuts at equal shares of the cumulative cost, least sum of squared loads) wins.
    """
    c = tuple(float(x) for x in costs) if costs is not None else (1.0,) * num_blocks
    if len(c) != num_blocks:
        raise ValueError(f"{len(c)} costs for {num_blocks} blocks")
    return list(_split(c, segments, float(first_extra), float(last_extra), max(1, min_first)))


@lru_cache(maxsize=1024)
def _split(costs: tuple[float, ...], k: int, first: float, last: float, min_first: int) -> tuple[int, ...]:
    n = len(costs)
    if k < 1 or n < k or n - min_first < k - 1:
        raise ValueError(f"cannot split {n} blocks into {k} segments of >= 1 block (first >= {min_first})")
    if k == 1:
        return (n,)

    def pack(cap: float) -> tuple[int, ...] | None:
        """Greedy left-to-right packing under cap into exactly k segments, or None if it cannot."""
        out: list[int] = []
        cur, cnt = first, 0
        for i, x in enumerate(costs):
            later = k - len(out) - 1  # segments still to open after the current one
            # full, or the rest must be one block each
            if cnt and later and cnt >= (1 if out else min_first) and (cur + x > cap or n - i == later):
                out.append(cnt)
                cur, cnt = 0.0, 0
            cur += x
            cnt += 1
            if cur > cap:
                return None
        out.append(cnt)
        if len(out) != k or cur + last > cap:
            return None
        return tuple(out)

    lo, hi = max(costs), sum(costs) + first + last
    greedy = pack(hi)
    if greedy is None:
        raise ValueError(f"cannot split {n} blocks into {k} segments")
    for _ in range(60):  # bisection for the smallest cap that packs
        mid = (lo + hi) / 2
        got = pack(mid)
        if got is None:
            lo = mid
        else:
            hi, greedy = mid, got
        if hi - lo <= 1e-9 * hi:
            break
    cap = hi * (1 + 1e-9)
    # Among splits that meet the cap, prefer the evenest: fix the last segment's size, cut the rest
    # at equal shares of their cumulative cost, keep the split with the smallest sum of squares.
    best, best_score = greedy, _score(costs, greedy, first, last)
    tail = last
    for n_last in range(1, n - (k - 1) + 1):
        tail += costs[n - n_last]
        if tail > cap:
            break
        head = _equal_shares(costs[: n - n_last], k - 1, first, min_first)
        if head is None:
            continue
        cand = (*head, n_last)
        sc = _score(costs, cand, first, last)
        if sc[0] <= cap and sc < best_score:
            best, best_score = cand, sc
    return best


def _loads(costs: Sequence[float], counts: Sequence[int], first: float, last: float) -> list[float]:
    out, i = [], 0
    for c in counts:
        out.append(sum(costs[i : i + c]))
        i += c
    out[0] += first
    out[-1] += last
    return out


def _score(costs: Sequence[float], counts: Sequence[int], first: float, last: float) -> tuple[float, float]:
    loads = _loads(costs, counts, first, last)
    return (max(loads), sum(x * x for x in loads))


def _equal_shares(costs: Sequence[float], k: int, first: float, min_first: int) -> tuple[int, ...] | None:
    """Cut `costs` into k segments at the block boundaries nearest to equal shares of the cumulative cost."""
    n = len(costs)
    if n < k or n - min_first < k - 1:
        return None
    cum = [first]
    for x in costs:
        cum.append(cum[-1] + x)
    cuts, prev = [], 0
    for j in range(1, k):
        lo_i = prev + (min_first if j == 1 else 1)
        hi_i = n - (k - j)
        if lo_i > hi_i:
            return None
        target = cum[n] * j / k
        b = min(range(lo_i, hi_i + 1), key=lambda i: (abs(cum[i] - target), i))
        cuts.append(b)
        prev = b
    bounds = [0, *cuts, n]
    return tuple(bounds[i + 1] - bounds[i] for i in range(k))


def layer_pattern(model: ModelConfig, blocks_per_segment: Sequence[int]) -> str:
    """Megatron dev hybrid layer pattern: per block the attention symbol of its CSA ratio
    (4 -> C, 128 -> H, 0 -> W) then E (MoE) or - (dense MLP for the first num_dense_layers blocks);
    '|' between segments; then '/' + the MTP block once per MTP depth (ratio entry after num_layers).
    A GPT-path model (mla, gqa) gets its --pipeline-model-parallel-layout instead (gpt_layout)."""
    if not is_v4(model):
        return gpt_layout(model, blocks_per_segment)
    return _pattern(model_key(model), tuple(blocks_per_segment))


def gpt_layout(model: ModelConfig, blocks_per_segment: Sequence[int]) -> str:
    """The GPT path's --pipeline-model-parallel-layout for these segments: 'E' (embedding) opens the first, 't'
    per decoder layer ('t*n' for n), '|' between segments, 'm' per MTP depth and 'L' (loss) close the last, so the
    MTP layers sit in the last virtual stage of the last rank as Megatron requires (megatron/core/transformer/
    pipeline_parallel_layer_layout.py validate_layer_layout, 0.19.2). Segment i runs on PP rank i % PP."""
    if any(b < 1 for b in blocks_per_segment):
        raise ValueError("every segment needs >= 1 block")
    segs = [(f"t*{b}" if b > 1 else "t") for b in blocks_per_segment]
    segs[0] = GPT_EMBEDDING + segs[0]
    segs[-1] += GPT_MTP * int(model.mtp_num_layers or 0) + GPT_LOSS
    return PIPE.join(segs)


@lru_cache(maxsize=4096)
def _pattern(key: ModelKey, bps: tuple[int, ...]) -> str:
    d = dict(key)
    n = sum(bps)
    model = _Frozen(key)
    syms = [
        RATIO_SYMBOL[r] + (MOE_SYMBOL if i >= d["num_dense_layers"] else MLP_SYMBOL)
        for i, r in enumerate(block_ratios(model, n))
    ]
    segs, i = [], 0
    for b in bps:
        if b < 1:
            raise ValueError("every segment needs >= 1 block")
        segs.append("".join(syms[i : i + b]))
        i += b
    out = PIPE.join(segs)
    depths = int(d.get("mtp_num_layers") or 0)
    if depths:
        out += (MTP_SEPARATOR + RATIO_SYMBOL[mtp_ratio(model)] + MOE_SYMBOL) * depths
    return out


def count_blocks(pattern: str) -> list[int]:
    """Blocks per pipeline segment of a hybrid pattern (attention symbols between '|'; MTP excluded)."""
    main = pattern.split(MTP_SEPARATOR)[0]
    return [sum(ch in ATTENTION_SYMBOLS for ch in seg) for seg in main.split(PIPE)]


def hash_layer_number(pattern: str, moe_blocks: int) -> int:
    """The --moe-n-hash-layers value that hash-routes the first `moe_blocks` MoE blocks of a hybrid pattern.

    On the hybrid path every symbol is its own layer, numbered i + 1 + offset through the whole pattern
    (megatron/core/models/hybrid/hybrid_block.py:617-618 at dev d48bd6be0a85; the offset counts the
    symbols of the earlier segments, megatron/core/models/hybrid/hybrid_layer_allocation.py:486), and the
    router hash-routes when layer_number <= moe_n_hash_layers (megatron/core/transformer/moe/router.py:
    202-206): so the value is the layer number of the moe_blocks-th MoE symbol (on 'HEHECE...' 3 -> 6).
    """
    if moe_blocks <= 0:
        return 0
    moe_numbers = [i + 1 for i, ch in enumerate(_layer_symbols(pattern)) if ch == MOE_SYMBOL]
    if len(moe_numbers) < moe_blocks:
        raise ValueError(f"pattern has {len(moe_numbers)} MoE layers, {moe_blocks} should be hash-routed")
    return moe_numbers[moe_blocks - 1]


def moe_layers_through(pattern: str, layer_number: int) -> int:
    """MoE layers numbered <= layer_number in a hybrid pattern: the ones --moe-n-hash-layers hash-routes."""
    return _layer_symbols(pattern)[: max(0, layer_number)].count(MOE_SYMBOL)


def _layer_symbols(pattern: str) -> list[str]:
    """The main pattern's layer symbols in Megatron's numbering order ('|' and the MTP part left out)."""
    return [ch for ch in pattern.split(MTP_SEPARATOR)[0] if ch not in f"{PIPE} "]


def mtp_depths(pattern: str) -> int:
    """MTP depths in a hybrid pattern (one '/' each)."""
    return pattern.count(MTP_SEPARATOR)


def checked_split(
    model: ModelConfig, stage: StageConfig, layout: Layout, blocks_per_segment: Sequence[int]
) -> tuple[tuple[int, ...], int]:
    """(blocks per segment, total blocks) after checking the split fits the layout (PP x VPP segments)
    and the model (every block placed once); the memory and step-time models both start from it."""
    bps = tuple(blocks_per_segment)
    if len(bps) != layout.pp * layout.vpp:
        raise ValueError(f"{len(bps)} segments for PP{layout.pp} x VPP{layout.vpp}")
    n = sum(bps)
    if n != effective_layers(model, stage):
        raise ValueError(f"split has {n} blocks, model has {effective_layers(model, stage)}")
    return bps, n
