"""Issue 10 fault 1: a brief Slurm outage at `resume` must not turn running jobs into partial results.

Before: `resume` of a `cluster=auto` sweep picked the launcher again; with `sbatch --version` failing for a
moment it fell back to the local executor, found no process for the Slurm job ids and ingested their
half-written folders as `done` partial results; the jobs then finished on Slurm, unseen. Now the sweep is
bound to the launcher its jobs run on, and `resume` waits for Slurm (bounded backoff, one line per retry),
or gives up with one `error:` line, touching nothing.
"""

from __future__ import annotations

import pytest

from orchestrator.core.states import AttemptState, CandidateStatus
from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import (
    all_attempts,
    assert_slurm_accounted,
    cli,
    first_running,
    ledger_url,
    running_sweep,
    slurm_shims,
    sweep_args,
)

pytestmark = pytest.mark.slurm
MEASURE = 6
ARGS = [
    "policy.schedule.round0_size=2",
    "stage.budget.max_rounds=1",
    "stage.gpus=8",
    "++cluster.poll_interval_s=1.0",
    "++cluster.min_time_min=5",
    "++workload.twin.time_scale=50",
    "++workload.twin.max_sleep_s=2.0",  # ~2 s per iteration: the jobs run through the outage
    "stage.warmup_iters=3",
    f"stage.measure_iters={MEASURE}",
    "cluster.slurm.wait_s=20",
]


def test_resume_waits_for_slurm_and_never_falls_back_to_local(tmp_path, slurm_cluster):
    shims = slurm_shims(tmp_path)
    url = ledger_url(tmp_path)
    with running_sweep(
        sweep_args(tmp_path, "s-out", *ARGS, cluster="auto"), log=tmp_path / "a.log", env=shims.env
    ) as run:
        run.wait_ledger(lambda led: first_running(led, "s-out"), 180, "a RUNNING job")
        run.kill()  # the orchestrator only: its jobs run on
    assert "cluster: slurm" in run.output()

    # Slurm stays down longer than cluster.slurm.wait_s: one error line, exit 2, nothing ingested or released
    shims.down(1000)
    out = cli("resume", "s-out", f"ledger.url={url}", "--plain", timeout=300, env=shims.env)
    assert out.returncode == 2, out.stderr[-3000:] + out.stdout[-3000:]
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Slurm does not answer" in errors[0], out.stderr[-2000:]
    assert "retrying in" in out.stdout and "cluster: local" not in out.stdout + out.stderr
    with Ledger.open(url) as led:
        atts = all_attempts(led, "s-out")
        assert len(atts) == 2 and not any(led.evidence.result(a.id) for a in atts)
        assert all(not AttemptState.parse(a.state).terminal and a.failure_class is None for a in atts), atts
        assert {c.status for c in led.candidates("s-out")} <= CandidateStatus.IN_FLIGHT

    # A brief outage: sbatch --version fails twice, then sinfo once, then sacct twice inside the loop
    before = {t: shims.failed(t) for t in ("sbatch", "sinfo", "sacct")}
    shims.down(sbatch=2, sinfo=1, sacct=2)
    out = cli("resume", "s-out", f"ledger.url={url}", "--plain", timeout=600, env=shims.env)
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    assert out.stdout.count("Slurm does not answer") == 3 and "cluster: slurm (bound to the sweep" in out.stdout
    assert "cluster: local" not in out.stdout
    failed = {t: shims.failed(t) - before[t] for t in before}
    assert failed == {"sbatch": 2, "sinfo": 1, "sacct": 2}, failed
    with Ledger.open(url) as led:
        got = assert_slurm_accounted(led, "s-out", shims)
        for c in led.candidates("s-out"):
            (a,) = led.attempts(c.id)  # re-attached by id, never relaunched
            res = led.evidence.result(a.id)
            assert c.status == CandidateStatus.DONE and a.state == AttemptState.COMPLETED, (c.status, a.state)
            assert res is not None and not res["partial"] and res["measure_iters"] == MEASURE, res
    print(f"s-out: {got}")
