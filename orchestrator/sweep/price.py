"""The price of the whole sweep: its expected GPU-hours and a 90% range, from the policy's own simulation.

Why its own module: round 0's price (sweep/preview.py) is not the sweep's (issue 48: 8k printed 18.4k GPU-hours
for its first round and spent 86.2k). The whole sweep's spend depends on what its jobs measure, so it is
simulated: the driver's own decisions (sweep/simulate.run_sweep: next_round, the configured policy and schedule,
a temporary SQLite ledger) run against `stage.budget.price_samples` "true" surfaces, each the planner's
prediction times an error drawn from the planner's own uncertainty, and the spends' mean and spread are the
price:
- memory: every stage's peak x one multiplier per surface, lognormal with the calibration's prior band
  (search/memfit.py DEFAULT_BAND, the uncalibrated model's relative half-width, read as a 90% half-width), each
  layout further off by the allocator jitter no band is narrower than (memfit.MIN_BAND);
- step: the planner's step x one level per surface, the planner's known error from outside truth: lognormal with
  the geometric mean and log-sd of measured / predicted step on `validate`'s fit rows (stage.budget.price_step_bias,
  price_step_sd: the planner runs fast on every published system; its held-out rows are never read). The samples'
  levels are stratified, one at each of `samples` equal-probability quantiles, so a few samples span the band
  instead of landing by chance. Each planner component but compute (a2a, cp, bubble, grad_sync ...) further x one
  lognormal factor per surface relative to compute (COMPONENT_SD: the calibration's step factors move components
  apart by tens of percent, which reorders layouts), each layout further off by the residual the search allows an
  unseen layout (search/moves.py PRIOR_SD_FLOOR), each iteration by the run-to-run noise (moves.NOISE_SD).
A stage that promotes from another (8k from 1k) simulates its sources' sweeps first on the same surface, the
whole chain root first (16k: 1k, then 8k), as `sweep +stage=8k` follows `sweep +stage=1k`; only the stage's own
spend is its price.

A drawn surface on which no layout runs at scale is redrawn: a sweep there stops with nothing measured, and its
few GPU-hours are no price of a decision. The expected total is the mean of the sampled spends. The range is a
lognormal predictive interval with two parts: the sweep's own path (which layouts it tries, when it stops), from
the spends brought back to the bias's level (x bias / level: a launch's GPU-hours are its step's), mean and sd of
their logs with Student's t quantile and sqrt(1 + 1/n) for the few samples a dry run affords; and the level's known
log-sd (price_step_sd) at the normal's quantile, added in quadrature. Four samples estimate a spread badly, and
the level's part is known, so it is not left to them (docs/search-log.md: four spends drawn across the level's band
spread less than the level alone, the paths' differences cancelling it). Every draw is seeded, so the same config
prints the same price.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.core import knobs
from orchestrator.core.price import SweepPrice
from orchestrator.core.schema import RootConfig
from orchestrator.search import memfit, moves
from orchestrator.sweep.simulate import Launch, SweepRun, run_sweep

SEED = 0
# log-sd of one step component's factor relative to compute across surfaces: the calibration's factors move the
# components apart by tens of percent (the step's level is the surface's own, from stage.budget.price_step_bias)
COMPONENT_SD = 0.35
# log-sd of one knob value's own factor (one per surface, shared by every layout with that value, at every stage):
# the structured error no per-component calibration absorbs (a dispatcher's bandwidth, a recompute set's
# activations, a PP depth's imbalance), which is what keeps a real sweep going round after round
KNOB_SD = 0.08
KNOB_MEMORY_SD = 0.10  # the same for memory: per recompute set, CP and micro-batch (the activations' knobs)
# every knob a layout shows, the dispatcher with its backend (a fixed knob's one factor scales every layout alike)
STEP_KNOBS = (*(k.name for k in knobs.DISPLAYED if k.name != "dispatcher"), "dispatcher_label")
MEMORY_KNOBS = ("recompute", "cp", "mbs")
MAX_DRAWS = 3  # draws per sample: a surface on which nothing fits is redrawn (that sweep measures nothing)
# Student's t 95th percentile by degrees of freedom (n - 1 of n sampled spends): a two-sided 90% predictive range
# when the spread itself is estimated from a few samples; the normal's beyond the table
T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812}
Z90 = 1.6449


def _normal(seed: int) -> float:
    """One standard normal draw from its own seed."""
    import numpy as np

    return float(np.random.default_rng(seed).normal())


def _rng_seed(*parts: object) -> int:
    """A stable seed from its parts (Python's hash of a str changes per process)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


@dataclass
class SampledSurface:
    """One "true" surface: the planner's uncalibrated prediction of a layout times this sample's drawn errors.
    A simulate.Surface: the driver's jobs run on it in-process."""

    seed: int
    factors: dict[str, float]  # per step component, relative to compute (compute's is 1)
    memory: float  # every peak's multiplier
    level: float = 1.0  # every step's multiplier: the planner's known error (module docstring)
    _cache: dict[tuple[str, str], tuple[float, float, tuple[float, ...], float]] = field(default_factory=dict)

    @classmethod
    def draw(cls, seed: int, level: float = 1.0) -> SampledSurface:
        import numpy as np

        rng = np.random.default_rng(seed)
        from orchestrator.plan.steptime import COMPONENTS

        factors = {c: float(math.exp(rng.normal(0.0, COMPONENT_SD))) for c in COMPONENTS}
        factors = {c: f / factors["compute"] for c, f in factors.items()}  # the level is the surface's own
        memory = float(math.exp(rng.normal(0.0, math.log1p(memfit.DEFAULT_BAND) / Z90)))
        return cls(seed, factors, memory, level)

    def truth(self, cfg: RootConfig, layout) -> tuple[float, float, tuple[float, ...], float]:
        """(step s, compute-only probe step s, peak GB per PP stage, capacity GB) of `layout` on cfg's stage."""
        import numpy as np

        from orchestrator.search.env import PlanEnv

        st = cfg.required_stage()
        key = (st.name, layout.short())
        if key not in self._cache:
            env = PlanEnv(cfg.model, cfg.hardware, st, cfg.workload.name, cfg.workload.recipe)
            planned = env.evaluate_unchecked(layout, None, 1.0)
            rng = np.random.default_rng(_rng_seed(self.seed, *key))
            if planned is None:  # a rule refuses it: it dies at start-up as an OOM would
                self._cache[key] = (1.0, 1.0, (math.inf,), cfg.hardware.hbm_gb)
            else:
                p = planned.prediction
                comps = p.step_components or {"compute": p.step_time_s}
                raw = sum(comps.values()) or 1.0
                scale = sum(v * self.factors.get(k, 1.0) for k, v in comps.items()) / raw
                off = float(math.exp(rng.normal(0.0, moves.PRIOR_SD_FLOOR))) * self._knobs(layout, STEP_KNOBS, KNOB_SD)
                off *= self.level
                step = p.step_time_s * scale * off
                probe = (p.probe_step_s or p.step_time_s) * self.factors["compute"] * off
                jitter = float(math.exp(rng.normal(0.0, memfit.MIN_BAND)))
                jitter *= self._knobs(layout, MEMORY_KNOBS, KNOB_MEMORY_SD)
                gb = tuple(m * self.memory * jitter for m in (p.memory_by_stage or (p.memory_gb,)))
                self._cache[key] = (step, probe, gb, cfg.hardware.hbm_gb)
        return self._cache[key]

    def _knobs(self, layout, names: Sequence[str], sd: float) -> float:
        """The product of this surface's factors for the layout's values of `names` (each drawn once, by value)."""
        out = 1.0
        for name in names:
            value = getattr(layout, name)
            out *= math.exp(sd * _normal(_rng_seed(self.seed, name, repr(value))))
        return out

    def _times(self, step: float, iters: int, key: str, attempt: int) -> tuple[float, ...]:
        import numpy as np

        rng = np.random.default_rng(_rng_seed(self.seed, key, attempt))
        return tuple(float(x) for x in step * np.exp(rng.normal(0.0, moves.NOISE_SD, iters)))

    def launch(self, cfg, layout, pattern: str, key: str, attempt: int = 1, window=None) -> Launch:
        step, _, gb, cap = self.truth(cfg, layout)
        iters = sum(window) if window else cfg.stage.warmup_iters + cfg.stage.measure_iters
        fits = max(gb) <= cap
        times = self._times(step, iters, key, attempt) if fits else ()
        return Launch(step, fits, times, max(gb), gb, cap)

    def probe(
        self, cfg, layout, pattern: str, key: str, probe_ranks: Sequence[int], attempt: int = 1, window=None
    ) -> Launch:
        from orchestrator.plan import ranks as plan_ranks

        _, step, gb, cap = self.truth(cfg, layout)
        iters = sum(window) if window else cfg.stage.warmup_iters + cfg.stage.measure_iters
        stages = tuple(plan_ranks.coords(layout, cfg.stage.gpus, r)["pp"] for r in probe_ranks)
        own = tuple(gb[min(s, len(gb) - 1)] for s in stages)
        fits = max(own) <= cap
        times = self._times(step, iters, key, attempt) if fits else ()
        return Launch(step, fits, times, max(own), own, cap, stages)


def interval(spends: Sequence[float], known_sd: float = 0.0) -> tuple[float, float]:
    """A 90% lognormal predictive interval of the next spend, from a few sampled ones, widened by a known
    log-sd of its own (the step level's: module docstring)."""
    logs = [math.log(max(s, 1e-9)) for s in spends]
    n = len(logs)
    mu = sum(logs) / n
    sd = math.sqrt(sum((x - mu) ** 2 for x in logs) / (n - 1)) if n > 1 else 0.0
    half = math.hypot(T95.get(n - 1, Z90) * sd * math.sqrt(1.0 + 1.0 / n), Z90 * known_sd)
    return math.exp(mu - half), math.exp(mu + half)


def measured(run: SweepRun) -> bool:
    """The simulated sweep measured a layout at scale (a surface where none did is redrawn)."""
    return any(x[5] == "full" and x[3] is not None for x in run.launches)


def levels(bias: float, sd: float, n: int) -> list[float]:
    """The step levels of n samples: the lognormal(log bias, sd)'s quantiles at (k + 1/2) / n, lowest first."""
    from statistics import NormalDist

    return [bias * math.exp(sd * NormalDist().inv_cdf((k + 0.5) / n)) for k in range(n)]


def simulate(
    cfg: RootConfig,
    config_yaml: str,
    sources: Sequence[tuple[RootConfig, str]],
    seed: int,
    folder: Path,
    level: float = 1.0,
) -> SweepRun:
    """One whole sweep of `cfg` on one sampled surface, its steps at `level` x the planner's, after its promotion
    sources' sweeps on the same surface (`sources`: the chain of stages it promotes from, root first)."""
    from orchestrator.ledger.ledger import Ledger

    st = cfg.required_stage()
    surface = SampledSurface.draw(seed, level)
    if st.promotes_from and not sources:  # no source to promote from: the stage runs on its own
        cfg = dataclasses.replace(cfg, stage=dataclasses.replace(st, promotes_from=None))
    led = Ledger.open(f"sqlite:///{folder / f'price-{seed}.sqlite'}", create_dir=True)
    try:
        for src_cfg, src_yaml in sources:
            name = src_cfg.required_stage().name
            src = run_sweep(led, src_cfg, src_yaml, surface, f"price-{name}", src_cfg.required_stage().budget.startup_s)
            if not measured(src):  # nothing to promote from on this surface: it is redrawn (price())
                return SweepRun(policy=cfg.policy.name, reason=f"its source stage {name} measured nothing")
        return run_sweep(led, cfg, config_yaml, surface, "price", st.budget.startup_s)
    finally:
        led.close()


def price(
    cfg: RootConfig,
    config_yaml: str,
    sources: Sequence[tuple[RootConfig, str]] = (),
    *,
    samples: int,
    seed: int = SEED,
) -> SweepPrice:
    """The whole sweep's price: `samples` simulated sweeps of `cfg` (module docstring). Writes only a
    temporary folder it removes."""
    st = cfg.required_stage()
    runs: list[SweepRun] = []
    bias, known_sd = st.budget.price_step_bias, st.budget.price_step_sd
    level = levels(bias, known_sd, samples)
    with tempfile.TemporaryDirectory(prefix="sweep-price-") as tmp:
        for i in range(MAX_DRAWS * samples):  # a redrawn surface keeps the level it was drawn for
            run = simulate(cfg, config_yaml, sources, _rng_seed(seed, i), Path(tmp), level[len(runs)])
            if measured(run):
                runs.append(run)
            if len(runs) == samples:
                break
    if not runs:  # no drawn surface let one layout run: the planner's own band says nothing fits
        return SweepPrice(0.0, 0.0, 0.0, 0.0, (), st.gpus)
    spends = tuple(r.gpu_hours for r in runs)
    lo, hi = interval([s * bias / lv for s, lv in zip(spends, level, strict=False)], known_sd)  # the k-th at level[k]
    hours = sum(r.decision_hours(st.gpus, cfg.cluster.probe_gpus) for r in runs) / len(runs)
    return SweepPrice(sum(spends) / len(spends), lo, hi, hours, spends, st.gpus)
