"""Reasoning from what ran: a layout that needs no more memory than one measured to fit is never pruned by the
memory model (select.fit_dominated, the knob order `needs_more_memory`), not probed, and proposed."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.config import compose
from orchestrator.core.schema import PolicyConfig, Round0SpreadConfig
from orchestrator.plan import planner
from orchestrator.schedule.steps.fit_probes import probes
from orchestrator.search import make_policy
from orchestrator.search.env import PlanEnv
from orchestrator.search.select import fit_dominated, needs_more_memory, ran
from orchestrator.search.types import Observation, RoundInput
from tests.bench import searchlib as lib


def _schedule(policy: PolicyConfig, **changes) -> PolicyConfig:
    """`policy` with these of its policy.schedule settings changed."""
    return dataclasses.replace(policy, schedule=dataclasses.replace(policy.schedule, **changes))


@pytest.fixture(scope="module")
def setting():
    """The 1k stage, and a pair (ran, pruned): `pruned` needs no more memory than `ran` by the knob order, the
    uncalibrated model puts both over HBM and predicts `pruned` the heavier (deeper PP at the same VPP keeps
    more microbatch-chunks in flight, or another dispatcher: what the knob order leaves to the model), so
    calibrating on `ran` alone still prunes it. Of such pairs, the one whose `pruned` is predicted fastest
    next to its `ran`: a neighbour the searcher finds worth measuring."""
    cfg = compose(["+stage=1k", "cluster=local", *lib.FIXED_MEGATRON]).cfg
    env = PlanEnv(cfg.model, cfg.hardware, cfg.stage, cfg.workload.name)
    hw = dataclasses.replace(cfg.hardware, hbm_gb=float("inf"))
    legal = planner.plan(cfg.model, hw, cfg.stage, workload=cfg.workload.name).candidates
    over = [c for c in legal if not env.fits(c.prediction.memory_gb)]
    kept = {c.key for c in env.plan()}
    pairs = [
        (ran, c)
        for ran in over
        for c in over
        if c.key != ran.key
        and needs_more_memory(ran.layout, c.layout)
        and c.prediction.memory_gb > 1.05 * ran.prediction.memory_gb
    ]
    assert pairs, "no pair of pruned layouts ordered by needs_more_memory at 1k"
    ran, c = min(pairs, key=lambda p: p[1].prediction.step_time_s / p[0].prediction.step_time_s)
    assert c.key not in kept  # the model prunes it
    return cfg, env, ran, c


def _ran(planned, *, step=1.0, peak=136.0) -> Observation:
    raw = planned.prediction
    return Observation(
        key=planned.key,
        layout=planned.layout,
        raw_components=dict(raw.step_components),
        raw_step_s=raw.step_time_s,
        raw_memory_gb=raw.memory_gb,
        step_s=step,
        peak_gb=peak,
        hbm_gb=141.0,
        raw_memory_terms=tuple(raw.memory_terms_by_stage),
    )


def _calibrated(cfg, env, row: Observation, slots: int = 100):
    """calibrated_neighbours after one measured row: the policy, its round input and its calibration. A round may
    fill all its `slots` from the model's ranking (policy.search.fill_per_round), so a proposal asked of it is
    every layout it would measure next."""
    search = dataclasses.replace(cfg.policy.search, fill_per_round=slots)
    policy = make_policy(dataclasses.replace(cfg.policy, name="calibrated_neighbours", search=search))
    inp = RoundInput(round=1, observations=[row], known_keys={row.key}, slots=slots, gpu_hours_left=1e12)
    return policy, inp, policy.fit(env, inp)


@pytest.mark.long
def test_a_layout_dominated_by_a_measured_fit_is_never_pruned(setting):
    cfg, env, ran, pruned = setting
    row = _ran(ran)
    assert fit_dominated(pruned.layout, [row]) and not fit_dominated(pruned.layout, [])
    # an OOM is no evidence of fitting
    assert not fit_dominated(pruned.layout, [dataclasses.replace(row, step_s=None, peak_gb=None, failure_class="OOM")])
    keys = [c.key for c in env.plan_with_evidence(None, 1.0, lambda lay: fit_dominated(lay, [row]))]
    assert pruned.key in keys and pruned.key not in [c.key for c in env.plan()]
    # the calibrated searcher keeps it among what it may propose, whatever its memory model says: asked for
    # every layout it would measure next, it proposes the pruned one
    policy, inp, fit = _calibrated(cfg, env, row, slots=10_000)
    assert fit is not None and not env.fits(
        env.evaluate_unchecked(pruned.layout, fit.factors, fit.memory_scale).prediction.memory_gb
    ), "the calibrated model must still prune it for this test to say anything"
    props = policy.propose(env, inp, size=2_000, fit=fit)
    assert pruned.key in [p.key for p in props]
    p = next(p for p in props if p.key == pruned.key)
    assert "known to fit" in p.reason


@pytest.mark.long
def test_a_layout_known_to_fit_is_not_fit_probed(setting):
    """A probe answers what no evidence covers: a layout the knob order already places under a measured fit
    gets none."""

    cfg, env, ran, pruned = setting
    row = _ran(ran)
    _, inp, fit = _calibrated(cfg, env, row)
    probed = {p.key for p in probes(cfg.policy, env, inp, fit, 1.0, set(), limit=10_000)}
    assert pruned.key not in probed


@pytest.mark.long
def test_fit_probes_go_where_the_searcher_sees_promise(setting):
    """The schedule probes the pruned layouts its searcher rates best (Policy.estimate), not those the calibrated
    step alone rates best: on twin:overpredicted the optimum's calibrated step was 28% over the best measured
    (out of the probes' reach) while calibrated_neighbours' optimistic bound put it 12% under."""
    from orchestrator.search.moves import fit_residual, optimistic

    cfg, env, ran, _ = setting
    row = _ran(ran)
    policy, inp, fit = _calibrated(cfg, env, row)
    band = [
        c
        for c in env.memory_band(fit, fit.factors)
        if not c.prediction.feasible and not fit_dominated(c.layout, [row]) and c.key != row.key
    ]
    assert len(band) >= 2, "the test needs at least two pruned layouts inside the memory model's error band"
    slowest = max(band, key=lambda c: c.prediction.step_time_s)
    fastest = min(band, key=lambda c: c.prediction.step_time_s)
    best_step = fastest.prediction.step_time_s  # the slowest one's calibrated step is out of the probes' reach
    assert slowest.prediction.step_time_s > best_step * (1 + cfg.policy.search.max_predicted_loss)
    (plain,) = probes(cfg.policy, env, inp, fit, best_step, set(), limit=1)
    assert plain.key == fastest.key  # as the calibrated step rates them

    def rate(layout, step_s):  # a searcher that sees the slowest as the most promising
        return 0.5 * best_step if layout == slowest.layout else 2.0 * step_s

    (rated,) = probes(cfg.policy, env, inp, fit, best_step, set(), rate, limit=1)
    assert rated.key == slowest.key and rated.fidelity == "probe"
    # nothing the searcher rates out of reach is probed, however the calibrated step rates it
    assert probes(cfg.policy, env, inp, fit, best_step, set(), lambda lay, s: 10.0 * best_step, limit=1) == []
    # calibrated_neighbours rates by the optimistic bound its proposals rank by
    res = fit_residual([row], lambda r: fit.predict(r.raw_components))
    bound = policy.estimate(inp, fit)
    assert bound(slowest.layout, 50.0) == pytest.approx(
        optimistic(50.0, *res.predict(slowest.layout), cfg.policy.search.explore)
    )
    assert policy.estimate(inp, None)(slowest.layout, 50.0) == 50.0  # uncalibrated: the prediction as it is


@pytest.mark.long
def test_one_probe_per_memory_footprint(setting):
    """Layouts that differ only in the dispatcher run the same probe (a flex layout is probed with alltoall,
    argv.probe_argv), so a round probes one of them: the best rated."""
    from orchestrator.search.select import same_memory

    cfg, env, ran, _ = setting
    row = _ran(ran)
    policy, inp, fit = _calibrated(cfg, env, row)
    band = [c for c in env.memory_band(fit, fit.factors) if not c.prediction.feasible]
    siblings = [(a, b) for a in band for b in band if a.key != b.key and same_memory(a.layout, b.layout)]
    assert siblings, "the test needs dispatcher siblings inside the memory model's error band"
    a, b = siblings[0]
    assert a.layout.dispatcher != b.layout.dispatcher or a.layout.flex_backend != b.layout.flex_backend
    assert not same_memory(a.layout, dataclasses.replace(a.layout, mbs=a.layout.mbs * 2))
    led = _schedule(cfg.policy, probe_led=True)
    probed = probes(led, env, inp, fit, 1e9, set(), policy.estimate(inp, fit), limit=10_000)
    assert len(probed) >= 2
    assert not any(same_memory(p.layout, q.layout) for i, p in enumerate(probed) for q in probed[:i])
    # every footprint of the band is still probed once (none is lost to the deduplication)
    footprints = [c for i, c in enumerate(band) if not any(same_memory(c.layout, o.layout) for o in band[:i])]
    assert len(probed) == len([c for c in footprints if not fit_dominated(c.layout, [row])])
    # not probe-led (policy.schedule.probe_led=false): each sibling is probed on its own
    plain = probes(_schedule(led, probe_led=False), env, inp, fit, 1e9, set(), policy.estimate(inp, fit), limit=10_000)
    assert len(plain) > len(probed)


@pytest.mark.long
def test_round_0_probes_the_pruned_region_before_anything_ran(setting):
    """Before any run the memory model is least to be trusted where the fastest layouts lie (issue 19: 1.6-3x
    high), so round 0 also probes policy.schedule.round0_spread.probes of the layouts the uncalibrated model prunes
    inside its default band, spread over EP, PP (with VPP), CP and recompute, one per memory footprint (probe-led
    rounds,
    policy.schedule.probe_led), beside round 0's own layouts."""
    from orchestrator.schedule import Schedule
    from orchestrator.search import memfit
    from orchestrator.search.select import same_memory

    cfg, env, _, _ = setting
    led = _schedule(dataclasses.replace(cfg.policy, name="calibrated_neighbours"), probe_led=True)
    policy = make_policy(led)
    inp = RoundInput(round=0, observations=[], known_keys=set(), slots=100, gpu_hours_left=1e12)
    plan = Schedule(led).plan(policy, env, inp)
    probes = [p for p in plan.proposals if p.reason.startswith("fit-probe")]
    own = [p for p in plan.proposals if not p.reason.startswith("fit-probe")]
    assert len(probes) == led.schedule.round0_spread.probes > 0
    assert len(own) == led.schedule.round0_size and all(p.fidelity == "probe" for p in plan.proposals)
    hbm, margin = cfg.hardware.hbm_gb, cfg.stage.memory_margin_gb
    for p in probes:
        raw = p.predicted["raw_memory_gb"]
        assert raw + margin > hbm >= raw * (1 - memfit.DEFAULT_BAND)  # pruned, yet inside the model's band
        assert p.probe_ranks and p.probe_ranks[0] == 0 and p.probe_ranks[-1] == cfg.stage.gpus - 1
    assert not any(same_memory(p.layout, q.layout) for i, p in enumerate(probes) for q in probes[:i])
    assert len({p.layout.ep for p in probes}) > 1 and len({(p.layout.pp, p.layout.vpp) for p in probes}) > 1
    off = Schedule(_schedule(led, round0_spread=Round0SpreadConfig(probes=0))).plan(policy, env, inp)
    assert [p.key for p in off.proposals] == [p.key for p in own]


@pytest.mark.long
def test_round_0_probes_first_and_the_best_composed_saves_the_seed(setting):
    """policy.schedule.probe_led: the cold launch that saves the seed (the stage's whole warm-up, ~7 warm
    launches' worth at 1k) is chosen on evidence. Round 0 rank-probes every layout before any launch at scale;
    round 1 measures the probed fits at scale, best composed step (the probe's compute + the communication)
    first, so the fastest saves the seed and the rest wait for it; nothing that OOMed on its probe goes."""
    from orchestrator.schedule import Schedule
    from orchestrator.search import compose

    cfg, env, _, _ = setting
    pol = _schedule(dataclasses.replace(cfg.policy, name="calibrated_neighbours"), probe_led=True)
    policy, sched = make_policy(pol), Schedule(pol)
    inp0 = RoundInput(round=0, observations=[], known_keys=set(), slots=100, gpu_hours_left=1e12)
    r0 = sched.plan(policy, env, inp0).proposals
    assert len(r0) >= pol.schedule.round0_size and all(p.fidelity == "probe" for p in r0)  # nothing at scale yet
    # the probes report: the first OOMs, the rest fit, each with its compute-only step (the reverse of the
    # order the model predicted them in, so evidence, not the prediction, must decide the order)
    rows = []
    for i, p in enumerate(r0):
        comps, raw_step, raw_mem = env.raw(p.layout)
        oom, close = i == 0, i == len(r0) - 1  # the last ran, its peak + the probe margin over HBM: too close
        rows.append(
            Observation(
                key=p.key,
                layout=p.layout,
                raw_components=comps,
                raw_step_s=raw_step,
                raw_memory_gb=raw_mem,
                peak_gb=None if oom else cfg.hardware.hbm_gb + 1.0 if close else 100.0,
                failure_class="OOM" if oom else None,
                hbm_gb=cfg.hardware.hbm_gb,
                fidelity="probe",
                probe_step_s=None if oom else 10.0 * (len(r0) - i),
                raw_probe_s=env.raw_probe_s(p.layout),
            )
        )
    inp1 = RoundInput(round=1, observations=rows, known_keys={r.key for r in rows}, slots=100, gpu_hours_left=1e12)
    plan = sched.plan(policy, env, inp1)
    fits = [r for r in rows if r.failure_class is None]
    fit = plan.fit

    def composed(r):
        return fit.predict_row(r) if fit is not None else compose.step({}, r.raw_components, r.probe_scale)

    expected = [r.key for r in sorted(fits, key=composed)][: pol.schedule.round0_size]
    assert expected[0] != fits[0].key  # the model's favourite among the fits is not the evidence's
    confirms = [c for c in plan.confirms if c.reason.startswith("probed")]
    assert [c.key for c in confirms] == expected and rows[0].key not in [c.key for c in plan.confirms]
    # too close to call is no fit (nothing is dominated by it), but only a launch at scale settles it
    last = rows[-1]
    assert last.probe_ran and not last.probed_fit and not ran(last)
    (close,) = [c for c in confirms if c.key == last.key]
    assert close.reason.startswith("probed-close")
    assert all(c.reason.startswith("probed-fit") for c in confirms if c.key != last.key)
    assert all(c.fidelity == "full" for c in confirms)
    first, *rest = confirms
    assert first.seed_save and not first.after_seed and all(c.after_seed and not c.seed_save for c in rest)
    # off (policy.schedule.probe_led=false): round 0 launches at scale as ever, and probes nothing
    off = Schedule(_schedule(pol, probe_led=False)).plan(policy, env, inp0).proposals
    assert [p.fidelity for p in off] == ["full"] * pol.schedule.round0_size


@pytest.mark.long
def test_a_promoted_stage_probes_its_promoted_mappings_before_any_launch_at_scale():
    """policy.schedule.probe_led at a promoted stage (8k from 1k): the source's winner was measured on 1,024 GPUs,
    its 8k mappings would be cold launches the memory model placed, so round 0 rank-probes them beside the model's own
    picks, and nothing goes at scale before evidence from this stage's GPUs; off, the promoted mappings launch."""
    from orchestrator.schedule import Schedule

    src_cfg = compose(["+stage=1k", "cluster=local", *lib.FIXED_MEGATRON]).cfg
    cfg = compose(["+stage=8k", "cluster=local", *lib.FIXED_MEGATRON]).cfg
    src_env = PlanEnv(src_cfg.model, src_cfg.hardware, src_cfg.stage, src_cfg.workload.name)
    env = PlanEnv(cfg.model, cfg.hardware, cfg.stage, cfg.workload.name)
    source = [_ran(c, step=30.0 + i, peak=120.0) for i, c in enumerate(src_env.plan()[:4])]
    pol = _schedule(dataclasses.replace(cfg.policy, name="calibrated_neighbours"), probe_led=True)
    policy = make_policy(pol)
    inp = RoundInput(round=0, observations=[], known_keys=set(), slots=100, gpu_hours_left=1e12, source=source)
    props = Schedule(pol).plan(policy, env, inp, source_stage=src_cfg.stage).proposals
    promoted = [p for p in props if p.reason.startswith("promoted")]
    assert promoted and promoted[0].parent_key == source[0].key  # the source's winner leads
    assert all(p.fidelity == "probe" and p.probe_ranks for p in props)  # nothing at scale yet
    off = Schedule(_schedule(pol, probe_led=False)).plan(policy, env, inp, source_stage=src_cfg.stage)
    assert [p.fidelity for p in off.proposals if p.reason.startswith("promoted")] == ["full"] * len(promoted)


@pytest.mark.long
def test_a_knob_value_no_layout_ran_with_gets_a_coverage_probe(setting):
    """Step coverage_probes: a region no row of this stage ran in has only the calibrated model to speak for it,
    and the model's compute is wrong region by region (a CP or recompute level it never saw), so the best rated
    layout of each knob value no layout that ran carries gets a rank probe, the best rated values first, at most
    policy.schedule.coverage_probes.per_round a round; once a layout with that value ran, the value is covered. The
    dispatcher is never one: a rank probe runs alltoall whatever the layout's dispatcher."""
    from orchestrator.schedule.steps.coverage_probes import COVERED_KNOBS, coverage
    from orchestrator.search.select import knob_value, value_label

    cfg, env, ran_, _ = setting
    row = _ran(ran_)
    _, inp, fit = _calibrated(cfg, env, row)
    pool = [c for c in env.plan(fit.factors, fit.memory_scale) if c.key != row.key]

    def by_step(layout, step_s):  # the searcher's rating: here the calibrated step as it is
        return step_s

    uncovered = {
        (k, knob_value(c.layout, k))
        for k in COVERED_KNOBS
        for c in pool
        if knob_value(c.layout, k) != knob_value(row.layout, k)
    }
    assert len(uncovered) > 2
    every = coverage(env, inp, fit, 1.0, set(), by_step, limit=10_000)
    assert all(p.fidelity == "probe" and p.probe_ranks and p.reason.startswith("coverage-probe") for p in every)
    # each uncovered value is carried by a probe, and each probe names the value it covers, never a dispatcher
    assert all(any(knob_value(p.layout, k) == v for p in every) for k, v in uncovered)
    assert all("dispatcher" not in p.reason for p in every) and len({p.key for p in every}) == len(every)
    # one a round: the best rated of the values' best layouts
    (one,) = coverage(env, inp, fit, 1.0, set(), by_step, limit=1)
    bests = [
        min((c for c in pool if knob_value(c.layout, k) == v), key=lambda c: c.prediction.step_time_s)
        for k, v in uncovered
    ]
    assert one.key == min(bests, key=lambda c: c.prediction.step_time_s).key
    # once it ran, the values it carried are covered: no probe names them again
    ran_too = dataclasses.replace(_ran(env.evaluate_unchecked(one.layout, None, 1.0)), key=one.key)
    inp2 = dataclasses.replace(inp, observations=[row, ran_too], known_keys={row.key, one.key})
    again = coverage(env, inp2, fit, 1.0, set(), by_step, limit=10_000)
    named = {p.reason.split(" with ", 1)[1].split(" ran", 1)[0] for p in again}
    assert not any(value_label(k, knob_value(one.layout, k)) in named for k in COVERED_KNOBS)
    assert len(again) < len(every)
