"""stage.warm_start through the real CLI on the twin: round 0's launches save the seed (the routing-settled
weights) after their window, and every later launch at scale loads the first one that measured, warms up
only warm_start.warmup_iters and is charged for reading it; a seed that is gone is passed over."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from orchestrator import history
from orchestrator.core.paths import CheckpointPaths, JobPaths
from orchestrator.core.spec import JobSpec
from orchestrator.core.states import Fidelity
from orchestrator.ledger import queries
from orchestrator.ledger.ledger import Ledger
from tests.sweep.test_sweep_isolation import SCREENED
from tests.sweeplib import cli, ledger_url, new_sweep, sweep_args

WARM_UP = 2  # stage.warm_start.warmup_iters here; the stage's own is SCREENED's 6


def _spec(job_dir: str) -> JobSpec:
    return JobSpec.from_dict(json.loads(JobPaths(job_dir).spec.read_text()))


@pytest.fixture(scope="module")
def warm_sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("warm")
    # round 0 at scale (policy.schedule.probe_led off): the warm start's own mechanics; probe-led, the test below
    args = sweep_args(
        tmp, "warm", *SCREENED, f"stage.warm_start.warmup_iters={WARM_UP}", "policy.schedule.probe_led=false"
    )
    out = cli("sweep", *args, "--plain")
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    return ledger_url(tmp)


@pytest.mark.long
def test_probe_led_a_probed_layout_saves_the_seed_and_every_other_launch_at_scale_loads_it(tmp_path):
    """policy.schedule.probe_led (the default): round 0 only rank-probes; the seed is saved by the first launch at
    scale, a layout whose probe ran before it, and every other launch at scale loads it, none submitted before it
    ended."""
    out = cli("sweep", *sweep_args(tmp_path, "led", *SCREENED, f"stage.warm_start.warmup_iters={WARM_UP}"), "--plain")
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        seed = history.seed(led, led.get_sweep("led"))
        assert seed is not None
        atts = [a for c in led.candidates("led") for a in led.attempts(c.id)]
        round0 = [a for c in led.candidates("led") if c.round == 0 for a in led.attempts(c.id)[:1]]
        assert round0 and all(a.fidelity == Fidelity.PROBE for a in round0)  # nothing at scale in round 0
        at_scale = [a for a in atts if a.fidelity != Fidelity.PROBE]
        (saver,) = [a for a in at_scale if str(JobPaths(a.job_dir).seed_checkpoint) == seed]
        probed = [a for a in led.attempts(saver.candidate_id) if a.fidelity == Fidelity.PROBE]
        assert probed and probed[0].end_time is not None and probed[0].end_time <= saver.submit_time
        assert "--save" in _spec(saver.job_dir).argv
        others = [a for a in at_scale if a.id != saver.id]
        assert others and saver.end_time is not None
        for a in others:
            assert a.submit_time >= saver.end_time
            spec = _spec(a.job_dir)
            assert "--save" not in spec.argv and spec.argv[spec.argv.index("--load") + 1] == seed


@pytest.mark.long
def test_round_zero_saves_the_seed_and_every_later_launch_at_scale_loads_it(warm_sweep):
    with Ledger.open(warm_sweep) as led:
        cands = led.candidates("warm")
        seed = history.seed(led, led.get_sweep("warm"))
        assert seed is not None
        round0 = sorted((c for c in cands if c.round == 0), key=lambda c: c.id)
        seeder, waited = round0[0], round0[1:]
        (a,) = led.attempts(seeder.id)  # no seed yet: round 0's first launch saves one after its window
        spec = _spec(a.job_dir)
        n = spec.warmup_iters + spec.measure_iters
        assert seeder.decision.seed_save and not seeder.decision.warm_from and spec.warmup_iters == 6
        save = ["--save", str(JobPaths(a.job_dir).seed_checkpoint), "--save-interval", str(n)]
        assert spec.argv[-6:] == [*save, "--no-save-optim", "--no-save-rng"]
        assert seed == str(JobPaths(a.job_dir).seed_checkpoint)
        assert CheckpointPaths(seed).tracker.read_text().strip() == str(n)  # Megatron's tracker: saved at n
        # the rest of round 0 waited for it (after_seed), then was re-decided to load it, and started after it
        assert waited and all(c.decision.warm_from == seed and not c.decision.after_seed for c in waited)
        ended = led.attempts(seeder.id)[0].end_time
        assert ended is not None and all(led.attempts(c.id)[0].submit_time >= ended for c in waited)
        resolved = [e for e in led.events("warm") if "loads the seed" in (e.message or "")]
        assert {e.candidate_id for e in resolved} == {c.id for c in waited}
        later = [(c, a) for c in cands if c.round > 0 for a in led.attempts(c.id) if a.fidelity != Fidelity.PROBE]
        later += [(c, led.attempts(c.id)[0]) for c in waited]
        assert later and {c.decision.warm_from for c, _ in later} == {seed}
        for _c, a in later:
            spec = _spec(a.job_dir)
            assert "--save" not in spec.argv and spec.argv[-6:] == [
                "--load",
                seed,
                "--finetune",
                "--no-load-optim",
                "--no-load-rng",
                "--exit-on-missing-checkpoint",
            ]
            assert spec.warmup_iters == WARM_UP  # the full window's and the screen's warm-up alike
            logs = "".join(p.read_text() for p in JobPaths(a.job_dir).rank_logs())
            assert f"loading distributed checkpoint from {seed}" in logs
            result = led.evidence.result(a.id)
            assert result["warmup_iters"] == WARM_UP and result["measure_iters_requested"] >= 1
            # how many leading iterations ran above the steady step, read from the job's own iteration lines:
            # what later launches' warm-up is learned from (schedule/fidelity.learned_warmup). The twin's start-up
            # transient lasts a few iterations: a full window (40) sees it end; a 4-iteration screen may end
            # before it settles, and then says nothing (None), never a figure it did not see
            settled = result["settled_iters"]
            if a.fidelity == Fidelity.FULL:
                assert settled is not None and 1 <= settled < spec.warmup_iters + spec.measure_iters
            else:
                assert settled is None or settled >= 1


@pytest.mark.long
def test_a_warm_start_is_charged_for_reading_the_seed_and_the_seed_for_writing_it(warm_sweep):
    from orchestrator.config import compose

    stage = compose(["+stage=smoke", "stage.budget.startup_s=100"]).cfg.stage
    with Ledger.open(warm_sweep) as led:
        costs = [a for a in queries.attempt_costs(led, "warm") if a.step_mean_s and a.fidelity != Fidelity.PROBE]
    ws = stage.warm_start
    for a in costs:
        plain = replace(a, decision=a.decision.but(warm_from=None, seed_save=False))
        extra = (ws.load_s if a.decision.warm_from else 0.0) + (ws.save_s if a.decision.seed_save else 0.0)
        assert extra > 0
        assert history.attempt_cost(stage, a) - history.attempt_cost(stage, plain) == pytest.approx(
            stage.gpus * extra / 3600.0
        )


@pytest.mark.long
def test_a_seed_that_is_gone_is_passed_over(warm_sweep, tmp_path):
    import shutil

    with Ledger.open(warm_sweep) as led:
        sweep = led.get_sweep("warm")
        seed = history.seed(led, sweep)
        assert seed is not None
        moved = tmp_path / "moved"
        shutil.move(seed, moved)  # deleted by hand, or lost with its file system
        try:
            assert history.seed(led, sweep) is None  # never loaded: the sweep goes on cold, and says why
            assert "left no checkpoint" in (history.seedless(led, sweep) or "")
        finally:
            shutil.move(moved, seed)


@pytest.mark.parametrize("saved", [True, False])
def test_a_seeder_that_fails_hands_the_seed_to_the_first_waiting_launch(tmp_path, saved):
    """orchestrator/sweep/seeding.py: while the seeder is queued the others wait; once it ended without a seed
    (an OOM) the first waiting launch saves one (at the stage's own warm-up) and the rest wait for that; once
    its seed is on disk the rest load it; if it measured and left none, nobody waits again (cold)."""
    from orchestrator.config import compose
    from orchestrator.core.result import JobResult
    from orchestrator.ledger.ledger import CandidateIn
    from orchestrator.search.env import PlanEnv
    from orchestrator.sweep import seeding

    composed = compose(["+stage=smoke"])
    cfg = composed.cfg
    with Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}", create_dir=True) as led:
        sweep = new_sweep(led, "s", composed)
        env = PlanEnv(cfg.model, cfg.hardware, cfg.required_stage(), cfg.workload.name)
        decisions = [{"fidelity": "full", "seed_save": True}] + [{"fidelity": "full", "after_seed": True}] * 3
        a, b, c, d = led.add_candidates(
            "s",
            [
                CandidateIn(key=p.key, layout=p.layout.to_dict(), decision=dec)
                for p, dec in zip(env.plan()[:4], decisions)
            ],
        )

        def ran(row, ok: bool, folder: str, *, saved: bool = False) -> None:
            att = led.new_attempt(row.id, job_id=folder, job_dir=str(tmp_path / folder), simulated=True)
            res = JobResult(ok=ok, simulated=True, step_p50_s=1.0 if ok else None, failure_class=None if ok else "OOM")
            led.evidence.record_result(att.id, res.to_dict())
            if saved:
                tracker = CheckpointPaths(JobPaths(tmp_path / folder).seed_checkpoint).tracker
                tracker.parent.mkdir(parents=True)
                tracker.write_text("8")
            led.set_candidate_status(row.id, "done" if ok else "failed", "test")

        def decision(row) -> dict:  # as stored: the keys a resolved wait drops or adds
            return led.candidate_by_key("s", row.key).decision.to_dict()

        assert seeding.waiting(led, sweep) == {b.id, c.id, d.id}  # the seeder is still queued
        ran(a, False, "a")  # its OOM: no seed
        assert seeding.waiting(led, sweep) == {c.id, d.id}
        assert decision(b)["seed_save"] and "after_seed" not in decision(b)  # b saves it now, cold
        ran(b, True, "b", saved=saved)
        assert seeding.waiting(led, sweep) == set()  # nobody waits any more
        for row in (c, d):
            assert "after_seed" not in decision(row) and "seed_save" not in decision(row)
        if saved:  # both load b's seed
            seed = str(JobPaths(tmp_path / "b").seed_checkpoint)
            assert history.seed(led, sweep) == seed and history.seedless(led, sweep) is None
            assert decision(c)["warm_from"] == decision(d)["warm_from"] == seed
        else:  # b measured and saved nothing (a workload without --save): the sweep runs cold, and says why
            why = history.seedless(led, sweep)
            assert why and "left no checkpoint" in why and str(tmp_path / "b") in why
            assert "warm_from" not in decision(c) and "warm_from" not in decision(d)
            assert {e.candidate_id for e in led.events("s") if why in (e.message or "")} == {c.id, d.id}


@pytest.mark.long
def test_an_8k_sweep_loads_its_1k_sources_seed_from_round_zero(tmp_path):
    """Promotion (1k -> 8k): the 8k sweep saves no seed of its own; every launch at scale, round 0 included,
    loads the seed of the 1k sweep it promotes from, in every round (setup.recorded_source)."""
    from orchestrator.config import compose
    from tests.bench import searchlib as lib

    target = lib.Target("twin:balanced")
    small = ["stage.budget.max_runs=7", "stage.budget.max_rounds=2", *target.overrides()]
    with lib.fresh_ledger(str(tmp_path)) as led:
        lib.run_sweep(led, compose(["+stage=1k", "cluster=local", *small]), target, "one", 300.0)
        seed = history.seed(led, led.get_sweep("one"))
        assert seed is not None
        lib.run_sweep(led, compose(["+stage=8k", "cluster=local", *small]), target, "eight", 300.0)
        cands = [c for c in led.candidates("eight") if c.decision.fidelity != Fidelity.PROBE]
        assert {c.round for c in cands} == {0, 1}
        assert all(c.decision.warm_from == seed and not c.decision.seed_save for c in cands)
        assert history.seed(led, led.get_sweep("eight")) is None
