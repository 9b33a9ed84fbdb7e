"""A sweep is bound to the launcher its jobs run on (issue 10 fault 1), and waits for a Slurm that does not
answer instead of falling back: the Slurm-free half (the real-cluster half: tests/sweep/test_sweep_slurm_outage.py)."""

from __future__ import annotations

import pytest

from orchestrator.config import compose
from orchestrator.core.errors import UserError
from orchestrator.core.schema import ClusterConfig, SlurmConfig
from orchestrator.launch.auto import launcher_for, wait_for_slurm
from orchestrator.launch.local import LocalLauncher
from orchestrator.ledger.ledger import Ledger
from orchestrator.sweep import bound_launcher
from orchestrator.sweep.view import View
from tests.sweeplib import ledger_url


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
        assert led.get_sweep("b").provenance["launcher"] == "local"
        assert led.bind_launcher("b", "slurm") == "local"  # the first binding stays
        cfg.cluster.kind = "auto"
        assert bound_launcher(led, cfg, "b", view).kind == "local"  # auto does not resolve again
        cfg.cluster.kind = "slurm"
        with pytest.raises(UserError, match="runs its jobs on local, not slurm"):
            bound_launcher(led, cfg, "b", view)
        assert [e.message for e in led.events("b", kind="launcher")] == ["jobs run on local"]
