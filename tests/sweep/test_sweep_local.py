"""The sweep loop end to end on the local executor (submitit LocalExecutor) with the twin and SQLite."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from orchestrator.core.spec import JobSpec
from orchestrator.core.states import AttemptState, CandidateStatus, EdgeKind, SweepStatus
from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import (
    all_attempts,
    assert_accounted,
    cli,
    ledger_url,
    running_sweep,
    sweep_args,
)

SMALL = [
    "policy.schedule.round0_size=3",
    "policy.schedule.round_size=2",
    "stage.budget.max_rounds=2",
    "stage.budget.max_runs=6",
]


@pytest.mark.long
def test_smoke_sweep_runs_two_rounds_and_fills_the_ledger(tmp_path):
    proc = cli("sweep", *sweep_args(tmp_path, "smoke-e2e", *SMALL), "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert out["rounds"] == 2 and out["simulated"] is True and out["best"]["key"]
    assert "cluster: local" in proc.stdout or "cluster: local" in proc.stderr
    with Ledger.open(ledger_url(tmp_path)) as led:
        cands = led.candidates("smoke-e2e")
        assert {c.round for c in cands} == {0, 1}
        assert len([c for c in cands if c.round == 0]) == 3
        assert_accounted(led, "smoke-e2e")
        measured = led.evidence.measured(sweep="smoke-e2e")
        assert measured and all(m.simulated for m in measured)
        assert all(a.simulated and a.job_id for a in all_attempts(led, "smoke-e2e"))
        cal = led.evidence.calibrations("smoke-e2e")
        assert [c.round for c in cal] == [1]
        assert cal[0].error["step_mape_before"] is not None and cal[0].error["step_mape_after"] is not None
        # round 1 explores one-factor neighbours of a measured layout
        assert any(c.edge_kind == EdgeKind.NEIGHBOUR and c.parent_id for c in cands if c.round == 1)
        # chosen on measured step time, at the full window (a rank probe's compute-only p50 is never a best)
        best = min((m for m in measured if m.fidelity == "full"), key=lambda m: m.metrics["step_p50_s"])
        assert out["best"]["key"] == best.key
        kinds = {e.kind for e in led.events("smoke-e2e")}
        assert {"round", "stop", "lease"} <= kinds
    # re-running the same sweep continues it: nothing is launched again
    again = cli("sweep", *sweep_args(tmp_path, "smoke-e2e", *SMALL), "--json", timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        assert len(all_attempts(led, "smoke-e2e")) == len(led.candidates("smoke-e2e"))
    st = cli("status", "smoke-e2e", f"ledger.url={ledger_url(tmp_path)}", "--json")
    assert st.returncode == 0, st.stderr
    info = json.loads(st.stdout)
    assert info["counts"]["done"] + info["counts"]["failed"] == len(info["candidates"])


@pytest.mark.long
def test_job_json_carries_the_ledger_key(tmp_path):
    """job.json, the job folder and the ledger name one candidate by one key (the twin seeds with it)."""
    proc = cli(
        "sweep",
        *sweep_args(tmp_path, "keys", "policy.schedule.round0_size=2", "stage.budget.max_rounds=1"),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        cands = led.candidates("keys")
        assert len(cands) == 2
        for c in cands:
            (a,) = led.attempts(c.id)
            spec = JobSpec.load(Path(a.job_dir) / "job.json")
            folder = Path(a.job_dir).parent.name  # c<number>-<layout label>-<key>: readable, named by its key
            assert spec.candidate_key == c.key and folder.startswith(f"c{c.id}-TP") and folder.endswith(c.key)
            assert (spec.sweep, spec.attempt) == ("keys", 1)


@pytest.mark.long
def test_promotion_records_promoted_from_edges(tmp_path):
    small = cli("sweep", *sweep_args(tmp_path, "p-src", *SMALL), timeout=300)
    assert small.returncode == 0, small.stderr[-3000:]
    big = [
        "stage.name=smoke64",
        "stage.gpus=64",
        "stage.promotes_from=smoke",
        "policy.search.promote_top_k=2",
        "stage.budget.max_rounds=1",
        "policy.schedule.round0_size=4",
    ]
    proc = cli("sweep", *sweep_args(tmp_path, "p-dst", *big), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        src_ids = {c.id: c for c in led.candidates("p-src")}
        promoted = [c for c in led.candidates("p-dst") if c.edge_kind == EdgeKind.PROMOTED_FROM]
        assert promoted and all(c.parent_id in src_ids for c in promoted)
        measured_src = {m.candidate_id for m in led.evidence.measured(sweep="p-src")}
        assert all(c.parent_id in measured_src for c in promoted)  # only measured layouts are promoted
        for c in promoted:  # same global batch on twice the GPUs: D_a grows or CP restores m
            parent = src_ids[c.parent_id]
            assert c.predicted["d_a"] * c.layout.cp >= parent.predicted["d_a"] * parent.layout.cp


@pytest.mark.long
def test_promotion_without_source_is_a_clear_error(tmp_path):
    proc = cli("sweep", *sweep_args(tmp_path, "orphan", "stage.name=big", "stage.promotes_from=smoke"), timeout=120)
    assert proc.returncode == 2
    assert "run `python -m orchestrator sweep +stage=smoke` first" in proc.stderr


@pytest.mark.long
def test_second_orchestrator_is_refused_naming_the_holder(tmp_path):
    from orchestrator.config import compose

    cfg = compose(["+stage=smoke"]).cfg
    with Ledger.open(ledger_url(tmp_path)) as led:
        led.create_or_get_sweep(
            "held",
            stage="smoke",
            config_yaml="{}",
            model=cfg.model.name,
            hardware=cfg.hardware.name,
            workload=cfg.workload.name,
            provenance={},
        )
        led.leases.acquire_lease("held", "otherhost:4242", 60)
    proc = cli("sweep", *sweep_args(tmp_path, "held"), timeout=120)
    assert proc.returncode == 2
    assert "otherhost:4242" in proc.stderr and proc.stderr.startswith("error:")


@pytest.mark.long
def test_oom_is_not_retried_unless_asked(tmp_path):
    args = sweep_args(
        tmp_path, "oom", "++workload.twin.force_oom=true", "policy.schedule.round0_size=2", "stage.budget.max_rounds=1"
    )
    proc = cli("sweep", *args, timeout=300)
    assert proc.returncode == 1 and "measured nothing" in proc.stderr, proc.stderr[-3000:]  # every job OOMed
    with Ledger.open(ledger_url(tmp_path)) as led:
        for c in led.candidates("oom"):
            atts = led.attempts(c.id)
            assert c.status == "failed" and len(atts) == 1 and atts[0].failure_class == "OOM"
    args2 = sweep_args(
        tmp_path,
        "oom2",
        "++workload.twin.force_oom=true",
        "policy.schedule.round0_size=1",
        "stage.budget.max_rounds=1",
        "policy.driver.max_attempts=2",
    )
    proc = cli("sweep", *args2, "--retry", "oom", timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        (c,) = led.candidates("oom2")
        assert [a.failure_class for a in led.attempts(c.id)] == ["OOM", "OOM"]


@pytest.mark.long
def test_a_gpu_smaller_than_its_hardware_group_is_planned_with_after_the_first_oom(tmp_path):
    """hardware=h200 says 141 GB; the twin's GPUs hold 96 GiB and its OOM lines say so, as torch's do. After the
    first OOM the sweep plans every round with 103.08 GB (96 GiB exactly), says so once, and `status` shows it."""
    gib96 = 96 * 2**30 / 1e9
    args = sweep_args(
        tmp_path,
        "small-gpu",
        f"++workload.twin.gpu_capacity_gb={gib96}",
        # full recompute legal (a Megatron with PR #6704's fix): today's few legal 1k layouts all OOM at 96 GiB
        "++stage.lifted_rules=[v4.full_recompute_hash_mhc]",
        "policy.schedule.round0_size=4",
        "policy.schedule.round_size=3",
        "stage.budget.max_rounds=2",
        stage="1k",
    )
    proc = cli("sweep", *args, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    warned = [ln for ln in proc.stdout.splitlines() if ln.startswith("warning: GPUs hold")]
    assert len(warned) == 1 and re.fullmatch(
        r"warning: GPUs hold 103\.1 GB \(96\.00 GiB, job \d+:\d+'s OOM message\), not hardware\.hbm_gb=141: "
        r"planning with 103\.1 GB from now; set hardware\.hbm_gb=103\.1 or pick the right hardware group",
        warned[0],
    ), proc.stdout[-3000:]
    lines = proc.stdout.splitlines()
    # round 0's probes that ran out of memory: one line for the round, "do not fit (probe)", never one OOM line per
    # attempt nor a fit probe's "HBM within the model's error band" (issue 49 item 6)
    unfit = [i for i, ln in enumerate(lines) if re.match(r"round 0: \d+ layout\(s\) do not fit \(probe\): TP", ln)]
    assert len(unfit) == 1 and not [ln for ln in lines if " OOM: " in ln or "error band" in ln], proc.stdout[-3000:]
    assert unfit[0] < lines.index(warned[0]) < next(i for i, ln in enumerate(lines) if ln.startswith("round 1:"))
    with Ledger.open(ledger_url(tmp_path)) as led:
        stated = led.evidence.gpu_capacities("small-gpu")
        assert stated and stated[0].source == "OOM message" and stated[0].gb == gib96
        margin = 4.0  # the 1k stage's memory_margin_gb (the schema's default)
        round0 = [c for c in led.candidates("small-gpu") if c.round == 0]
        later = [c for c in led.candidates("small-gpu") if c.round > 0]
        assert any(c.predicted["memory_gb"] + margin > gib96 for c in round0)  # planned against 141 GB
        assert later and all(  # planned against 103.08 GB (a fit probe tests the band around it; a layout
            # that needs no more memory than one that ran is known to fit, whatever the model says)
            c.predicted["memory_gb"] + margin <= gib96
            for c in later
            if c.decision.fidelity != "probe" and "known to fit" not in c.decision.move
        )
        (ev,) = led.events("small-gpu", kind="capacity")
        assert ev.data["gb"] == gib96 and ev.data["configured_gb"] == 141.0
    st = cli("status", "small-gpu", f"ledger.url={ledger_url(tmp_path)}", "--json")
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["gpu_capacity"]["gb"] == gib96
    text = cli("status", "small-gpu", f"ledger.url={ledger_url(tmp_path)}")
    assert warned[0] in text.stdout


@pytest.mark.long
def test_external_workload_script_is_honoured(tmp_path):
    script = Path(__file__).resolve().parent.parent / "workloads" / "surface.py"
    args = sweep_args(
        tmp_path,
        "ext",
        f"workload.command=[python,{script}]",
        "workload.name=surface",
        "policy.schedule.round0_size=2",
        "stage.budget.max_rounds=1",
        "++workload.env={SURFACE_HBM_GB: '200'}",
    )
    proc = cli("sweep", *args, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        measured = led.evidence.measured(sweep="ext")
        assert measured
        for m in measured:
            job = Path(led.attempts(m.candidate_id)[-1].job_dir)
            out = "".join(p.read_text() for p in job.glob("rank-*.out"))
            assert "synthetic surface workload" in out  # the external script ran, not the twin


@pytest.mark.long
def test_kill_9_then_resume_loses_nothing_and_submits_nothing_twice(tmp_path):
    slow = ["++workload.twin.time_scale=0.0005", "++workload.twin.max_sleep_s=0.2"]
    args = sweep_args(tmp_path, "killme", *SMALL) + slow
    with running_sweep(args, log=tmp_path / "first.log") as run:
        run.attempts(1, timeout=120)
        run.kill()  # the orchestrator only: its jobs live on
    with Ledger.open(ledger_url(tmp_path)) as led:
        before = {a.id: a.job_id for a in all_attempts(led, "killme")}
        assert before and led.get_sweep("killme").status == SweepStatus.RUNNING
    proc = cli("resume", "killme", f"ledger.url={ledger_url(tmp_path)}", "--plain", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        assert_accounted(led, "killme")
        after = all_attempts(led, "killme")
        for aid, job in before.items():  # every job submitted before the kill was re-attached, not resubmitted
            again = next(a for a in after if a.id == aid)
            if job is not None:
                assert again.job_id == job
            else:  # killed between the launch and its record: adopted from the job's own evidence, or released
                assert again.job_id or again.aborted, again
        per_cand = {}
        for a in after:  # a launch intent still waiting for a local slot at the kill never ran: released
            if not a.aborted:
                per_cand.setdefault(a.candidate_id, []).append(a)
        assert all(len(v) == 1 for v in per_cand.values()), "a candidate was submitted twice"
        assert len(led.evidence.measured(sweep="killme")) == sum(
            1 for c in led.candidates("killme") if c.status == "done"
        )


# A workload that waits for the test's gate file, then runs the twin with the flags it was given.
GATED_TWIN = """import os, sys, time
while not os.path.exists(os.environ["ORCH_TEST_GATE"]):
    time.sleep(0.05)
os.execv(sys.executable, [sys.executable, "-m", "orchestrator.job.twin", *sys.argv[1:]])
"""


def gated_twin(tmp_path: Path) -> tuple[list[str], Path]:
    """Overrides for a one-job sweep whose job cannot end before the test creates the returned gate file."""
    script, gate = tmp_path / "gated_twin.py", tmp_path / "gate"
    script.write_text(GATED_TWIN)
    args = [
        f"workload.command=[python,{script}]",
        f"++workload.env={{ORCH_TEST_GATE: '{gate}'}}",
        "policy.schedule.round0_size=1",
        "stage.budget.max_rounds=1",
    ]
    return args, gate


@pytest.mark.long
def test_cancel_stops_every_live_job_and_records_it(tmp_path):
    slow = [
        "++workload.twin.time_scale=50",
        "++workload.twin.max_sleep_s=1.0",
        "policy.schedule.round0_size=2",
        "stage.budget.max_rounds=2",
    ]
    with running_sweep(sweep_args(tmp_path, "stopme", *slow), log=tmp_path / "run.log") as run:
        run.attempts(2, timeout=120)
        proc = cli("cancel", "stopme", f"ledger.url={ledger_url(tmp_path)}", timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert run.wait(60) == 1, run.output()[-2000:]  # cancelled before anything was measured
    assert "cancelled" in run.output() and "measured nothing" in run.output()
    with Ledger.open(ledger_url(tmp_path)) as led:
        assert led.get_sweep("stopme").status == SweepStatus.CANCELLED
        assert {c.status for c in led.candidates("stopme")} == {CandidateStatus.CANCELLED}
        assert all(a.state == AttemptState.CANCELLED for a in all_attempts(led, "stopme"))
        assert {c.round for c in led.candidates("stopme")} == {0}  # no further round after the cancel
        assert led.events("stopme", kind="cancelled")


@pytest.mark.long
def test_cancel_stops_the_local_jobs_of_a_killed_driver(tmp_path):
    """kill -9 of the driver leaves its local job running; `cancel NAME` stops it, by its identity (`pid:start`),
    and records it cancelled. Before, `cancel` left local jobs to their parent: a dead driver's ran on, recorded as
    cancelled."""
    from orchestrator.core import proc as process

    gated, _never_opened = gated_twin(tmp_path)
    with running_sweep(sweep_args(tmp_path, "orphan", *gated), log=tmp_path / "run.log") as run:
        (a,) = run.attempts(1, timeout=120)
        run.kill()  # the driver only: its job waits at the gate, which never opens
    try:
        assert process.running(a.job_id)
        proc = cli("cancel", "orphan", f"ledger.url={ledger_url(tmp_path)}", timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert not process.running(a.job_id)  # stopped before `cancel` returned
        with Ledger.open(ledger_url(tmp_path)) as led:
            assert [x.state for x in all_attempts(led, "orphan")] == [AttemptState.CANCELLED]
    finally:  # the killed driver's process group: its job, when cancel did not stop it
        try:
            os.killpg(run.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.long
def test_sweep_on_each_ledger_engine(ledger_url, tmp_path):
    """The same loop on SQLite and on the real PostgreSQL (the `ledger_url` fixture runs both)."""
    args = [
        a if not a.startswith("ledger.url=") else f"ledger.url={ledger_url}"
        for a in sweep_args(tmp_path, "engines", "policy.schedule.round0_size=2", "stage.budget.max_rounds=1")
    ]
    proc = cli("sweep", *args, "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with Ledger.open(ledger_url) as led:
        assert_accounted(led, "engines")
        assert len(led.evidence.measured(sweep="engines")) == 2


@pytest.mark.long
def test_cluster_auto_falls_back_to_local_and_says_why(tmp_path):
    empty = tmp_path / "nobin"
    empty.mkdir()
    args = [
        a if a != "cluster=local" else "cluster=auto"
        for a in sweep_args(tmp_path, "auto", "policy.schedule.round0_size=1", "stage.budget.max_rounds=1")
    ]
    proc = cli("sweep", *args, "--plain", timeout=300, env={"PATH": str(empty)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cluster: local (no sbatch on PATH; using the local executor)" in proc.stdout


@pytest.mark.long
def test_ctrl_c_marks_the_sweep_interrupted_and_releases_the_lease(tmp_path):
    """Ctrl-C (SIGINT) while the sweep runs: exit 130, the sweep INTERRUPTED, its lease released, `resume` goes
    on. The sweep cannot end before the signal, by construction: its one job waits for a gate the test opens
    only after the sweep has exited (a twin that was merely slow once finished first: 0 == 130)."""
    gated, gate = gated_twin(tmp_path)
    with running_sweep(sweep_args(tmp_path, "ctrlc", *gated), log=tmp_path / "run.log", interruptible=True) as run:
        run.attempts(1, timeout=120)  # the event: the sweep's first launch is recorded, and it waits on its job
        run.proc.send_signal(signal.SIGINT)
        assert run.wait(60) == 130, run.output()[-2000:]
    assert not gate.exists()  # the job could not have ended: the sweep was interrupted, not finished
    with Ledger.open(ledger_url(tmp_path)) as led:
        assert led.get_sweep("ctrlc").status == SweepStatus.INTERRUPTED
        assert led.events("ctrlc", kind="lease")[-1].message.startswith("lease released")
    gate.touch()
    proc = cli("resume", "ctrlc", f"ledger.url={ledger_url(tmp_path)}", "--plain", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]  # no wait for a lease: it was released
    with Ledger.open(ledger_url(tmp_path)) as led:
        assert_accounted(led, "ctrlc")
        assert len(led.evidence.measured(sweep="ctrlc")) == 1  # the interrupted job, re-attached and measured


@pytest.mark.long
def test_two_live_orchestrators_the_second_is_refused(tmp_path):
    slow = [
        "++workload.twin.time_scale=50",
        "++workload.twin.max_sleep_s=1.0",
        "policy.schedule.round0_size=1",
        "stage.budget.max_rounds=1",
    ]
    with running_sweep(sweep_args(tmp_path, "twice", *slow), log=tmp_path / "first.log") as first:
        first.attempts(1, timeout=120)
        second = cli("sweep", *sweep_args(tmp_path, "twice", *slow), "--plain", timeout=120)
        assert second.returncode == 2
        assert f":{first.proc.pid}" in second.stderr and "is driven by" in second.stderr
        assert first.wait(120) == 0


@pytest.mark.long
def test_nccl_timeout_is_retried_up_to_max_attempts(tmp_path):
    args = sweep_args(
        tmp_path,
        "nccl",
        "++workload.twin.nccl_timeout_rate=1.0",
        "policy.schedule.round0_size=1",
        "stage.budget.max_rounds=1",
        "policy.driver.max_attempts=2",
    )
    proc = cli("sweep", *args, "--plain", timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]  # every attempt timed out: nothing measured
    assert "retrying" in proc.stdout
    with Ledger.open(ledger_url(tmp_path)) as led:
        (c,) = led.candidates("nccl")
        atts = led.attempts(c.id)
        assert [a.failure_class for a in atts] == ["NCCL_TIMEOUT", "NCCL_TIMEOUT"] and c.status == "failed"
        assert len({a.job_id for a in atts}) == 2 and [a.attempt_no for a in atts] == [1, 2]
        assert Path(atts[1].job_dir).name == "attempt-2"
        assert led.events("nccl", kind="retry")


@pytest.mark.long
def test_sweep_status_and_best_name_one_layout_when_the_fastest_is_partial_or_excluded(tmp_path):
    """Issue 17's "two answers to best": the fastest result is partial, the next failed parity. The sweep's
    last line (a continued sweep prints its outcome again), `status --json` and `best` all name the third,
    the measured best by orchestrator.core.ranking."""
    args = sweep_args(
        tmp_path,
        "one-best",
        "policy.schedule.round0_size=4",
        "policy.schedule.round_size=2",
        "stage.budget.max_rounds=1",
    )
    first = cli("sweep", *args, "--json", timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        rows = sorted(led.evidence.measured(sweep="one-best"), key=lambda r: r.metrics["step_p50_s"])
        assert len(rows) >= 3, [r.key for r in rows]
        fastest, second, third = rows[:3]
        led.evidence.update_result_metrics(fastest.attempt_id, partial=True)  # stopped before its window ended
        led.evidence.record_parity(
            second.candidate_id, reference_key=third.key, steps=10, max_loss_diff=0.5, max_grad_norm_diff=0.1,
            tolerance=0.01, passed=False,
        )  # fmt: skip
    again = cli("sweep", *args, "--json", timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    last = json.loads(again.stdout[again.stdout.index("{") :])["best"]
    plain = cli("sweep", *args, "--plain", timeout=300)
    assert plain.returncode == 0, plain.stderr[-3000:]
    best_line = next(line for line in plain.stdout.splitlines() if line.startswith("best layout"))
    status = json.loads(cli("status", "one-best", f"ledger.url={ledger_url(tmp_path)}", "--json").stdout)["best"]
    best = cli("best", "--sweep", "one-best", f"ledger.url={ledger_url(tmp_path)}", "--json")
    assert best.returncode == 0, best.stderr
    named = {"sweep": last["key"], "status": status["key"], "best": json.loads(best.stdout)["key"]}
    assert named == {"sweep": third.key, "status": third.key, "best": third.key}, (fastest.key, second.key, named)
    assert last["layout"] in best_line
