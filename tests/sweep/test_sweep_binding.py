"""A sweep is bound to the launcher its jobs run on (issue 10 fault 1), and waits for a Slurm that does not
answer instead of falling back: the Slurm-free half (the real-cluster half: tests/sweep/test_sweep_slurm_outage.py).
Issue 45 item 3: the binding is stored once a job launched (never by a launcher whose partition refuses the
sweep), and a `cluster.*` override on resume keeps the stored kind. No test here reaches a real Slurm: where one
"answers", it is a stand-in whose partition check refuses every job (nothing is submitted)."""

from __future__ import annotations

import pytest

from orchestrator.cli import main
from orchestrator.config import compose
from orchestrator.core.errors import UserError
from orchestrator.core.schema import ClusterConfig, SlurmConfig
from orchestrator.launch.auto import launcher_for
from orchestrator.launch.local import LocalLauncher
from orchestrator.launch.slurm import wait_for_slurm
from orchestrator.ledger.ledger import Ledger
from orchestrator.sweep import bound_launcher
from orchestrator.sweep.view import View
from tests.sweeplib import ROOT, ledger_url, new_sweep, sweep_args


def flaky(fails: int):
    calls = []

    def probe() -> tuple[bool, str]:
        calls.append(1)
        return (len(calls) > fails, f"probe {len(calls)}")

    return probe, calls


def test_wait_for_slurm_backs_off_and_says_so():
    probe, calls = flaky(3)
    said, slept = [], []
    why = wait_for_slurm(ClusterConfig(slurm=SlurmConfig(wait_s=300)), said.append, probe=probe, sleep=slept.append)
    assert why == "probe 4" and len(calls) == 4
    assert slept == [2.0, 4.0, 8.0] and len(said) == 3 and all("retrying in" in s for s in said)


def test_wait_for_slurm_gives_up_with_one_line():
    probe, calls = flaky(10**6)
    with pytest.raises(UserError) as err:
        wait_for_slurm(ClusterConfig(slurm=SlurmConfig(wait_s=0)), [].append, probe=probe, sleep=lambda s: None)
    assert "Slurm does not answer after 0s (probe 1)" in str(err.value) and "\n" not in str(err.value)
    assert len(calls) == 1


@pytest.mark.long
def test_a_slurm_bound_sweep_never_gets_the_local_launcher():
    probe, _ = flaky(1)
    launcher, why = launcher_for("slurm", ClusterConfig(), [].append, probe=probe)
    assert launcher.kind == "slurm" and "bound to the sweep" in why
    assert isinstance(launcher_for("local", ClusterConfig(), [].append)[0], LocalLauncher)


def test_the_binding_is_stored_once_and_a_cluster_override_cannot_change_it(tmp_path):
    cfg = compose(["+stage=smoke", "cluster=local", f"ledger.url={ledger_url(tmp_path)}"]).cfg
    view = View(live=False, stream=open("/dev/null", "w"))
    with Ledger.open(ledger_url(tmp_path), create=True) as led:
        led.create_or_get_sweep(
            "b", stage="smoke", config_yaml="", model="tiny", hardware="h", workload="twin", provenance={}
        )
        assert bound_launcher(led, cfg, "b", view).kind == "local"
        assert "launcher" not in led.get_sweep("b").provenance  # nothing launched: nothing bound yet
        assert led.bind_launcher("b", "local") == "local"  # what the driver's first launch stores (Driver._launch)
        assert led.bind_launcher("b", "slurm") == "local"  # the first binding stays
        cfg.cluster.kind = "auto"
        assert bound_launcher(led, cfg, "b", view).kind == "local"  # auto does not resolve again
        cfg.cluster.kind = "slurm"
        with pytest.raises(UserError, match="runs its jobs on local, not slurm"):
            bound_launcher(led, cfg, "b", view)
        assert [e.message for e in led.events("b", kind="launcher")] == ["jobs run on local"]


@pytest.mark.long
def test_a_cluster_override_on_resume_changes_that_key_of_the_stored_group_and_keeps_its_kind():
    """resumed_cluster: `cluster.KEY=VALUE` changes that key of the group the sweep was stored with (its kind,
    partition and env stay); `cluster.kind=...` changes the kind; `cluster=NAME` picks that group as composed now."""
    from orchestrator.sweep import resumed_cluster

    stored = compose(["+stage=smoke", "cluster=local", "cluster.slurm.partition=gpu", "++cluster.env.A=1"]).cfg.cluster
    for given in (["cluster.folder=/x/runs"], ["++cluster.env.B=2", "cluster.folder=/x/runs"]):
        now = compose(["+stage=smoke", *given]).cfg.cluster  # today's default group: auto
        got = resumed_cluster(stored, now, given)
        assert (got.kind, got.folder, got.slurm.partition, got.env["A"]) == ("local", "/x/runs", "gpu", "1")
        assert ("B" in got.env) == any("env.B" in o for o in given)
    asked = ["cluster.kind=slurm"]
    assert resumed_cluster(stored, compose(["+stage=smoke", *asked]).cfg.cluster, asked).kind == "slurm"
    group = ["cluster=slurm"]
    assert resumed_cluster(stored, compose(["+stage=smoke", *group]).cfg.cluster, group).slurm.partition != "gpu"
    assert resumed_cluster(stored, compose(["+stage=smoke"]).cfg.cluster, ["stage.gpus=32"]) == stored


@pytest.fixture
def slurm_answers_and_refuses(monkeypatch):
    """Slurm "answers" (cluster=auto would pick it) but its partition refuses every job, so nothing is ever
    submitted to a real cluster: the issue's case of a partition check that fails."""
    import dataclasses

    from orchestrator.launch import Unrunnable, auto, registry
    from orchestrator.launch.slurm.launcher import SlurmLauncher

    def refuse(self, tasks):
        refused.append(len(tasks))
        raise Unrunnable("partition test-stand-in: no node has these GPUs (stand-in for a real partition's limit)")

    refused: list[int] = []
    answers = dataclasses.replace(auto.backend("slurm"), probe=lambda: (True, "sinfo answers (stand-in)"))
    monkeypatch.setitem(registry.BACKENDS, "slurm", answers)
    monkeypatch.setattr(SlurmLauncher, "check_fits", refuse)
    monkeypatch.setattr(SlurmLauncher, "submit", lambda self, *a, **k: pytest.fail("submitted to Slurm"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return refused


def _unbound_sweep(tmp_path, name: str) -> list[str]:
    """A sweep stored with cluster=local that launched nothing yet (no binding): the resume command's tail."""
    args = sweep_args(tmp_path, name, "policy.schedule.round0_size=2", "stage.budget.max_rounds=1")
    with Ledger.open(ledger_url(tmp_path), create=True) as led:
        new_sweep(led, name, compose(args))
        assert "launcher" not in led.get_sweep(name).provenance
    return [f"ledger.url={ledger_url(tmp_path)}", "--plain"]


def _jobs_and_binding(tmp_path, name: str) -> tuple[int, str | None]:
    with Ledger.open(ledger_url(tmp_path), create=False) as led:
        atts = [a for c in led.candidates(name) for a in led.attempts(c.id, roles=None) if a.job_id]
        return len(atts), led.get_sweep(name).provenance.get("launcher")


@pytest.mark.long
def test_resume_with_a_cluster_folder_override_keeps_the_stored_local_kind(tmp_path, slurm_answers_and_refuses, capsys):
    """The issue's case: resume NAME cluster.folder=... of a sweep stored with cluster.kind local, no launcher
    bound yet, while sinfo answers: its jobs run locally in the new folder (today's default, auto, would have
    picked Slurm), and the sweep is bound to local."""
    tail = _unbound_sweep(tmp_path, "keep")
    moved = tmp_path / "moved"
    assert main(["resume", "keep", f"cluster.folder={moved}", *tail]) == 0, capsys.readouterr().err
    assert slurm_answers_and_refuses == []  # Slurm was never asked to run anything
    n, bound = _jobs_and_binding(tmp_path, "keep")
    assert n >= 2 and bound == "local"
    assert len(list((moved / "keep").glob("*/attempt-1/job.json"))) == n


@pytest.mark.long
def test_a_launcher_is_bound_only_once_a_job_launched(tmp_path, slurm_answers_and_refuses, capsys):
    """cluster.kind=auto resolves to a Slurm whose partition refuses the sweep's jobs: one error line, no job,
    and no binding, so the same sweep then resumes on cluster=local (it was refused for good: "runs its jobs
    on slurm, not local") and is bound to local by its first launch."""
    tail = _unbound_sweep(tmp_path, "late")
    assert main(["resume", "late", "cluster.kind=auto", *tail]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "stand-in for a real partition" in err[0], err
    assert slurm_answers_and_refuses and _jobs_and_binding(tmp_path, "late") == (0, None)
    assert main(["resume", "late", "cluster=local", *tail]) == 0, capsys.readouterr().err
    n, bound = _jobs_and_binding(tmp_path, "late")
    assert n >= 2 and bound == "local"
