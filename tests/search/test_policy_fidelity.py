"""Multi-fidelity rounds: the screen's window sized from measured noise, screens then confirmations, the best
decided only on the full window, GPU-hours per fidelity (pure, then on the real loop and an in-process sweep)."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator import history
from orchestrator.config import compose
from orchestrator.core.decision import Decision
from orchestrator.core.schema import ScreenConfig, StageConfig
from orchestrator.core.states import Fidelity
from orchestrator.evidence.metrics import robust_cv
from orchestrator.plan.layout import Layout
from orchestrator.schedule import Schedule, fidelity
from orchestrator.schedule.steps.confirm import confirms
from orchestrator.search import make_policy
from orchestrator.search.env import PlanEnv
from orchestrator.search.select import best_measured
from orchestrator.search.types import Observation, RoundInput, unrated
from tests.bench import searchlib as lib

STAGE = StageConfig(warmup_iters=300, measure_iters=50, screen=ScreenConfig(warmup_iters=50, min_measure_iters=10))
BASE = Layout(tp=1, pp=8, vpp=1, cp=1, ep=64, mbs=1)


def obs(key, step, fid=Fidelity.FULL, *, n=50, rnd=0, lay=BASE):
    return Observation(
        key=key,
        layout=lay,
        raw_components={"compute": 1.0},
        raw_step_s=1.0,
        raw_memory_gb=10.0,
        step_s=step,
        round=rnd,
        hbm_gb=80.0,
        fidelity=fid,
        measure_iters=n,
    )


@given(cv=st.floats(0.0005, 0.2), res=st.floats(0.002, 0.05), lo=st.integers(1, 60), full=st.integers(1, 400))
def test_the_screen_is_the_shortest_window_whose_p50_ci_resolves_the_screen(cv, res, lo, full):
    stage = dataclasses.replace(STAGE, measure_iters=full, screen=ScreenConfig(resolution=res, min_measure_iters=lo))
    n = fidelity.screen_iters(stage, cv)
    assert min(lo, full) <= n <= full
    if min(lo, full) < n < full:  # not clamped: n resolves, n - 1 does not
        assert fidelity.half_width(cv, n) <= res * (1 + 1e-9) < fidelity.half_width(cv, n - 1)
    if n == full and full > lo:
        assert fidelity.half_width(cv, full - 1) > res * (1 - 1e-9)


def test_no_noise_measured_means_the_full_window():
    assert fidelity.screen_iters(STAGE, None) == STAGE.measure_iters
    assert not fidelity.use_screen(STAGE, None)
    off = dataclasses.replace(STAGE, screen=ScreenConfig(enabled=False))
    assert fidelity.screen_iters(off, 0.01) == 50 and not fidelity.use_screen(off, 0.01)


def test_noise_is_measured_robustly_from_per_iteration_times():
    rng = random.Random(0)
    times = [1.0 * math.exp(rng.gauss(0, 0.02)) for _ in range(400)]
    assert robust_cv(times) == pytest.approx(0.02, rel=0.15)
    stragglers = times[:]
    stragglers[::20] = [5.0] * len(stragglers[::20])  # 5% of iterations 5x slower hardly move it
    assert robust_cv(stragglers) < 0.03
    assert robust_cv(times[:3]) is None
    # 2% noise at a 1% resolution: (1.96 * 1.2533 * 2)^2 = 24.1 -> 25 iterations instead of 50
    assert fidelity.screen_iters(STAGE, 0.02) == 25
    assert fidelity.window(STAGE, Fidelity.SCREEN, 25) == (50, 25)
    assert fidelity.window(STAGE, Fidelity.FULL) == (300, 50)


def test_contenders_are_the_screens_the_ci_cannot_separate_from_the_best():
    rows = [
        obs("full", 10.0),
        obs("faster", 9.7, Fidelity.SCREEN, n=25),
        obs("tie", 10.05, Fidelity.SCREEN, n=25),  # within the CI (+-0.98%) of the full best
        obs("slower", 10.6, Fidelity.SCREEN, n=25),
    ]
    # the faster screen's upper bound (9.795) separates it from the tie's lower bound (9.951): halving keeps one
    assert [r.key for r in fidelity.contenders(rows, 0.02, 5)] == ["faster"]
    assert [r.key for r in fidelity.contenders(rows[:1] + rows[2:], 0.02, 5)] == ["tie"]
    assert fidelity.contenders(rows, 0.02, 0) == []


def test_a_screened_p50_never_decides_the_best():
    rows = [obs("full", 10.0), obs("screen", 9.0, Fidelity.SCREEN, n=25)]
    assert best_measured(rows).key == "full"
    assert best_measured([obs("screen", 9.0, Fidelity.SCREEN)]) is None
    root = compose(["+stage=1k"]).cfg
    pol = make_policy(root.policy)
    # a contender still waiting for its confirmation blocks convergence (the schedule's to say)
    n = root.stage.budget.converge_rounds  # no gain nor near-tie for the stage's convergence rounds
    flat = [obs("r0", 10.0)] + [obs(f"r{i}", 10.5, rnd=i) for i in range(1, n)]
    done = flat + [obs("e", 10.5, rnd=n)]
    assert pol.converged(done, n) and not _waiting(root, done)
    assert _waiting(root, flat + [obs("e", 9.0, Fidelity.SCREEN, n=25, rnd=n)])


def _waiting(root, rows: list[Observation], *, rated: bool = True) -> bool:
    """Schedule.waiting as the driver asks it the round after `rows` (sweep/decide.py: with the searcher's rating,
    Policy.estimate, unless `rated` is False), the stage's measured noise 2%."""
    env = PlanEnv(root.model, root.hardware, root.required_stage(), root.workload.name)
    rnd = max(r.round for r in rows) + 1
    inp = RoundInput(round=rnd, observations=rows, known_keys=set(), slots=10, gpu_hours_left=1e9, step_cv=0.02)
    pol = make_policy(root.policy)
    fit = pol.fit(env, inp)
    return Schedule(root.policy).waiting(inp, fit, pol.estimate(inp, fit) if rated else unrated)


def test_a_probed_fit_due_at_scale_holds_convergence():
    """A layout a rank probe found to fit, whose composed step as the searcher rates it is within probe_pass of
    the best, is still due its launch at scale (schedule/round.passed): the sweep is not converged until it ran; a
    probed layout rated slower than that, or one that OOMed at scale since, holds nothing."""
    root = compose(["+stage=1k"]).cfg
    n = root.stage.budget.converge_rounds
    done = [obs("r0", 10.0)] + [obs(f"r{i}", 10.5, rnd=i) for i in range(1, n + 1)]  # no gain, no near-tie
    assert make_policy(root.policy).converged(done, n)

    def probed(compute_s: float, failure: str | None = None) -> Observation:
        # a rank probe: compute-only step measured at compute_s where the planner predicted 1.0 s (raw_probe_s)
        row = obs("probed", None, Fidelity.PROBE, rnd=n, lay=dataclasses.replace(BASE, ep=32))
        return dataclasses.replace(row, peak_gb=60.0, probe_step_s=compute_s, raw_probe_s=1.0, failure_class=failure)

    assert probed(9.0).probed_fit and _waiting(root, [*done, probed(9.0)])  # composed 9 s, the best 10 s
    assert not _waiting(root, [*done, probed(11.0)])  # composed 11 s: more than probe_pass (5%) slower
    # composed 10.6 s, over the cut (10.5 s), but the searcher rates it under it (calibrated_neighbours' bound:
    # the residual model's spread over so few rows): due at scale, as an unprobed layout it rates so would be
    assert _waiting(root, [*done, probed(10.6)]) and not _waiting(root, [*done, probed(10.6)], rated=False)
    assert not _waiting(root, [*done, probed(9.0, failure="OOM")])  # its launch at scale OOMed: nothing due


def _sweep(tmp_path, target, *extra, cut: bool = False):
    """An in-process 1k sweep; without the early cut unless `cut` (these tests check the rungs' sequences, a cut
    turns a launch into a screen: tests/sweep/test_cutoff.py)."""
    off = [] if cut else ["stage.screen.cut=false"]
    composed = compose(["+stage=1k", "cluster=local", *target.overrides(), "stage.budget.startup_s=300", *off, *extra])
    led = lib.fresh_ledger(str(tmp_path))
    run = lib.run_sweep(led, composed, target, "mf", startup_s=300.0)
    return composed.cfg, led, run


@pytest.mark.long
def test_a_sweep_screens_then_confirms_and_reports_only_a_confirmed_best(tmp_path):
    """The rungs where the full window is long (no warm start: with one, a full launch is as short as a screen
    at 1k and the sweep measures at the full window only, tests/sweep/test_warm_start.py). Seed 1: a surface where
    a screen beats the best measured, so it gets confirmed (the seeded path moves with the planner's predictions:
    a layout's key naming its optimizer precision took it from seed 0 to 2, the dispatchers' permutation copies
    and the short-K GEMMs from 2 to 1: on seed 2 every screen now trails the round-0 best and the sweep converges
    without a confirm)."""
    target = lib.Target("twin:balanced", seed=1)
    cfg, led, run = _sweep(tmp_path, target, "stage.warm_start.enabled=false")
    with led:
        fids = [x[5] for x in run.launches]
        at_scale = [f for f in fids if f != Fidelity.PROBE]  # round 0's rank probes (policy.schedule.probe_led) aside
        assert (
            at_scale[: cfg.policy.schedule.round0_size] == [Fidelity.FULL] * cfg.policy.schedule.round0_size
        )  # no noise known yet
        assert Fidelity.SCREEN in fids
        cands = {c.id: c for c in led.candidates("mf")}
        confirmed = [c for c in cands.values() if c.decision.kind == "confirm"]
        assert confirmed
        for c in confirmed:  # the ledger keeps every measurement and the fidelity of each
            atts = led.attempts(c.id)
            # probe first (step probe_first): a new layout's rank probe came before its screen
            assert [a.fidelity for a in atts] in (
                [Fidelity.SCREEN, Fidelity.FULL],
                [Fidelity.PROBE, Fidelity.SCREEN, Fidelity.FULL],
            )
            screen, full = (led.evidence.result(a.id) for a in atts[-2:])
            assert (screen["warmup_iters"], full["warmup_iters"]) == (50, 300)
            # the screen's measured part is sized from the noise round 0 measured (windows.screen_iters), up to the
            # full window where the surface is that noisy: its warm-up is what always makes it shorter
            n = screen["measure_iters_requested"]
            assert cfg.stage.screen.min_measure_iters <= n <= full["measure_iters_requested"] == 50
            assert screen["warmup_iters"] + n < full["warmup_iters"] + full["measure_iters_requested"]
        best = history.best_of(led, "mf")
        (row,) = [m for m in led.evidence.measured(sweep="mf") if m.key == best["key"]]
        assert row.fidelity == Fidelity.FULL
        # spent: each attempt its own window plus start-up, split per fidelity, the total what the bench charged
        spent = history.spent(led, "mf", stage=cfg.stage)
        assert {"full", "screen"} <= set(spent.by_fidelity) <= {"full", "screen", "probe"}
        assert spent.gpu_hours == pytest.approx(run.gpu_hours, rel=0.05)  # the measured mean step vs the true one
        from orchestrator.commands import status

        shown = status.gather(led, "mf")  # `status --json`: GPU-hours per fidelity, every one named
        assert set(shown["gpu_hours_by_fidelity"]) == {"probe", "screen", "full", "finalists"}
        assert {k: v for k, v in shown["gpu_hours_by_fidelity"].items() if v} == spent.by_fidelity
        # time to the decision: full-scale jobs one after another on the stage's cluster, the one-GPU rank
        # probes (if any) in parallel on the side pool of cluster.probe_gpus
        hours, probe_h = shown["cluster_hours"], spent.by_fidelity.get("probe", 0.0)
        assert hours["cluster"] == pytest.approx((spent.gpu_hours - probe_h) / cfg.stage.gpus)
        assert hours["probe_pool"] == pytest.approx(probe_h / hours["probe_gpus"])
        assert hours["decision"] == max(hours["cluster"], hours["probe_pool"])
        assert hours["cluster_gpus"] == cfg.stage.gpus
        assert spent.by_fidelity["screen"] == pytest.approx(run.gpu_hours_by()["screen"], rel=0.05)  # measured mean


@pytest.mark.long
def test_screen_fastest_but_confirmed_slower_is_not_the_best(tmp_path):
    """A layout whose screen beats everything but whose full window does not: the best stays the full one."""
    target = lib.Target("twin:balanced")
    cfg, led, _ = _sweep(tmp_path, target)
    with led:
        full = {
            m.key: m.metrics["step_p50_s"] for m in led.evidence.measured(sweep="mf") if m.fidelity == Fidelity.FULL
        }
        # forge one candidate's screen as the fastest of all, never confirmed
        c = next(c for c in led.candidates("mf") if c.key not in full and c.status == "done")  # screened only
        a = led.new_attempt(c.id, job_id="forged", job_dir="-", simulated=True, fidelity=Fidelity.SCREEN)
        led.evidence.record_result(a.id, {"ok": True, "simulated": True, "step_p50_s": min(full.values()) * 0.5})
        assert history.best_of(led, "mf")["key"] != c.key
        from orchestrator.ledger import queries

        assert queries.best(led, sweep="mf")["key"] == history.best_of(led, "mf")["key"] != c.key
        inp = RoundInput(
            round=9,
            observations=history.observations(led, [led.get_sweep("mf")], _env(cfg)),
            known_keys=set(),
            slots=4,
            gpu_hours_left=1e9,
            step_cv=0.02,
        )
        assert c.key in [p.key for p in confirms(cfg.policy, _env(cfg), inp)]  # ... it is confirmed next


def _env(cfg):
    from orchestrator.search.env import PlanEnv

    return PlanEnv(cfg.model, cfg.hardware, cfg.stage, cfg.workload.name)


@pytest.mark.long
def test_the_loop_launches_each_attempt_at_its_fidelitys_window(tmp_path):
    """The real loop (local executor, the twin): round 0 runs the full window and measures the noise; round 1
    screens at the short window sized from it; job.json and the ledger say which window each attempt ran."""
    from pathlib import Path

    from orchestrator.core.spec import JobSpec
    from orchestrator.ledger.ledger import Ledger
    from tests.sweeplib import UNCUT, cli, ledger_url, sweep_args

    small = [
        "policy.schedule.round0_size=3",
        "policy.schedule.round_size=2",
        "stage.budget.max_rounds=2",
        "stage.budget.max_runs=6",
        "stage.warmup_iters=6",
        "stage.measure_iters=40",
        "stage.screen.enabled=true",
        "stage.screen.warmup_iters=3",
        "stage.screen.min_measure_iters=4",
        "stage.screen.resolution=0.2",
        UNCUT,
    ]
    proc = cli("sweep", *sweep_args(tmp_path, "mf-loop", *small), "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        seen = set()
        for c in led.candidates("mf-loop"):
            for a in led.attempts(c.id):
                spec = JobSpec.load(Path(a.job_dir) / "job.json")
                window = spec.window
                assert spec.fidelity == a.fidelity and spec.stage.measure_iters == 40  # the stage is the stage
                if c.round == 0:
                    assert a.fidelity == Fidelity.FULL and window == (6, 40)
                elif a.fidelity == Fidelity.SCREEN:
                    assert window == (3, c.decision.measure_iters) and 4 <= window[1] < 40
                elif a.fidelity == Fidelity.PROBE:  # probe first: warm-up, then the compute-only window
                    screen = spec.stage.screen
                    assert window == (screen.probe_warmup_iters, screen.probe_iters)
                    _probe_step_is_what_the_bench_hands_the_searcher(spec, c, led.evidence.result(a.id))
                seen.add((c.round, str(a.fidelity)))
        assert (1, "screen") in seen or (1, "probe") in seen


def _probe_step_is_what_the_bench_hands_the_searcher(spec, cand, result):
    """The job's probe p50 (only the last rank prints iteration lines) is the bench's in-process probe's: the
    last PP stage's compute-only step (truth.rank_probe), never another probed rank's."""
    from types import SimpleNamespace

    from orchestrator.job.twin import truth

    cfg = SimpleNamespace(model=spec.model, hardware=spec.hardware, stage=spec.stage, workload=spec.workload)
    lay, tw = cand.layout, spec.workload.twin
    run = lib.Target(f"twin:{tw.surface}", seed=tw.seed).probe(
        cfg, lay, cand.layer_pattern, cand.key, spec.probe_ranks, window=spec.window
    )
    s = truth.evaluate(truth.Case(spec.model, spec.hardware, spec.stage, tw, lay, cand.layer_pattern))
    assert result["step_p50_s"] == pytest.approx(truth.rank_probe(s, lay.pp - 1).step_s, rel=0.1)
    assert lib.p50_of_window(cfg, run, spec.window[0]) == pytest.approx(result["step_p50_s"], rel=0.1)


@pytest.mark.long
def test_a_layout_the_uncalibrated_model_prunes_is_probed_on_one_gpu_found_to_fit_then_measured(tmp_path):
    """twin:memory (its activations are far below the planner's): a one-GPU rank probe (Megatron's
    --fake-process-group) decides what the model's error band cannot. It runs the ranks that bound the layout
    (first PP stage, last, the planner's heaviest), each alone on one GPU for start-up plus a few iterations;
    its peak plus the probe margin is under HBM, so the layout is known to fit and measured at full scale."""
    from orchestrator.plan import ranks

    target = lib.Target("twin:memory")
    # a 14 GB margin: since the planner stopped counting the expert fc2 output (never kept for backward), its
    # uncalibrated band on this surface prunes a layout that fits only with a cautious site's margin (12 GB
    # before the warm start changed the search path: its fit probes then all found layouts over HBM)
    cfg, led, run = _sweep(tmp_path, target, "stage.memory_margin_gb=14")
    with led:
        hbm, margin = cfg.hardware.hbm_gb, cfg.stage.memory_margin_gb
        probed = [c for c in led.candidates("mf") if (c.decision.previous or Decision()).kind == "fit-probe"]
        assert probed, [x[5] for x in run.launches]
        for c in probed:
            assert c.predicted["raw_memory_gb"] + margin > hbm  # the uncalibrated model prunes it
            lay = c.layout
            bound = c.decision.previous.probe_ranks  # the ranks that bound it, each probed on one GPU
            assert list(bound) == ranks.probe_ranks(lay, cfg.stage.gpus, c.predicted["heaviest_stage"])
            assert bound[0] == 0 and bound[-1] == cfg.stage.gpus - 1
            probe, full, *_ = led.attempts(c.id)  # then measured at scale: screened when the round screens
            assert probe.fidelity == Fidelity.PROBE and full.fidelity in (Fidelity.FULL, Fidelity.SCREEN)
            p, f = led.evidence.result(probe.id), led.evidence.result(full.id)
            assert p["warmup_iters"] == cfg.stage.screen.probe_warmup_iters
            assert p["measure_iters_requested"] == cfg.stage.screen.probe_iters
            # found to fit (its peak, no NCCL, no dispatcher buffers, + the probe margin under HBM) or too close
            # to call, which only the launch at scale settles (Observation.probe_ran); the full-scale run then
            # reserves more than the probe saw
            assert p["peak_reserved_gb"] <= hbm
            assert p["peak_reserved_gb"] < f["peak_reserved_gb"] <= hbm
            if full.fidelity == Fidelity.FULL:
                assert f["measure_iters_requested"] == cfg.stage.measure_iters
        # the probe margin is learned from what the probes read and what those layouts then reserved at scale
        # (the largest gap), so the probe's peak outlives the run; a probe-only row is read with that margin.
        # The run at scale is fitted on its whole step, its probe aside (orchestrator/sweep/history.py)
        sweeps = [led.get_sweep("mf")]
        seen = {o.key: o for o in history.observations(led, sweeps, _env(cfg))}
        gaps = []
        for c in probed:
            probe, *_, last = led.attempts(c.id)  # its latest run at scale (a screen's confirmation, if any)
            p, f = led.evidence.result(probe.id), led.evidence.result(last.id)
            o = seen[c.key]
            assert o.fidelity == last.fidelity and o.step_s == pytest.approx(f["step_p50_s"])
            assert o.probe_step_s is None and o.probe_margin_gb == 0.0
            # ... while its probe's compute-only p50 stays beside it: what its composed step was, against which the
            # step at scale tells the composition's bias (compose.scale_bias)
            assert o.earlier_probe_s == pytest.approx(p["step_p50_s"]) and o.earlier_probe_scale is not None
            gaps.append(f["peak_reserved_gb"] - p["peak_reserved_gb"])
        learned = history.probe_margin(led, sweeps, cfg.stage)
        assert learned >= max(gaps) and learned != cfg.stage.probe_margin_gb  # every probed pair, not the default
        for o in seen.values():
            if o.fidelity == Fidelity.PROBE and o.peak_gb is not None:
                assert o.probe_margin_gb == learned
        spent = history.spent(led, "mf", stage=cfg.stage, probe_gpus=cfg.cluster.probe_gpus)
        probes = [x for x in run.launches if x[5] == Fidelity.PROBE]
        full = [x for x in run.launches if x[5] == Fidelity.FULL]
        # a probe is a few one-GPU tasks for start-up + 5 iterations, not N GPUs for a 350-iteration window
        per_probe, per_full = spent.by_fidelity["probe"] / len(probes), spent.by_fidelity["full"] / len(full)
        assert 0 < per_probe < per_full / cfg.stage.gpus
        assert spent.probe_pool_hours > 0  # on the side pool, beside the cluster's full-scale jobs
        # probes use no run: max_runs counts only the screen and full measurements
        assert spent.runs == len({x[1] for x in run.launches if x[5] != Fidelity.PROBE and x[3] is not None})
        # a probe's few iterations are never a step measurement: no probe-only layout is ever the best
        best = history.best_of(led, "mf")
        assert [m.fidelity for m in led.evidence.measured(sweep="mf") if m.key == best["key"]] == [Fidelity.FULL]


@pytest.mark.long
def test_any_searcher_gets_the_rungs_predicted_topk_screens_once_noise_is_measured(tmp_path):
    """The rungs are the schedule's, not a searcher's (orchestrator/schedule): predicted_topk, which never looks
    at a measurement to choose layouts, still runs its first round at scale (round 0, or round 1 after round 0's
    rank probes, policy.schedule.probe_led) at the full window, screens its later rounds at the
    window sized from the measured noise (any contender goes back to the full window), and its best is a
    full-window result. Without the warm start, as the test above (with it, a probe-led sweep's launches at scale
    are as short as a screen and are measured at the full window only)."""
    target = lib.Target("twin:balanced")
    cfg, led, run = _sweep(tmp_path, target, "policy.name=predicted_topk", "stage.warm_start.enabled=false")
    with led:
        by_round: dict[int, set] = {}  # by the round that launched them (a probed layout goes at scale later)
        for *_, fid, batch in run.launches:
            by_round.setdefault(batch, set()).add(fid)
        at_scale = {r: f - {Fidelity.PROBE} for r, f in by_round.items() if f - {Fidelity.PROBE}}
        first = min(at_scale)
        assert at_scale[first] == {Fidelity.FULL}  # no noise known yet
        assert any(Fidelity.SCREEN in f for r, f in at_scale.items() if r > first), by_round
        cands = led.candidates("mf")
        # its own picks, confirmations, and the schedule's rank probes of round 0 (policy.schedule.probe_led) and their
        # measurements at scale
        kinds = ("predicted-topk", "confirm", "fit-probe", "probed-fit", "probed-close")
        assert all(c.decision.kind in kinds for c in cands)
        confirmed = [c for c in cands if c.decision.kind == "confirm"]
        assert all([a.fidelity for a in led.attempts(c.id)] == [Fidelity.SCREEN, Fidelity.FULL] for c in confirmed)
        screened = [c for c in cands if c.decision.fidelity == Fidelity.SCREEN]
        full = sum(fidelity.window(cfg.stage, Fidelity.FULL))
        assert screened and all(
            sum(fidelity.window(cfg.stage, Fidelity.SCREEN, c.decision.measure_iters)) < full for c in screened
        )
        best = history.best_of(led, "mf")
        assert [m.fidelity for m in led.evidence.measured(sweep="mf") if m.key == best["key"]] == [Fidelity.FULL]
