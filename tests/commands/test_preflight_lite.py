"""Preflight-lite (issue 21): a real Megatron job on this host (cluster=local) without a Megatron checkout or a
module it imports first is refused before any job, in one `error:` line naming what is missing and the fix."""

from __future__ import annotations

import pytest

from orchestrator.job import preflight
from tests.job.test_preflight import fake_dev_tree
from tests.sweeplib import cli, ledger_url


def test_run_one_without_a_checkout_is_refused_before_any_job(tmp_path):
    got = cli("run-one", "+stage=smoke", "workload=megatron", "cluster=local", f"cluster.folder={tmp_path / 'runs'}")
    assert got.returncode == 2, got.stderr[-2000:]
    [error] = [line for line in got.stderr.splitlines() if line.startswith("error:")]
    assert "no Megatron-LM checkout: /opt/megatron-lm/pretrain_hybrid.py does not exist" in error, error
    assert "git clone -b dev https://github.com/NVIDIA/Megatron-LM" in error and "workload.command=" in error
    assert not (tmp_path / "runs").exists()  # no job folder: nothing launched


@pytest.mark.long
def test_sweep_without_a_checkout_is_refused_before_anything_is_written(tmp_path):
    args = ["+stage=smoke", "workload=megatron", "cluster=local", f"ledger.url={ledger_url(tmp_path)}"]
    got = cli("sweep", *args, f"cluster.folder={tmp_path / 'runs'}", "--plain")
    assert got.returncode == 2 and "/opt/megatron-lm/pretrain_hybrid.py does not exist" in got.stderr
    assert not (tmp_path / "ledger.sqlite").exists() and not (tmp_path / "runs").exists()


def test_lite_names_each_missing_piece_and_passes_a_complete_host(tmp_path, monkeypatch):
    assert preflight.lite(str(tmp_path / "nowhere" / "pretrain_hybrid.py"))[0].startswith("no Megatron-LM checkout")
    entry = fake_dev_tree(tmp_path / "megatron-lm")
    monkeypatch.setattr(preflight, "LITE_MODULES", ("torch", "no_such_module_xyz"))
    assert preflight.lite(str(entry)) == [
        f"Python module(s) no_such_module_xyz not importable by {__import__('sys').executable}"
    ]
    monkeypatch.setattr(preflight, "LITE_MODULES", ("json",))
    assert preflight.lite(str(entry)) == []
