"""Step `warm_start`: every launch at scale of the round (confirmations and proposals) loads the sweep's seed,
or, before there is one, the round's first full-window launch saves it (stage.warm_start; `warm`)."""

from __future__ import annotations

from orchestrator.core.states import Fidelity
from orchestrator.schedule import fidelity
from orchestrator.schedule.registry import Step, register
from orchestrator.schedule.round import Round
from orchestrator.search.env import PlanEnv
from orchestrator.search.types import Proposal


def warm(env: PlanEnv, props: list[Proposal], seed: str | None, warmup: int | None = None) -> None:
    """Warm start (stage.warm_start, where it shortens the warm-up: fidelity.warm_start_on): once the sweep
    has a seed (history.seed) every launch at scale loads it and warms up only warm_start.warmup_iters, or
    `warmup` once the sweep's warm launches showed how long they take to settle (fidelity.learned_warmup).
    Without one, the round's first full-window launch saves it at its end and the round's other
    full-window launches wait for it (`after_seed`: they go once it is there, orchestrator/sweep/
    seeding.py), so only one launch of a sweep waits out the stage's own warm-up; a screen before any seed
    runs cold. Each is charged for its window and the seconds loading or saving adds (fidelity.startup_s).
    A rank probe neither loads nor saves: its compute does not wait for routing."""
    st = env.stage
    if not fidelity.warm_start_on(st):
        return
    saver = None
    for p in props:
        if p.fidelity == Fidelity.PROBE:
            continue
        p.warm_from = seed
        if seed is None and p.fidelity == Fidelity.FULL:
            p.seed_save, p.after_seed = saver is None, saver is not None
            saver = saver or p
        if p.decision().warms:
            p.warmup_iters = warmup
        d = p.decision()
        w, n = fidelity.window(st, p.fidelity, p.measure_iters, warm=d.warms, warmup=p.warmup_iters)
        p.est_gpu_hours = env.gpu_hours(
            p.charge_step_s or p.predicted_step_s, w + n, startup_s=fidelity.startup_s(st, d)
        )


def run(r: Round) -> None:
    if not r.inp.seedless:
        warm(r.env, [*r.confirms, *r.props], r.inp.seed, r.learned)


STEP = register(Step("warm_start", run))
