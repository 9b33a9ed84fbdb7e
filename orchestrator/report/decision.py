"""The report's decision: which layout to train with, its margin over the runner-up, its evidence and flags.

Why its own step: the page opens on this answer, and it must be the answer `best` gives
(orchestrator.ledger.queries.best, which ranks with orchestrator.core.ranking; the runner-up is the ranking's
next), with the flags `plan --argv` prints (orchestrator.runspec.layout_flags, from the sweep's stored
config and the candidate's stored layout and layer pattern), never a second copy of either rule.

The verdict follows from the evidence: a tie only when the two p50s' 95% confidence intervals overlap (from
each layout's own step times, with the screen's arithmetic, orchestrator.schedule.fidelity), and a runner-up
whose p99 is much better is named, since a straggler-heavy tail costs every step of a long run.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from orchestrator.core import ranking
from orchestrator.core import windows as fidelity
from orchestrator.core.metrics import STEP_P50
from orchestrator.evidence import bundle as bundle_mod
from orchestrator.evidence.metrics import robust_cv
from orchestrator.ledger import queries
from orchestrator.ledger.ledger import Ledger
from orchestrator.report.data import ReportData, standing

P99_MUCH_BETTER = 0.10  # the runner-up's p99 this much lower (relative) is named beside the recommendation


@dataclass
class Decision:
    best: dict | None  # the recommended candidate's row of ReportData.measured
    runner_up: dict | None  # the next eligible candidate (same rule), None when there is none
    flags: str  # the exact Megatron flags, one per line (plan.format_argv); "" when unavailable
    flags_source: str  # where the flags come from, or why there are none
    hbm_gb: float | None  # the sweep's hardware HBM per GPU (decimal GB)
    chosen_on: str = ranking.RULE
    bundle: bundle_mod.Bundle | None = None  # what the recommended job ran with (orchestrator.evidence.bundle)

    @property
    def margin(self) -> float | None:
        """How much slower the runner-up's step p50 is than the recommended one's (0.064 = 6.4%)."""
        if not self.best or not self.runner_up:
            return None
        return self.runner_up[STEP_P50] / self.best[STEP_P50] - 1.0

    best_interval: tuple[float, float] | None = None  # the recommended p50's 95% confidence interval (s)
    runner_interval: tuple[float, float] | None = None  # the runner-up's

    @property
    def within_noise(self) -> bool:
        """The two p50 intervals overlap: the measurements do not separate the two layouts (a tie). Unknown
        intervals (no stored step times) are no evidence of a tie."""
        if self.best_interval is None or self.runner_interval is None:
            return False
        return self.runner_interval[0] <= self.best_interval[1] and self.best_interval[0] <= self.runner_interval[1]

    @property
    def p99_gain(self) -> float | None:
        """How much lower the runner-up's p99 is (0.23 = 23%) when that is at least P99_MUCH_BETTER, else None."""
        if not self.best or not self.runner_up:
            return None
        mine, theirs = self.best.get("step_p99_s"), self.runner_up.get("step_p99_s")
        if not mine or not theirs:
            return None
        gain = 1.0 - theirs / mine
        return gain if gain >= P99_MUCH_BETTER else None


def p50_interval(p50: float | None, samples: list[float]) -> tuple[float, float] | None:
    """The 95% confidence interval of a p50 from its window's step times (robust noise, the median's standard
    error: orchestrator.schedule.fidelity), None when too few times were stored to say."""
    cv = robust_cv(samples)
    if not p50 or cv is None:
        return None
    h = fidelity.half_width(cv, len(samples)) * p50
    return (p50 - h, p50 + h)


def eligible(row: dict) -> bool:
    """What `best` may choose (orchestrator.core.ranking): complete, full-window, not excluded by parity."""
    return standing(row).eligible


def decide(ledger: Ledger, d: ReportData) -> Decision:
    """The recommended candidate (`best`'s choice for this sweep), the runner-up and the flags."""
    hit = queries.best(ledger, sweep=d.sweep.name)
    best = next((r for r in d.measured if hit and r["candidate_id"] == hit["candidate_id"]), None)
    others = [r for r in ranking.ranked(d.measured, standing) if r is not best]
    cfg, why = _stored_config(d.sweep.config_yaml)
    hbm = _hbm(d.sweep.config_yaml)
    flags, source, bundle = "", "no recommended candidate", None
    if best is not None:
        flags, source = _flags(ledger, d.sweep.name, best["candidate_id"], cfg, why, hit)
    if hit is not None:
        bundle = bundle_mod.of_best(
            hit,
            parity=ledger.evidence.parity(hit["candidate_id"]),
            provenance=d.sweep.provenance,
            parity_enabled=cfg.parity.enabled if cfg is not None else None,
        )
    runner = others[0] if others else None

    def interval(row: dict | None) -> tuple[float, float] | None:
        return p50_interval(row[STEP_P50], d.samples.get(row["candidate_id"], [])) if row else None

    return Decision(
        best=best,
        runner_up=runner,
        best_interval=interval(best),
        runner_interval=interval(runner),
        flags=flags,
        flags_source=source,
        hbm_gb=hbm,
        bundle=bundle,
    )


def _stored_config(text: str):
    """The sweep's stored RootConfig, or (None, why) when the snapshot does not compose (an old ledger)."""
    from orchestrator.config import root_from_yaml

    try:
        cfg = root_from_yaml(text)
    except Exception as e:  # noqa: BLE001 - OmegaConf raises many types; the page says why instead
        return None, f"the sweep's stored config does not compose ({type(e).__name__})"
    if cfg.stage is None:
        return None, "the sweep's stored config has no stage"
    return cfg, ""


def _hbm(text: str) -> float | None:
    try:
        return float((yaml.safe_load(text) or {})["hardware"]["hbm_gb"])
    except (KeyError, TypeError, ValueError, yaml.YAMLError):
        return None


def _flags(ledger: Ledger, sweep: str, candidate_id: int, cfg, why: str, hit: dict | None) -> tuple[str, str]:
    """(flags text, source): from the stored config as `plan --argv` builds them, else the job's own spec."""
    from orchestrator.runspec import format_argv, layout_flags

    cand = next((c for c in ledger.candidates(sweep) if c.id == candidate_id), None)
    if cfg is not None and cand is not None:
        try:
            tokens = layout_flags(cfg, cfg.stage, cand.layout, cand.layer_pattern)
            return format_argv(tokens), (
                "built as `plan --argv` builds them, from the sweep's stored config and this candidate's layout: "
                "the measurement's flags (mock data, the benchmark's schedule and length); to train with this "
                f"layout, `python -m orchestrator best --sweep {sweep} --flags --train` (conf/train)"
            )
        except (TypeError, ValueError, KeyError, AttributeError) as e:  # a ledger older than this code
            why = f"the stored layout does not build flags ({type(e).__name__}: {e})"
    spec = _spec_argv((hit or {}).get("attempt", {}).get("job_dir"))
    if spec:
        return format_argv(spec), f"read from the measurement job's spec (job.json); {why}"
    return "", why or "this candidate's layout is not in the ledger"


def _spec_argv(job_dir: str | None) -> list[str]:
    """The argv the measuring job ran with (its job.json), when its folder is still readable here."""
    if not job_dir:
        return []
    from orchestrator.core.paths import JobPaths
    from orchestrator.core.spec import JobSpec

    try:
        return list(JobSpec.load(JobPaths(job_dir).spec).argv)
    except (OSError, ValueError, TypeError, KeyError):
        return []
