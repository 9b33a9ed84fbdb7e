"""The rank-probe contract (orchestrator/plan/probe.py) and the mode the job installs (orchestrator/job/probe_mode.py):
the twin and the stand-ins refuse what dev refuses at run time, a refused probe reads as a probe failure (never an
OOM), the job folder names the mode a probe ran with, the mode's code points are read from Megatron's own code,
and the schedule probes only what a probe can run. Dev's own run-time code under the mode:
tests/job/test_probe_conformance.py."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.config import ConfigError, compose
from orchestrator.core.failures import Failure
from orchestrator.core.paths import JobPaths
from orchestrator.core.states import Fidelity
from orchestrator.evidence.collect import collect
from orchestrator.job import entry, probe_mode
from orchestrator.plan import probe, ranks
from orchestrator.plan.layout import Layout
from orchestrator.runspec import build_spec
from tests.megatron_env import DEV, megatron_tree

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def piped(smoke):
    """A smoke-stage layout with PP > 1 (V4, packed sequences: dev exchanges its pipeline shapes) and its ranks."""
    cfg, cands = smoke
    planned = next(c for c in cands if c.layout.pp > 1)
    return cfg, planned, ranks.probe_ranks(planned.layout, cfg.stage.gpus, planned.prediction.heaviest_stage)


def probe_job(cfg, planned, bound, folder, mode: str):
    cfg = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, probe_mode=mode))
    spec = build_spec(
        cfg, planned, sweep="p", attempt=1, job_dir=folder, window=(0, 5), fidelity=Fidelity.PROBE, probe_ranks=bound
    )
    try:
        entry.run_task(spec)
    except entry.TaskFailed:  # the job exits non-zero; its folder says why
        pass
    return spec, collect(folder)


def test_the_twin_fails_a_probe_without_the_mode_as_dev_does_and_the_sweep_reads_a_probe_failure(piped, tmp_path):
    cfg, planned, bound = piped
    spec, result = probe_job(cfg, planned, bound, tmp_path / "off", probe.OFF)
    assert probe.exchanges_shapes(spec.argv) and probe.MODE_ENV not in spec.env
    assert not result.ok and result.failure_class == Failure.PROBE_FAILED, result.failure_detail
    assert probe.DEV_ERROR in result.failure_detail  # dev's own words, from its p2p receive
    logs = "".join(p.read_text() for p in (tmp_path / "off").rglob("*.err"))
    assert "p2p_communication.py" in logs and "create_tensor_recv_" in logs
    assert result.failure_class != Failure.OOM  # never "does not fit": the layout was not judged


def test_with_the_mode_the_probe_runs_and_its_folder_names_the_mode(piped, tmp_path):
    cfg, planned, bound = piped
    spec, result = probe_job(cfg, planned, bound, tmp_path / "on", probe.MODE)
    assert spec.env[probe.MODE_ENV] == probe.MODE
    assert result.ok, result.failure_detail
    assert result.versions.get("probe_mode") == probe.MODE  # the ledger's versions carry it
    paths = JobPaths(tmp_path / "on")
    docs = [json.loads(paths.sidecar(r).read_text()) for r in bound if paths.sidecar(r).is_file()]
    assert docs and all(d["probe_mode"]["mode"] == probe.MODE for d in docs)


def test_a_stand_in_refuses_what_dev_refuses(monkeypatch, capsys):
    sys.path.insert(0, str(ROOT / "tests" / "workloads"))
    import megatron_io

    argv = [
        "--pipeline-model-parallel-size", "2", "--sequence-packing-scheduler", "dp_balanced",
        "--micro-batch-size", "1", "--global-batch-size", "8", "--seq-length", "64", "--train-iters", "2",
        probe.FAKE_FLAG,
    ]  # fmt: skip
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "7")
    monkeypatch.delenv(probe.MODE_ENV, raising=False)
    assert megatron_io.main(lambda p: (1.0, 10.0), "t", 80.0, argv) == 1
    assert probe.DEV_ERROR in capsys.readouterr().err
    monkeypatch.setenv(probe.MODE_ENV, probe.MODE)
    assert megatron_io.main(lambda p: (1.0, 10.0), "t", 80.0, argv) == 0


def test_the_contract_names_what_dev_crashes_on():
    base = ["--pipeline-model-parallel-size", "4", "--use-varlen-dataset", probe.FAKE_FLAG]
    assert probe.refusal(base, None) == probe.DEV_CRASH
    assert probe.refusal(base, probe.OFF) == probe.DEV_CRASH
    assert probe.refusal(base, probe.MODE) is None
    assert probe.refusal([a for a in base if a != probe.FAKE_FLAG], None) is None  # not a probe: a real job
    assert probe.refusal(["--pipeline-model-parallel-size", "1", "--use-varlen-dataset", probe.FAKE_FLAG], None) is None
    assert probe.unprobeable(Layout(tp=2, pp=4, cp=1, ep=32, etp=1, mbs=1)) is not None
    assert probe.unprobeable(Layout(tp=1, pp=4, cp=8, ep=128, etp=2, mbs=1)) is None


def test_a_bad_probe_mode_is_one_error_naming_the_choices():
    with pytest.raises(ConfigError) as err:
        compose(["+stage=smoke", "workload.probe_mode=fast"])
    assert "workload.probe_mode=static-balanced/1" in str(err.value) and "workload.probe_mode=none" in str(err.value)


def test_balanced_counts_and_the_static_shape():
    # k x T / E per expert from each of ETP x EP sources; the remainder one each to the first experts
    rows = probe_mode.balanced_counts(tokens=10, topk=3, experts=4, sources=2, local=[0, 1, 2, 3])
    assert rows == [[8, 8, 7, 7], [8, 8, 7, 7]] and sum(rows[0]) == 30
    assert probe_mode.balanced_counts(2048, 6, 384, 1, [0], skew=1.5) == [[48]]
    cfg = SimpleNamespace(
        sequence_packing_scheduler="dp_balanced",
        max_seqlen_per_dp_cp_rank=2048,
        sequence_parallel=False,
        hidden_size=7168,
        enable_hyper_connections=True,
        num_residual_streams=4,
        context_parallel_size=4,
        tensor_model_parallel_size=1,
    )
    assert probe_mode.static_shape(cfg, 3, 8) == [2048, 1, 7168 * 4]


@pytest.mark.long
def test_the_code_points_are_read_from_megatrons_code_and_a_moved_one_is_named(tmp_path):
    dev = megatron_tree(DEV, paths=("megatron",))
    assert probe_mode.check_tree(dev) == []
    moved = tmp_path / "moved"
    for point in probe_mode.POINTS:
        (moved / point.file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(dev / point.file, moved / point.file)
    p2p = moved / probe_mode.P2P
    p2p.write_text(p2p.read_text().replace("def _communicate_shapes(", "def _exchange_shapes("))
    problems = probe_mode.check_tree(moved)
    assert len(problems) == 1 and "P2PCommunicator._communicate_shapes is gone" in problems[0], problems


def test_the_schedule_measures_at_scale_what_no_probe_can_run(smoke):
    from orchestrator.schedule.steps.probe_first import probe_first
    from orchestrator.search.env import PlanEnv

    cfg, cands = smoke
    env = PlanEnv(cfg.model, cfg.hardware, cfg.stage, cfg.workload.name)
    c = cands[0]
    wide = dataclasses.replace(c.layout, tp=2)
    for layout, probed in ((c.layout, True), (wide, False)):
        p = env.proposal(c, reason="t")
        p.layout = layout
        p = probe_first(env, p)
        assert (p.fidelity == Fidelity.PROBE) is probed, p.reason
        assert probed or "not probed: TP>1" in p.reason


def test_preflight_says_whether_the_probe_mode_can_install_on_the_checkout(tmp_path):
    from orchestrator.job.preflight import CheckStatus, probe_mode_check

    dev = megatron_tree(DEV, paths=("megatron",))
    row = probe_mode_check(probe.MODE, dev)
    assert row.status is CheckStatus.PASS, row
    (tmp_path / "megatron").mkdir()
    row = probe_mode_check(probe.MODE, tmp_path)
    assert row.status is CheckStatus.FAIL and "is missing" in row.detail and "workload.probe_mode=none" in row.fix


@pytest.mark.long
def test_the_job_wrapper_installs_the_mode_in_megatrons_interpreter_before_the_entry_runs(tmp_path):
    """orchestrator/job/megatron_run.main beside dev's own `megatron/` (tests/job/probe_mode_run.py): the entry
    script finds dev's P2PCommunicator and dispatcher changed, the first line and the sidecar name the mode; a mode
    the job does not know runs nothing and says why in one line."""
    from tests.megatron_env import run_in_tree

    out = run_in_tree(megatron_tree(DEV), "tests.job.probe_mode_run", str(tmp_path / "wrap"))
    on = out["mode"]
    assert on["code"] == 0 and on["entry"]["shapes_patched"] and on["entry"]["a2a_patched"], on
    assert on["entry"]["installed"]["mode"] == probe.MODE and on["first"].startswith(probe.mode_line(probe.MODE))
    assert on["sidecar"]["mode"] == probe.MODE and on["versions"] == probe.MODE
    off = out["unknown"]
    assert off["code"] == 1 and off["entry"] is None and "unknown probe mode" in off["stderr"], off
    assert off["sidecar"] == {"mode": probe.OFF}
