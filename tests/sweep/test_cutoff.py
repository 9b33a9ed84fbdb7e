"""The early cut (stage.screen.cut*): a launch at scale whose first iterations are clearly slower than the sweep's
best full-window step stops there and is kept as a screen of what it ran. The rule (schedule/fidelity.CutLine),
the schedule writing it into decisions, collect reading a cut folder, the in-process sweep (the bench's), the
real driver cutting a running job on the local executor, and `ledger ingest` rebuilding such a sweep from its
folders once its ledger is gone."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator import history
from orchestrator.core.decision import CutLine, Decision
from orchestrator.core.schema import ScreenConfig, StageConfig
from orchestrator.core.states import EventKind, Fidelity
from orchestrator.evidence.collect import collect, cut_window, read_cut
from orchestrator.job.entry import run_task
from orchestrator.ledger.ledger import Ledger
from orchestrator.schedule import fidelity
from tests import sweeplib
from tests.evidence.test_collect import make_spec
from tests.search.test_policy_fidelity import _sweep
from tests.sweeplib import cli, sweep_args

STAGE = StageConfig(warmup_iters=300, measure_iters=50)


@given(
    times=st.lists(st.floats(0.5, 2.0), max_size=30),
    after=st.integers(2, 20),
    skip=st.integers(0, 19),
    line=st.floats(0.5, 2.0),
)
def test_a_cut_is_due_once_its_iterations_ran_and_their_median_is_over_the_line(times, after, skip, line):
    cut = CutLine(line, after, min(skip, after - 1))
    got = cut.due(times)
    if len(times) < after:
        assert got is None
        return
    med = statistics.median(times[cut.skip : after])
    assert got == (med if med > line else None)
    assert cut.due([*times[:after], *([99.0] * 5)]) == got  # iterations past the line's do not move it
    assert cut.window_at(cut.reach(times)) == (cut.skip, after - cut.skip)
    assert CutLine.from_dict(cut.to_dict()) == cut


# Held-out twin:overpredicted s136's 1k optimum (step 38.4 s) as its screen ran under a 54.3 s line: three straggler
# spikes (x1.6) in iterations 6-10 put the median at 59.7 s (docs/search-log.md "A split window reads on").
SPIKED = [116.5, 66.4, 46.7, 43.2, 39.2, 37.6, 59.8, 60.2, 40.0, 59.7]


@given(times=st.lists(st.floats(0.5, 2.0), max_size=30), line=st.floats(0.5, 2.0), split=st.floats(0.0, 1.0))
def test_the_split_only_ever_spares_a_launch_the_median_would_cut(times, line, split):
    plain, read_on = CutLine(line, 10, 5), CutLine(line, 10, 5, split)
    if read_on.due(times) is not None:
        assert plain.due(times) is not None
    if plain.due(times) is None:
        assert read_on.reach(times) == 10  # under its line: decided on its first window


def test_a_split_window_reads_as_many_iterations_again_before_it_cuts():
    line = CutLine(54.3, 10, 5, 0.2)
    assert line.reach(SPIKED) == line.longest == 15 and line.due(SPIKED) is None  # over the line, but it reads on
    assert line.due([*SPIKED, 38.7, 37.6, 39.0, 38.2]) is None  # its reach not yet run
    runs_on = [*SPIKED, 38.7, 37.6, 39.0, 38.2, 38.9]
    assert line.due(runs_on) is None  # iterations 6-15 put it under the line: never cut
    still = [*SPIKED, *([60.0] * 5)]
    assert line.due(still) == statistics.median(still[5:15])  # slow over the longer window too: cut there
    assert line.window_at(line.reach(still)) == (5, 10)
    slow = [*SPIKED[:5], 59.8, 60.2, 58.9, 59.7, 61.0]  # slow throughout: cut on its first window, as ever
    assert line.reach(slow) == 10 and line.due(slow) == 59.8 and line.window_at(line.reach(slow)) == (5, 5)
    assert CutLine(54.3, 10, 5).due(SPIKED) == 59.7  # without the split the spikes cut it
    under = CutLine(60.5, 10, 5, 0.2)  # the same window under its line: decided on it, never read on
    assert under.reach(SPIKED) == 10 and under.due(SPIKED) is None and under.due([*SPIKED, *([99.0] * 5)]) is None
    assert CutLine.from_dict(line.to_dict()) == line
    assert "split" not in CutLine(54.3, 10, 5).to_dict()  # a line without it is stored as before, and reads back
    assert CutLine.from_dict({"step_s": 54.3, "after": 10, "skip": 5}) == CutLine(54.3, 10, 5)


def test_the_driver_reads_a_split_window_on_and_marks_the_iterations_its_verdict_read(tmp_path):
    """cutoff.check on a running job's folder: the spiked window is not due at iteration 10; once the slow
    iterations 11-15 are in, it is cut, and the mark names the window collect reads (warm-up 5, 10 measured), as
    does the ledger's cut event."""
    from types import SimpleNamespace

    from orchestrator.job.twin.text import iteration_line
    from orchestrator.sweep import cutoff

    def write(times: list[float]) -> None:
        rows = [
            iteration_line(i, 50, i * 8, t * 1000.0, 100.0, 1e-4, 8, [("lm loss", 2.0)], 1.0)
            for i, t in enumerate(times, 1)
        ]
        (tmp_path / "rank-7.out").write_text("\n".join(rows) + "\n")

    line = CutLine(54.3, 10, 5, 0.2)
    c = SimpleNamespace(decision=Decision(fidelity=Fidelity.FULL, cut=line))
    a = SimpleNamespace(fidelity=Fidelity.FULL, job_dir=str(tmp_path), job_id="j1", launch_token="t1")
    write(SPIKED)
    early = cutoff.check(a, c, STAGE, None)
    assert early is not None and early.median_s is None and not early.done  # reads on
    write([*SPIKED, *([60.0] * 5)])
    found = cutoff.check(a, c, STAGE, None)
    assert found is not None and found.median_s == pytest.approx(60.0) and found.reach == 15
    cutoff.mark(a, found)
    assert cut_window(read_cut(str(tmp_path))) == (5, 10)
    led = Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}")
    led.create_or_get_sweep("s", stage="1k", config_yaml="{}", model="m", hardware="h", workload="w", provenance={})
    assert "over iterations 6-15" in cutoff.log(led, "s", None, "j1", read_cut(str(tmp_path)))


def test_the_line_is_the_best_full_step_plus_the_margin_and_only_where_a_cut_saves_something():
    full, sc = Decision(fidelity=Fidelity.FULL), STAGE.screen
    line = fidelity.cut_line(STAGE, 10.0, full)
    assert line == CutLine(10.0 * (1 + sc.cut_margin), sc.cut_after, sc.cut_warmup_iters, sc.cut_split)
    assert (
        fidelity.cut_line(STAGE, 10.0, Decision(fidelity=Fidelity.SCREEN, measure_iters=10)) == line
    )  # 50 + 10 iterations
    assert fidelity.cut_line(STAGE, None, full) is None  # no full-window best yet
    # before any best, the seed's launch alone is held to its own expected step (composed or predicted)
    seed = Decision(fidelity=Fidelity.FULL, seed_save=True)
    own = CutLine(20.0 * (1 + sc.seed_cut_margin), sc.cut_after, sc.cut_warmup_iters, sc.cut_split)
    assert fidelity.cut_line(STAGE, None, seed, 20.0) == own
    assert fidelity.cut_line(STAGE, None, seed) is None  # nothing expected: no line
    assert fidelity.cut_line(STAGE, None, full, 20.0) is None  # only the seed's launch waits out the warm-up
    assert fidelity.cut_line(STAGE, 10.0, seed, 20.0) == line  # once there is a best, the best's line
    assert (
        fidelity.cut_line(STAGE, 10.0, Decision(fidelity=Fidelity.PROBE)) is None
    )  # a probe measures compute: never cut
    short = dataclasses.replace(STAGE, warmup_iters=5, measure_iters=sc.cut_after - 5)
    assert fidelity.cut_line(short, 10.0, full) is None  # it ends there anyway
    off = dataclasses.replace(STAGE, screen=ScreenConfig(cut=False))
    assert fidelity.cut_line(off, 10.0, full) is None
    assert Decision.from_dict({"fidelity": "full"}).cut is None and CutLine.from_dict(None) is None


@given(planned=st.floats(1.0, 100.0), best=st.none() | st.floats(1.0, 100.0))
def test_a_running_line_is_the_planned_one_lowered_to_the_best_held_now_never_raised(planned, best):
    sc = STAGE.screen
    d = Decision(fidelity=Fidelity.FULL, cut=CutLine(planned, sc.cut_after, sc.cut_warmup_iters))
    got = fidelity.running_line(STAGE, d, best)
    assert got is not None and (got.after, got.skip) == (sc.cut_after, sc.cut_warmup_iters)
    now = best * (1 + sc.cut_margin) if best is not None else planned
    assert got.step_s == min(planned, now)
    assert fidelity.running_line(STAGE, Decision(fidelity=Fidelity.FULL), best) is None  # planned without a line


def test_the_driver_cuts_at_the_best_it_holds_as_the_job_runs_not_the_one_it_was_planned_with(tmp_path):
    """A launch planned against a 10 s best whose iterations run at 9 s: within its planned line (10.5 s), over
    its running line once a layout measured at 8 s earlier in the round (8.4 s): cut, and the verdict names the
    lowered line."""
    from types import SimpleNamespace

    from orchestrator.job.twin.text import iteration_line
    from orchestrator.sweep import cutoff

    sc = STAGE.screen
    lines = [iteration_line(i, 50, i * 8, 9000.0, 100.0, 1e-4, 8, [("lm loss", 2.0)], 1.0) for i in range(1, 20)]
    (tmp_path / "rank-7.out").write_text("\n".join(lines) + "\n")
    planned = fidelity.cut_line(STAGE, 10.0, Decision(fidelity=Fidelity.FULL))
    c = SimpleNamespace(decision=Decision(fidelity=Fidelity.FULL, cut=planned))
    a = SimpleNamespace(fidelity=Fidelity.FULL, job_dir=str(tmp_path))
    held = cutoff.check(a, c, STAGE, 10.0)
    assert held is not None and held.median_s is None and held.done  # under its line: runs on
    found = cutoff.check(a, c, STAGE, 8.0)
    assert found is not None and found.median_s == pytest.approx(9.0)
    assert found.line.step_s == pytest.approx(8.0 * (1 + sc.cut_margin))


def test_a_running_jobs_iteration_times_stop_at_the_first_missing_iteration(tmp_path):
    """What the driver reads every poll: the evidence rank's iteration lines in order, up to the first gap (a
    coarser --log-interval never cuts), never another rank's node log."""
    from orchestrator.evidence.collect import iteration_times
    from orchestrator.job.twin.text import iteration_line

    def line(it: int, ms: float) -> str:
        return iteration_line(it, 50, it * 8, ms, 100.0, 1e-4, 8, [("lm loss", 2.0)], 1.0)

    (tmp_path / "rank-7.out").write_text("\n".join(line(i, 1000.0 * i) for i in (1, 2, 3, 5, 6)) + "\n")
    (tmp_path / "node-n1.log").write_text(f"3: {line(4, 4000.0)}\n")  # another rank's output, never read
    assert iteration_times(tmp_path, 6) == [1.0, 2.0, 3.0]
    assert iteration_times(tmp_path, 2) == [1.0, 2.0]


@pytest.mark.long
def test_a_cut_folder_is_the_screen_of_the_iterations_its_cut_read(smoke, tmp_path):
    """collect: the mark turns the sweep's own cancel into the measurement of iterations skip+1..after; without
    the mark the same cancel is CANCELLED; a mark whose iterations the logs lack is no measurement."""
    cfg, (planned, *_) = smoke
    spec = make_spec(cfg, planned, tmp_path / "job")
    run_task(spec)
    folder = tmp_path / "job"
    plain = collect(folder, slurm_state="CANCELLED")
    assert not plain.ok and plain.failure_class == "CANCELLED"
    mark = {"step_s": 0.001, "warmup_iters": 2, "measure_iters": 6, "median_s": 0.5}
    (folder / "cut.json").write_text(json.dumps(mark))
    res = collect(folder, slurm_state="CANCELLED")
    assert res.ok and res.failure_class is None and not res.partial
    assert (res.warmup_iters, res.measure_iters_requested, res.measure_iters) == (2, 6, 6)
    assert len(res.step_times_s) == 6 and res.step_p50_s == pytest.approx(statistics.median(res.step_times_s))
    (folder / "cut.json").write_text(json.dumps({**mark, "measure_iters": 997}))
    lacking = collect(folder, slurm_state="CANCELLED")
    assert not lacking.ok and lacking.failure_class == "CANCELLED"


@pytest.mark.long
def test_an_in_process_sweep_cuts_slow_launches_and_never_reports_one(tmp_path):
    """The bench's sweep (the product's decisions, in-process launches cut by the same line): launches planned
    once a best exists carry the line, and so do round 0's launches that waited for the seed (released after
    the seed's launch measured the first best); each cut one is a screen of cut_after - cut_warmup_iters
    iterations whose median is over its line; the reported best is a full window; and the sweep spends less
    than without cuts."""
    from tests.bench import searchlib as lib

    target = lib.Target("twin:gemm")
    cfg, led, run = _sweep(tmp_path / "on", target, cut=True)
    _, led_off, run_off = _sweep(tmp_path / "off", target)
    sc = cfg.stage.screen
    with led, led_off:
        cands = led.candidates("mf")
        r0 = [c for c in cands if c.round == 0]
        assert all(c.decision.cut for c in r0 if c.decision.seed_save)  # no best: its own expected step's line
        waited = [c for c in r0 if c.decision.warm_from]  # released once the seed's launch measured
        assert waited and all(c.decision.cut for c in waited)
        lined = [c for c in cands if c.decision.cut]
        assert lined and all(c.decision.fidelity != Fidelity.PROBE for c in lined)
        best = history.best_of(led, "mf")
        cut = []
        for c in lined:
            line = c.decision.cut
            assert line is not None
            if not (c.round == 0 and c.decision.seed_save):  # planned before any best: its own line (test below)
                assert line.step_s >= best["step_p50_s"] * (1 + sc.cut_margin) * (1 - 1e-9)
            for a in led.attempts(c.id):
                res = led.evidence.result(a.id)
                if res and res["measure_iters"] == sc.cut_after - sc.cut_warmup_iters and a.fidelity == "screen":
                    cut.append(c.key)
                    assert res["warmup_iters"] == sc.cut_warmup_iters
                    assert res["step_p50_s"] > line.step_s  # the median of the iterations its cut read
        assert cut and best["key"] not in cut
        assert run.gpu_hours < run_off.gpu_hours
        assert not any(c.decision.cut for c in led_off.candidates("mf"))


@pytest.mark.long
def test_a_seed_launch_far_over_its_own_expected_step_is_cut_and_the_next_launch_saves_the_seed(tmp_path):
    """twin:mixed seed 125 at 1k: round 0 gave the seed's launch (the one launch waiting out the stage's 300-iteration
    warm-up) to the layout with the best composed step, which runs ~2.9x over it at scale; without a best to cut
    against it ran its whole warm-up. Held to its own expected step x (1 + seed_cut_margin) it is cut after
    cut_after iterations, kept as a screen, and the next waiting launch saves the seed (orchestrator/sweep/seeding),
    held to the cut one's step: a saver slower than a layout already run at scale is cut too."""
    from tests.bench import searchlib as lib

    cfg, led, _ = _sweep(tmp_path, lib.Target("twin:mixed", seed=125), cut=True)
    sc = cfg.stage.screen
    with led:
        cands = led.candidates("mf")
        savers = [c for c in cands if c.decision.seed_save]
        first = savers[0]
        line = first.decision.cut
        assert line is not None and first.round == 0
        # its rank probe first (round 0 composes the step it is expected at), then its launch at scale: cut, a
        # screen of the iterations its cut read
        tried = [(a, led.evidence.result(a.id)) for a in led.attempts(first.id) if a.fidelity != Fidelity.PROBE]
        assert [a.fidelity for a, _ in tried] == [Fidelity.SCREEN]
        res = tried[0][1]
        assert res is not None and res["measure_iters"] == sc.cut_after - sc.cut_warmup_iters
        assert res["step_p50_s"] > line.step_s
        seed = history.seed(led, led.get_sweep("mf"))
        assert seed is not None and len(savers) > 1 and first.key not in seed  # a later launch saved it
        # ... held to the fastest step measured at scale so far (the cut seed's), not left without a line
        after = savers[1].decision.cut
        assert after is not None and after.step_s == pytest.approx(res["step_p50_s"] * (1 + sc.cut_margin))
        assert history.best_of(led, "mf")["key"] != first.key


@pytest.fixture(scope="module")
def cut_sweep(tmp_path_factory) -> tuple[Path, str]:
    """A sweep on the local executor whose slow launches the driver cuts while they run: its folder, and the URL
    of its ledger moved aside (the sweep's own ledger.sqlite is gone: what the driver recorded, to compare with)."""
    tmp = tmp_path_factory.mktemp("cut")
    # every iteration sleeps 1 s (time_scale large enough that each step sleeps max_sleep_s): a job the cut reads at
    # its 4th iteration runs 11 s more, however loaded the box (the driver polls every 0.3 s)
    slow = ["++workload.twin.time_scale=100000", "++workload.twin.max_sleep_s=1.0"]
    cut = ["++stage.screen.cut_margin=0.0001", "++stage.screen.cut_after=4", "++stage.screen.cut_warmup_iters=1"]
    p = cli("sweep", *sweep_args(tmp, "cut", *slow, *cut, "policy.schedule.round0_size=1"), timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    kept = tmp / "recorded"
    kept.mkdir()
    for f in tmp.glob("ledger.sqlite*"):
        f.rename(kept / f.name)
    return tmp, f"sqlite:///{kept / 'ledger.sqlite'}"


@pytest.mark.long
def test_the_driver_cuts_a_running_job_that_is_over_its_line(cut_sweep):
    """The real loop on the local executor: jobs slow enough to be read while they run, a line a hair over the
    best. Each cut job is cancelled once its first iterations are in (the `cut` event), kept as a screen of
    them, never retried and never the best; the best is a full window."""
    _, url = cut_sweep
    with Ledger.open(url) as led:
        events = led.events("cut", kind=EventKind.CUT)
        assert events, [e.message for e in led.events("cut")][-20:]
        best = history.best_of(led, "cut")
        for e in events:
            (c,) = [c for c in led.candidates("cut") if c.id == e.candidate_id]
            # cut once and not retried: the cut attempt is the candidate's last, kept as a screen (a rank probe or a
            # screen may have come before it: the cut launch is then its launch at scale or its confirmation)
            atts = led.attempts(c.id)
            (cut_att,) = [a for a in atts if a.job_id == e.data["job_id"]]
            assert cut_att.id == atts[-1].id and cut_att.fidelity == Fidelity.SCREEN, [a.fidelity for a in atts]
            res = led.evidence.result(cut_att.id)
            # the iterations its verdict read, as its mark says: 2-4, or 2-7 where that window split (the twin's
            # warm-up falls over iterations 2-4 with only one skipped: CutLine.reach)
            mark = read_cut(cut_att.job_dir)
            assert res["step_p50_s"] and (res["warmup_iters"], res["measure_iters"]) == cut_window(mark)
            assert cut_window(mark) in ((1, 3), (1, 6))
            w, n = cut_window(mark)
            assert f"over iterations {w + 1}-{w + n} " in e.message, e.message  # the driver's event says so too
            assert c.key != best["key"] and c.status == "done"
        measured = [m for m in led.evidence.measured(sweep="cut") if m.key == best["key"]]
        assert measured and measured[0].fidelity == Fidelity.FULL
        cut_keys = {c.key for c in led.candidates("cut") if c.id in {e.candidate_id for e in events}}
    shown = cli("status", "cut", f"ledger.url={url}", "--json")  # what `status` tells the user
    assert shown.returncode == 0, shown.stderr[-2000:]
    info = json.loads(shown.stdout)
    assert info["cut_early"] == len(events) and info["gpu_hours_by_fidelity"]["screen"] > 0
    assert {r["key"] for r in info["candidates"] if r["cut"]} == cut_keys
    text = cli("status", "cut", f"ledger.url={url}").stdout
    # the summary line, then each cut row of the jobs table and of the search path (outcome)
    assert f"cut early: {len(events)} launch(es)" in text and text.count("cut early") == 2 * len(events) + 1
    assert sum(r["outcome"] == "cut early" for r in info["search_path"]) == len(events)


def _recorded(url: str, sweep: str) -> tuple[dict, set[str], str]:
    """Per attempt (candidate key, attempt number): role, fidelity, the candidate's status, the attempt's state,
    failure class, p50 and measured iterations; the keys of the launches cut early (`cut` events); the best."""
    with Ledger.open(url, create=False) as led:
        rows = {}
        for c in led.candidates(sweep):
            for a in led.attempts(c.id, roles=None):
                res = led.evidence.result(a.id)
                rows[(c.key, a.attempt_no)] = (
                    a.role,
                    a.fidelity,
                    c.status,
                    a.state,
                    a.failure_class,
                    res and res["step_p50_s"],
                    res and res["measure_iters"],
                )
        cut = {c.key for c in led.candidates(sweep) if c.id in history.cut_candidates(led, sweep)}
        best = history.best_of(led, sweep)
    for (key, no), row in rows.items():
        if key in cut and row[1] == Fidelity.SCREEN:
            # a cut launch ended CANCELLED, or COMPLETED when it ran to its end before the cancel came (a race the
            # driver's own record shows either way): the outcome compared, not which of the two
            assert row[3] in ("CANCELLED", "COMPLETED"), (key, row)
            rows[(key, no)] = (*row[:3], "cut", *row[4:])
    return rows, cut, best["key"] if best else ""


@pytest.mark.long
def test_ingest_after_the_ledger_is_deleted_rebuilds_every_result_of_a_sweep_with_cut_launches(cut_sweep, ledger_url):
    """Issue 45 item 2 (must show): the ledger of a sweep whose driver cut launches early is gone; `ledger ingest`
    of its job folder rebuilds every result the driver recorded, row by row: each cut launch a screen of the
    iterations its cut read (never "partial", never a CRASH with exit code 130 from the cut's SIGINT), each
    with its `cut` event, and the same best. Its folders alone are enough: the cut's mark names its launch."""
    from orchestrator.cli import main

    tmp, recorded = cut_sweep
    was = _recorded(recorded, "cut")
    assert was[1], "no launch was cut: nothing to show"
    assert main(["ledger", "ingest", str(tmp / "runs" / "cut"), f"ledger.url={ledger_url}"]) == 0
    now = _recorded(ledger_url, "cut")
    assert now[0] == was[0]  # every attempt, row by row
    assert now[1:] == was[1:]
    cut_rows = [v for v in now[0].values() if v[3] == "cut"]  # each a screen of the iterations its cut read: 3, or
    # 6 where the first 3 split (CutLine.reach)
    assert len(cut_rows) == len(was[1]) and all(v[4] is None and v[5] and v[6] in (3, 6) for v in cut_rows)
    folders = {p.parent for p in (tmp / "runs" / "cut").rglob("cut.json")}  # each mark names its own launch
    assert len(folders) == len(was[1])
    assert all(
        json.loads((f / "cut.json").read_text())["token"] == json.loads((f / "job.json").read_text())["launch_token"]
        for f in folders
    )


@pytest.mark.slurm
def test_on_slurm_a_cut_is_scancelled_and_a_driver_killed_before_its_cancel_cancels_on_resume(tmp_path, slurm_cluster):
    """The real cluster: the first cut's mark is written, then the driver is killed (kill -9) before its
    scancel; `resume` finds the job still running with its mark, scancels it, and collects it as the screen of
    the iterations its cut read. Every cut job is Slurm's CANCELLED and no failure; nothing is submitted twice."""
    # ~1 s per iteration, 105 in all: the marked job outlives the killed driver and the resume by ~100 s
    slow = ["++workload.twin.time_scale=100000", "++workload.twin.max_sleep_s=1.0", "stage.measure_iters=100"]
    node8 = ["stage.gpus=8", "++cluster.poll_interval_s=0.5", "++cluster.min_time_min=5"]
    small = [
        "policy.schedule.round0_size=1",
        "policy.schedule.round_size=3",
        "stage.budget.max_rounds=2",
        "stage.budget.max_runs=4",
    ]
    cut = ["++stage.screen.cut_margin=0.0001", "++stage.screen.cut_after=4", "++stage.screen.cut_warmup_iters=1"]
    args = sweep_args(tmp_path, "s-cut", *slow, *node8, *small, *cut, cluster="slurm")
    killed = cli("sweep", *args, "--plain", timeout=600, env={"ORCH_FAULT": "cut-marked:kill"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    marked = list((tmp_path / "runs").rglob("cut.json"))
    assert len(marked) == 1
    resumed = cli("resume", "s-cut", f"ledger.url={sweeplib.ledger_url(tmp_path)}", "--plain", timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:] + resumed.stdout[-3000:]
    with Ledger.open(sweeplib.ledger_url(tmp_path)) as led:
        cands = led.candidates("s-cut")
        assert all(len(led.attempts(c.id)) == 1 for c in cands), "a candidate was launched twice"
        cut_atts = [a for c in cands for a in led.attempts(c.id) if a.fidelity == Fidelity.SCREEN]
        folders = {str(p.parent) for p in (tmp_path / "runs").rglob("cut.json")}
        assert cut_atts and {a.job_dir for a in cut_atts} == folders and str(marked[0].parent) in folders
        events = led.events("s-cut", kind=EventKind.CUT)  # one per cut, the resumed driver's for the killed one's
        assert sorted(e.candidate_id for e in events) == sorted(a.candidate_id for a in cut_atts)
        assert sum("marked before a restart" in e.message for e in events) == 1
        for a in cut_atts:
            res = led.evidence.result(a.id)
            assert a.state == "CANCELLED" and a.failure_class is None, (a.state, a.failure_class)
            assert res is not None and (res["warmup_iters"], res["measure_iters"]) == (1, 3)
        best = history.best_of(led, "s-cut")
        assert best is not None and best["key"] not in {
            c.key for c in cands if c.id in {a.candidate_id for a in cut_atts}
        }


@pytest.mark.long
def test_a_cut_with_no_iterations_to_read_is_refused_naming_the_fix(tmp_path):
    """cut_warmup_iters at or past cut_after leaves the median nothing: one error naming both keys and a value
    that works, a non-zero exit, and no ledger written."""
    from orchestrator.config import ConfigError, compose

    with pytest.raises(ConfigError, match=r"cut_warmup_iters=15 must be below stage.screen.cut_after=15.*=5$"):
        compose(["+stage=8k", "stage.screen.cut_warmup_iters=15"])  # the schema's cut_after (1k's is 10)
    p = cli("sweep", *sweep_args(tmp_path, "badcut", "stage.screen.cut_warmup_iters=9", "stage.screen.cut_after=4"))
    assert p.returncode != 0 and "stage.screen.cut_warmup_iters=9 must be below" in p.stderr
    assert not (tmp_path / "ledger.sqlite").exists()
