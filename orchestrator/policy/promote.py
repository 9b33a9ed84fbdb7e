"""Promotion: map a smaller stage's measured best layouts onto a larger stage (same model, same B).

At the same global batch B, more GPUs grow the attention data-parallel size D_a and shrink the
microbatch count m = B / (b x D_a), which inflates the pipeline bubble (p-1)/(m+p-1). The guide's fix is
context parallelism: CP x D_a = N / (PP x TP), so raising CP restores m. Expert parallelism is kept or
widened (more GPUs per stage leave room for a wider EP group).
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.plan.layout import Layout, groups
from orchestrator.schema import StageConfig


def promoted_layouts(src: Layout, src_stage: StageConfig, dst: StageConfig, *, limit: int = 3) -> list[Layout]:
    """Legal mappings of `src` to `dst`, best first: same layout, the CP that best restores m, EP widened."""
    src_m = groups(src, src_stage.gpus, src_stage.global_batch).m or 1
    cps = sorted(c for c in dst.search.cp if c >= src.cp)
    eps = sorted(e for e in dst.search.ep if e >= src.ep)
    if src.cp not in cps:
        cps.insert(0, src.cp)
    if src.ep not in eps:
        eps.insert(0, src.ep)

    def legal(lay: Layout) -> bool:
        return groups(lay, dst.gpus, dst.global_batch).legal

    def m_gap(lay: Layout) -> float:
        m = groups(lay, dst.gpus, dst.global_batch).m or 0
        return abs(m - src_m) / src_m

    out: list[Layout] = []

    def add(lay: Layout) -> None:
        if legal(lay) and lay not in out:
            out.append(lay)

    add(src)  # same knobs: D_a grows, m shrinks
    restoring = sorted((replace(src, cp=c) for c in cps), key=lambda lay: (m_gap(lay), lay.cp))
    restoring = [lay for lay in restoring if legal(lay)]
    if restoring:
        add(restoring[0])  # CP variant that restores m
    wider = [e for e in eps if e > src.ep]
    base = restoring[0] if restoring else src
    for e in wider:
        if legal(replace(base, ep=e)):
            add(replace(base, ep=e))  # EP widened
            break
    return out[:limit]
