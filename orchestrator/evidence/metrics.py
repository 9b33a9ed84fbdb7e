"""Parsed logs + sidecars -> the metric fields of a JobResult.

Why these definitions:
- Window: iterations 1..warmup are excluded (compilation, allocator growth, NCCL setup); the next
  `measure_iters` iterations are measured. If the job stopped early, only the completed ones are
  used and `partial` is set: numbers are never extrapolated.
- Percentiles use linear interpolation between closest ranks (Hyndman-Fan type 7, numpy's default
  "linear"): p at rank h = (n-1)*p/100 of the sorted values, interpolated between floor(h) and ceil(h).
- Throughput uses the step-time p50, not the mean: one slow step (checkpoint, GC, a straggler
  spike) should not move the ranking; mean and p95/p99 are kept beside it.
  tokens/s = B x S / step_p50; TFLOP/s/GPU = our model FLOPs per step / (step_p50 x N x 1e12);
  MFU = that / the hardware peak named in `mfu_peak`. Megatron's own TFLOP/s field (its FLOP model,
  which ignores sparse attention, mHC, hash routing and drops) is kept separately as the median over
  the window. Recompute FLOPs are reported on their own, never inside MFU.
- Memory: Megatron prints `[Rank r] ... memory (MB)` only on DP-rank-0 GPUs; sidecars (one per
  rank, written by the router/memory hook) see every GPU, so a sidecar's peak overrides the log's
  for that rank and adds ranks the log never mentions. Megatron's "MB" is MiB (2**20 bytes); the
  result's "GB" is decimal (1e9 bytes), the unit of the guide and of the planner's memory model, so
  predicted and measured memory compare directly.
- GPU capacity: what the device holds, as the evidence states it: torch's OOM message ("GPU 0 has a total
  capacity of 96.00 GiB", binary units) or a sidecar's `gpu_total_memory_bytes`
  (torch.cuda.get_device_properties(0).total_memory). The smallest any rank states, in decimal GB, exactly
  (GiB x 2**30 / 1e9): the sweep plans with it instead of hardware.hbm_gb (orchestrator.sweep.capacity).

Sidecar JSON schema (`sidecar-rank-<r>.json`, one object per rank; every key but "rank" optional):
    {"rank": int, "simulated": bool, "pp_stage": int,
     "peak_allocated_mb": float, "peak_reserved_mb": float,          # torch.cuda.max_memory_*
     "gpu_total_memory_bytes": int,     # torch.cuda.get_device_properties(0).total_memory
     "tokens_per_expert": [int, ...],   # tokens this rank's router sent to each global expert,
                                        # summed over the window and MoE layers; written only by
                                        # ranks with distinct tokens (TP/CP replicas leave it out)
     "routed_tokens": int,              # token-expert assignments of real (unpadded) rows before capacity drop
     "dropped_tokens": int | null,      # assignments dropped by capacity; null = not measured
     "token_drop_unmeasured": str,      # why not (drops inside the dispatcher, orchestrator.job.instrument)
     "padded_tokens": int,              # expert-input slots that are padding (capacity padding, padding rows sent)
     "padding_rows": int,               # rows the padding mask marks (padding, never drops)
     "ep_load": [{"layer": str, "dispatches": int, "ep_size": int,   # EP rank 0 of each EP group, per MoE
                  "hot_rank_tokens": [int, ...], "hot_rank_share": [float, ...], "hot_rank": [int, ...],
                  "hot_expert": int, "hot_expert_ratio": float}, ...],  # layer (orchestrator.job.expert_load)
     "force_balanced_routing": bool,
     "lm_loss": [[iteration, value], ...],
     "node": str, "versions": {name: str}, "env": {NAME: str}}   # orchestrator.job.node.facts
Derived: token_drop_fraction = sum(dropped) / sum(routed), None (with token_drop_note) when any rank could
not measure it; padding_fraction = sum(padded) / (sum(routed) - sum(dropped) + sum(padded)) (share of expert
input slots that are padding); expert-load p50/p95/p99 are percentiles over experts of the summed
tokens_per_expert. With ep_load: hot_rank_tokens_p50/p95/p99 and hot_rank_share_p50/p95/p99 are percentiles
over every sampled dispatch (all MoE layers, all EP groups) of the tokens the hottest EP rank received and of
its share of the dispatch (1/EP when balanced); hot_expert_ratio and hot_expert are the most loaded expert
of one layer over the window against that layer's mean ("layer 12 expert 301"). Without ep_load (the twin)
hot_expert_ratio = max / mean of the summed tokens_per_expert. versions and run_env are the sidecars' "versions"
and "env" merged over ranks; a name whose value differs between ranks keeps every value ("a | b"): a job whose
nodes ran different software is evidence too.
"""

from __future__ import annotations

import bisect
import json
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.result import JobResult, RankMemory
from orchestrator.core.stats import percentile
from orchestrator.evidence.loglines import size_bytes
from orchestrator.evidence.records import IterationRecord, ParsedLog, TimerBlock

PpOfRank = Callable[[int], int | None] | Mapping[int, int] | None
GB_PER_MIB = 2**20 / 1e9  # Megatron's MB (MiB) -> decimal GB


@dataclass(frozen=True)
class Summary:
    p50: float | None
    p95: float | None
    p99: float | None
    mean: float | None
    max: float | None


MAD_SIGMA = 1.4826  # sigma = 1.4826 x median absolute deviation for a normal sample (robust to tails)
MIN_SAMPLES = 8  # fewer per-iteration times than this say nothing about the noise


def robust_cv(times: Sequence[float]) -> float | None:
    """Coefficient of variation of one window's per-iteration step times, from the median absolute deviation:
    a straggler iteration moves a mean/stdev a lot and the median (what the screen ranks on) hardly at all."""
    xs = [t for t in times if t and t > 0]
    if len(xs) < MIN_SAMPLES:
        return None
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    return MAD_SIGMA * mad / med


SETTLE_RUN = 5  # iterations whose median must be at the steady step: one straggler neither starts nor ends it
SETTLE_MIN = 0.02  # the steady line is at least 2% above the window's p50 ...
SETTLE_SIGMAS = 2.5  # ... and 2.5 noise sigmas above it (the window's robust CV)


def settled_iters(times: Sequence[tuple[int, float]], steady_s: float, cv: float | None) -> int | None:
    """How many leading iterations of a launch ran above its steady step (iteration 1 on, warm-up included):
    the iteration before the first one that is itself, and whose next SETTLE_RUN iterations' median is, under
    steady_s x (1 + max(SETTLE_MIN, SETTLE_SIGMAS x cv)). None when it never settles inside what ran.
    Why: a warm-started launch warms up only for compile, allocation and NCCL set-up, and how long that takes
    is a property of the cluster and the software, not something a config can know (the sweep learns it:
    orchestrator/schedule/fidelity.py learned_warmup)."""
    pts = sorted(dict(times).items())
    line = steady_s * (1.0 + max(SETTLE_MIN, SETTLE_SIGMAS * (cv or 0.0)))
    for k in range(len(pts) - SETTLE_RUN + 1):
        it, t = pts[k]
        if t <= line and statistics.median(x for _, x in pts[k : k + SETTLE_RUN]) <= line:
            return it - 1
    return None


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        return Summary(None, None, None, None, None)
    return Summary(
        percentile(values, 50), percentile(values, 95), percentile(values, 99), statistics.fmean(values), max(values)
    )


def window(
    iterations: Iterable[IterationRecord], warmup_iters: int, measure_iters: int
) -> tuple[list[IterationRecord], bool]:
    """(measured records, partial). Iterations warmup+1 .. warmup+measure; duplicates (the same
    iteration seen in several files) keep the last. partial: the job never reached the end."""
    by_it: dict[int, IterationRecord] = {}
    for r in iterations:
        by_it[r.iteration] = r
    end = warmup_iters + measure_iters
    measured = [by_it[i] for i in sorted(by_it) if warmup_iters < i <= end]
    last = max(by_it) if by_it else 0
    return measured, last < end


def _pp(pp_of_rank: PpOfRank, rank: int | None) -> int | None:
    if rank is None or pp_of_rank is None:
        return None
    if callable(pp_of_rank):
        return pp_of_rank(rank)
    return pp_of_rank.get(rank)


def load_sidecars(paths: Iterable[str | Path]) -> tuple[list[dict], list[str]]:
    """Read sidecar JSON files; unreadable ones are skipped (a killed rank may leave half a file)."""
    out, used = [], []
    for p in paths:
        try:
            data = json.loads(Path(p).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("rank"), int):
            out.append(data)
            used.append(str(p))
    return out, used


def rank_memory(
    logs: Sequence[ParsedLog], sidecars: Sequence[Mapping], pp_of_rank: PpOfRank = None
) -> list[RankMemory]:
    """Per-rank peak memory: max over a rank's log lines, then a sidecar's peak overrides it."""
    mem: dict[int, RankMemory] = {}
    for log in logs:
        for m in log.memory:
            cur = mem.get(m.rank)
            if cur is None:
                mem[m.rank] = RankMemory(m.rank, None, m.max_allocated, m.max_reserved, "log")
            else:
                cur.allocated_mb = max(cur.allocated_mb or 0.0, m.max_allocated)
                cur.reserved_mb = max(cur.reserved_mb or 0.0, m.max_reserved)
    for sc in sidecars:
        r = sc["rank"]
        alloc, resv = sc.get("peak_allocated_mb"), sc.get("peak_reserved_mb")
        if alloc is None and resv is None:
            continue
        cur = mem.get(r)
        mem[r] = RankMemory(
            r,
            None,
            alloc if alloc is not None else (cur.allocated_mb if cur else None),
            resv if resv is not None else (cur.reserved_mb if cur else None),
            "sidecar",
        )
    stage_of = {sc["rank"]: sc["pp_stage"] for sc in sidecars if sc.get("pp_stage") is not None}
    for r, rm in mem.items():
        rm.pp_stage = stage_of.get(r, _pp(pp_of_rank, r))
    return [mem[r] for r in sorted(mem)]


CAPACITY_FROM_OOM = "OOM message"  # JobResult.gpu_capacity_source: where the capacity was read
CAPACITY_FROM_DEVICE = "device properties"


def gpu_capacity(logs: Sequence[ParsedLog], sidecars: Sequence[Mapping] = ()) -> tuple[float | None, str]:
    """(GB, source): the smallest total device memory any rank states (an OOM message's capacity, a sidecar's
    `gpu_total_memory_bytes`), in decimal GB; (None, "") when nothing states it."""
    found: list[tuple[float, str]] = []
    for log in logs:
        for o in log.ooms:
            b = size_bytes(o.total_capacity) if o.total_capacity else None
            if b:
                found.append((b / 1e9, CAPACITY_FROM_OOM))
    for sc in sidecars:
        b = sc.get("gpu_total_memory_bytes")
        if isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0:
            found.append((float(b) / 1e9, CAPACITY_FROM_DEVICE))
    if not found:
        return None, ""
    return min(found, key=lambda f: f[0])


def heaviest(ranks: Sequence[RankMemory]) -> RankMemory | None:
    """The rank with the largest max-allocated (ties: larger max-reserved, then lower rank)."""
    if not ranks:
        return None
    return max(ranks, key=lambda m: (m.allocated_mb or 0.0, m.reserved_mb or 0.0, -m.rank))


def _in_window(after: int | None, lo: int, hi: int) -> bool:
    return after is not None and lo < after <= hi


def timers_summary(blocks: Sequence[TimerBlock]) -> dict[str, list[float | None]]:
    """name -> [median min, median max] over the blocks (min is None for max-only blocks)."""
    acc: dict[str, tuple[list[float], list[float]]] = {}
    for b in blocks:
        for name, (lo, hi) in b.timers.items():
            los, his = acc.setdefault(name, ([], []))
            if lo is not None:
                los.append(lo)
            his.append(hi)
    return {n: [statistics.median(lo) if lo else None, statistics.median(hi)] for n, (lo, hi) in acc.items()}


def _iteration_clock(logs: Sequence[ParsedLog]) -> Callable[[str | None], int | None]:
    """Timestamp -> the last iteration logged at or before it. Rank 0 prints straggler lines, the
    last rank prints iteration lines (another file), so a straggler line is placed by its clock."""
    marks = sorted((r.timestamp[:19], r.iteration) for log in logs for r in log.iterations if r.timestamp)
    keys = [m[0] for m in marks]

    def at(ts: str | None) -> int | None:
        if not ts or not marks:
            return None
        i = bisect.bisect_right(keys, ts[:19]) - 1
        return marks[i][1] if i >= 0 else None

    return at


def slowest_rank(logs: Sequence[ParsedLog], lo: int, hi: int) -> int | None:
    """Most frequent max-iteration-time rank in straggler lines (ties: larger summed MxRtt); else
    the rank with the largest forward-backward in per-rank ("all") timer blocks."""
    strag = [s for log in logs for s in log.stragglers if s.max_rtt_rank is not None]
    at = _iteration_clock(logs)
    in_win = [
        s for s in strag if _in_window(s.after_iteration if s.after_iteration is not None else at(s.timestamp), lo, hi)
    ] or strag
    if in_win:
        ranked = [(s.max_rtt_rank, s.max_rtt_ms or 0.0) for s in in_win if s.max_rtt_rank is not None]
        count = Counter(r for r, _ in ranked)
        total: dict[int, float] = {}
        for r, ms in ranked:
            total[r] = total.get(r, 0.0) + ms
        return max(count, key=lambda r: (count[r], total[r], -r))
    blocks = [b for log in logs for b in log.timers if b.per_rank]
    in_blk = [b for b in blocks if _in_window(b.after_iteration, lo, hi)] or blocks
    per_rank: dict[int, float] = {}
    for b in in_blk:
        ranks = b.per_rank.get("forward-backward") or next(iter(b.per_rank.values()), {})
        for r, ms in ranks.items():
            per_rank[r] = per_rank.get(r, 0.0) + ms
    return max(per_rank, key=lambda r: (per_rank[r], -r)) if per_rank else None


def moe_evidence(sidecars: Sequence[Mapping]) -> dict[str, float | str | None]:
    routed = sum(sc.get("routed_tokens") or 0 for sc in sidecars)
    dropped = sum(sc.get("dropped_tokens") or 0 for sc in sidecars)
    padded = sum(sc.get("padded_tokens") or 0 for sc in sidecars)
    unmeasured = next((sc["token_drop_unmeasured"] for sc in sidecars if sc.get("token_drop_unmeasured")), None)
    load: list[float] = []
    for sc in sidecars:
        tpe = sc.get("tokens_per_expert") or []
        if len(tpe) > len(load):
            load.extend([0.0] * (len(tpe) - len(load)))
        for i, v in enumerate(tpe):
            load[i] += v
    out: dict[str, float | str | None] = {
        "token_drop_fraction": dropped / routed if routed > 0 and unmeasured is None else None,
        "token_drop_note": unmeasured,
        "padding_fraction": (
            padded / (routed - dropped + padded) if routed - dropped + padded > 0 and (routed or padded) else None
        ),
        "expert_load_p50": percentile(load, 50),
        "expert_load_p95": percentile(load, 95),
        "expert_load_p99": percentile(load, 99),
        "hot_expert_ratio": None,
        "hot_expert": None,
    }
    if load and statistics.fmean(load) > 0:
        out["hot_expert_ratio"] = max(load) / statistics.fmean(load)
    out.update(_ep_load([layer for sc in sidecars for layer in sc.get("ep_load") or []]))
    return out


def _ep_load(layers: Sequence[Mapping]) -> dict[str, float | str | None]:
    """Per-dispatch hot-rank percentiles and the hottest expert of one layer, from sidecars' ep_load."""
    tokens = [float(x) for layer in layers for x in layer.get("hot_rank_tokens") or []]
    shares = [float(x) for layer in layers for x in layer.get("hot_rank_share") or [] if x is not None]
    out: dict[str, float | str | None] = {}
    for q in (50, 95, 99):
        out[f"hot_rank_tokens_p{q}"] = percentile(tokens, q)
        out[f"hot_rank_share_p{q}"] = percentile(shares, q)
    rated = [layer for layer in layers if layer.get("hot_expert_ratio") is not None]
    if rated:
        top = max(rated, key=lambda layer: layer["hot_expert_ratio"])
        out["hot_expert_ratio"] = float(top["hot_expert_ratio"])
        out["hot_expert"] = f"layer {top['layer']} expert {top['hot_expert']}"
    return out


def merged(sidecars: Sequence[Mapping], key: str) -> dict[str, str]:
    """The sidecars' `key` dicts merged over ranks, sorted by name; differing values joined with " | "."""
    seen: dict[str, list[str]] = {}
    for sc in sidecars:
        for name, value in (sc.get(key) or {}).items():
            values = seen.setdefault(str(name), [])
            if str(value) not in values:
                values.append(str(value))
    return {name: " | ".join(seen[name]) for name in sorted(seen)}


def compute(
    logs: Sequence[ParsedLog],
    sidecars: Sequence[Mapping] = (),
    *,
    warmup_iters: int,
    measure_iters: int,
    seq_length: int,
    n_gpus: int,
    global_batch: int | None = None,
    model_flops_per_step: float | None = None,
    recompute_flops_per_step: float | None = None,
    peak_tflops: float | None = None,
    peak_label: str = "",
    pp_of_rank: PpOfRank = None,
    result: JobResult | None = None,
    sidecar_paths: Sequence[str] = (),
) -> JobResult:
    """Fill (or create) a JobResult's metric fields. Leaves ok/failure fields to the caller
    (orchestrator/evidence/classify.py), except that a new result is ok only if something was measured."""
    logs = list(logs)
    measured, partial = window((r for log in logs for r in log.iterations), warmup_iters, measure_iters)
    simulated = any(log.simulated for log in logs) or any(sc.get("simulated") for sc in sidecars)
    res = result if result is not None else JobResult(ok=bool(measured), simulated=simulated)
    res.simulated = res.simulated or simulated
    res.warmup_iters, res.measure_iters_requested = warmup_iters, measure_iters
    res.measure_iters, res.partial = len(measured), partial
    res.log_paths = [log.path for log in logs if log.path]
    res.sidecar_paths = list(sidecar_paths)

    steps = [r.elapsed_ms / 1000.0 for r in measured]
    s = summarize(steps)
    res.step_times_s = steps
    res.step_p50_s, res.step_p95_s, res.step_p99_s = s.p50, s.p95, s.p99
    res.step_mean_s, res.step_max_s = s.mean, s.max
    if s.p50:
        everything = [(r.iteration, r.elapsed_ms / 1000.0) for log in logs for r in log.iterations]
        res.settled_iters = settled_iters(everything, s.p50, robust_cv(steps))
        gbs = global_batch or (
            statistics.median(r.global_batch_size for r in measured if r.global_batch_size)
            if any(r.global_batch_size for r in measured)
            else None
        )
        if gbs:
            res.tokens_per_s = gbs * seq_length / s.p50
            res.tokens_per_s_per_gpu = res.tokens_per_s / n_gpus
        if model_flops_per_step:
            res.tflops_per_gpu = model_flops_per_step / (s.p50 * n_gpus * 1e12)
            if peak_tflops:
                res.mfu = res.tflops_per_gpu / peak_tflops
                res.mfu_peak = peak_label or f"{peak_tflops:g} TFLOP/s"
        if recompute_flops_per_step:
            res.recompute_tflops_per_gpu = recompute_flops_per_step / (s.p50 * n_gpus * 1e12)
    meg = [r.tflops_per_gpu for r in measured if r.tflops_per_gpu is not None]
    res.megatron_tflops_per_gpu = statistics.median(meg) if meg else None

    res.rank_memory = rank_memory(logs, sidecars, pp_of_rank)
    top = heaviest(res.rank_memory)
    if top is not None:
        res.heaviest_rank, res.heaviest_pp_stage = top.rank, top.pp_stage
        res.peak_allocated_gb = top.allocated_mb * GB_PER_MIB if top.allocated_mb else None
        res.peak_reserved_gb = top.reserved_mb * GB_PER_MIB if top.reserved_mb else None

    lo, hi = warmup_iters, warmup_iters + measure_iters
    blocks = [b for log in logs for b in log.timers if _in_window(b.after_iteration, lo, hi)]
    res.timers_ms = timers_summary(blocks)
    res.slowest_rank = slowest_rank(logs, lo, hi)
    if res.slowest_rank is not None:
        stage = next((sc.get("pp_stage") for sc in sidecars if sc["rank"] == res.slowest_rank), None)
        res.slowest_stage = stage if stage is not None else _pp(pp_of_rank, res.slowest_rank)

    for k, v in moe_evidence(sidecars).items():
        setattr(res, k, v)
    res.force_balanced_routing = any(bool(sc.get("force_balanced_routing")) for sc in sidecars)
    res.versions, res.run_env = merged(sidecars, "versions"), merged(sidecars, "env")

    res.lm_loss = [r.losses["lm loss"] for r in measured if "lm loss" in r.losses]
    if not res.lm_loss:
        pairs = sorted((int(i), float(v)) for sc in sidecars for i, v in sc.get("lm_loss") or [])
        res.lm_loss = [v for i, v in dict(pairs).items() if lo < i <= hi]
    res.grad_norm = [r.grad_norm for r in measured if r.grad_norm is not None]
    return res
