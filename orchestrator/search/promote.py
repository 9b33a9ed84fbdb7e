"""Promotion: map a smaller stage's measured best layouts onto a larger stage (same model, same B).

At the same global batch B, more GPUs grow the attention data-parallel size D_a and shrink the
microbatch count m = B / (b x D_a), which inflates the pipeline bubble (p-1)/(m+p-1). The guide's fix is
context parallelism: CP x D_a = N / (PP x TP), so raising CP restores m. The interleaved schedule is the
other fix: with v virtual stages per rank the bubble is (p-1)/(v x m) (Megatron-LM
megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving), so VPP restores
the source's bubble with less CP, and CP is not free where GEMM efficiency falls with the tokens per
micro-batch (S x b / CP). Both variants are offered; the round decides by measurement. Expert parallelism
is kept or widened (more GPUs per stage leave room for a wider EP group).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from orchestrator.core.schema import StageConfig
from orchestrator.plan.layout import Layout, groups

# Which mappings come first: the policy round-robins the first of each source's list into round 0, so the
# order decides what round 0 measures. The same layout comes last: at the same B its bubble balloons (m falls
# by the GPU ratio), so it mostly teaches calibration what is already known. Bubble-restoring mappings first
# (VPP with the least CP, then CP alone): tests/bench/bench_search.py --policy calibrated_neighbours
# --orders 200, seeds 0-5, met the goal on 73 of 80 rows against 67 with (same, CP, EP) and no VPP mapping.
ORDER = ("interleave", "restore_m", "widen_ep", "same")  # mapping kinds, named for what each does


def bubble(lay: Layout, n_gpus: int, global_batch: int) -> float:
    """The interleaved 1F1B bubble fraction (p-1)/(v x m); inf for a layout the group rules reject."""
    m = groups(lay, n_gpus, global_batch).m
    return (lay.pp - 1) / (max(lay.vpp, 1) * m) if m else float("inf")


def promoted_layouts(
    src: Layout,
    src_stage: StageConfig,
    dst: StageConfig,
    *,
    limit: int = 4,
    feasible: Callable[[Layout], bool] | None = None,
) -> list[Layout]:
    """Legal mappings of `src` to `dst` in ORDER: the least CP that keeps the source's bubble with VPP, the CP
    that best restores m, that with EP widened, the same layout. `feasible` (the planner's full rule set,
    memory included) filters each mapping so a rejected one leaves its slot to the next candidate."""
    src_m = groups(src, src_stage.gpus, src_stage.global_batch).m or 1
    cps = sorted(c for c in dst.search.cp if c >= src.cp)
    eps = sorted(e for e in dst.search.ep if e >= src.ep)
    if src.cp not in cps:
        cps.insert(0, src.cp)
    if src.ep not in eps:
        eps.insert(0, src.ep)

    def legal(lay: Layout) -> bool:
        return groups(lay, dst.gpus, dst.global_batch).legal and (feasible is None or feasible(lay))

    def m_gap(lay: Layout) -> float:
        m = groups(lay, dst.gpus, dst.global_batch).m or 0
        return abs(m - src_m) / src_m

    variants: dict[str, Layout] = {}
    if legal(src):
        variants["same"] = src  # same knobs: D_a grows, m shrinks
    restoring = sorted((replace(src, cp=c) for c in cps), key=lambda lay: (m_gap(lay), lay.cp))
    restoring = [lay for lay in restoring if legal(lay)]
    if restoring:
        variants["restore_m"] = restoring[0]  # CP variant that restores m
    src_bubble = bubble(src, src_stage.gpus, src_stage.global_batch)
    vpps = sorted({v for v in dst.search.vpp if v >= src.vpp} | {src.vpp})
    interleaved = [replace(src, cp=c, vpp=v) for c in cps for v in vpps]
    interleaved = [lay for lay in interleaved if lay.vpp > src.vpp and legal(lay)]
    restored = [lay for lay in interleaved if bubble(lay, dst.gpus, dst.global_batch) <= src_bubble * (1 + 1e-9)]
    if restored:  # the least CP (then the least VPP) that keeps the source's bubble
        variants["interleave"] = min(restored, key=lambda lay: (lay.cp, lay.vpp))
    elif interleaved:  # none keeps it: the smallest bubble the interleaved schedule reaches
        variants["interleave"] = min(interleaved, key=lambda lay: (bubble(lay, dst.gpus, dst.global_batch), lay.cp))
    base = restoring[0] if restoring else src
    wider = [replace(base, ep=e) for e in eps if e > src.ep and legal(replace(base, ep=e))]
    if wider:
        variants["widen_ep"] = wider[0]  # EP widened
    out: list[Layout] = []
    for k in ORDER:
        if k in variants and variants[k] not in out:
            out.append(variants[k])
    return out[:limit]
