"""Would Megatron start this job? Its own assertions, as orchestrator/plan/rules.py records them (each with
its Megatron source), applied to the flags the twin was given.

Why here and not in the truth: legality is Megatron's behaviour, not the machine's performance, and the rule
table is its one owner; the truth (orchestrator/job/twin/truth/) decides only time and memory. The memory phase is left
out: whether a layout fits is the truth's to say (an OOM), not the planner's.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.job.twin.job import TwinJob
from orchestrator.plan import params, pipeline
from orchestrator.plan import rules as R

PHASES = tuple(p for p in R.PHASES if p != "memory")  # checked in this order; the first phase that fails names it


@dataclass(frozen=True)
class Illegal:
    """Megatron refuses the layout: the first violated rule (id and one-line reason)."""

    rule_id: str
    reason: str


def check(job: TwinJob) -> Illegal | None:
    """The first rule the job's layout, pattern and flags violate, or None when Megatron would start it."""
    split = tuple(pipeline.count_blocks(job.pattern)) if job.pattern else None
    ctx = R.Ctx(
        job.model,
        job.stage,
        job.hw,
        job.layout,
        params.effective_layers(job.model, job.stage),
        split=split,
        pattern=job.pattern or None,
        argv=tuple(job.argv),
    )
    rules = R.active(job.stage)  # what this Megatron refuses: a rule its fix lifts is not one (stage.lifted_rules)
    for phase in PHASES:
        bad = R.violations(ctx, R.by_phase(phase, rules))
        if bad:
            return Illegal(bad[0].id, bad[0].reason)
    return None
