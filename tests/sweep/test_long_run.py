"""The long-run window on the twin: save at X and exit (Megatron's --save/--save-interval/--exit-interval),
restore (--load) and train on; collect turns the checkpoint timers into ckpt_save_s / ckpt_restore_s and
Q_effective. Also: the twin ignores SIGUSR2 and, without a job spec, counts blocks from the pattern."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import runspec
from orchestrator.config import compose
from orchestrator.core.paths import CheckpointPaths
from orchestrator.evidence.collect import collect
from orchestrator.evidence.parse import parse_file
from orchestrator.job.entry import TaskFailed, run_task
from orchestrator.job.twin import truth
from orchestrator.job.twin.job import load_job
from orchestrator.plan import planner
from orchestrator.plan.layout import Layout

FAST = ["++workload.twin.time_scale=0.00001", "++workload.twin.max_sleep_s=0.001"]
LAYOUT = Layout(tp=1, pp=2, vpp=1, cp=1, ep=8, etp=1, mbs=1)


def _cfg(tmp_path: Path, *extra: str):
    return compose(["+stage=smoke", "cluster=local", f"cluster.folder={tmp_path / 'runs'}", *FAST, *extra]).cfg


def _planned(cfg, layout: Layout = LAYOUT):
    out = planner.evaluate(cfg.model, cfg.hardware, cfg.stage, layout, workload=cfg.workload.name)
    assert isinstance(out, planner.Planned), out
    return out


def _run(spec):
    """Run one job in this process (single-process twin) and collect it as the launcher would."""
    try:
        run_task(spec)
        code = 0
    except TaskFailed:
        code = 1
    return collect(spec.job_dir, slurm_state="COMPLETED" if code == 0 else "FAILED", exit_code=code)


def _iterations(spec) -> list:
    return [r.iteration for p in sorted(Path(spec.job_dir).glob("rank-*.out")) for r in parse_file(p).iterations]


@pytest.mark.long
def test_save_then_restore_measures_checkpoint_and_effective_throughput(tmp_path):
    cfg = _cfg(tmp_path, "++effective.long_run_save_at=6", "++effective.long_run_after_iters=8")
    ckpt = tmp_path / "ckpt"
    save_spec, restore_spec = runspec.long_run_specs(cfg, _planned(cfg), sweep="lr", attempt=1, ckpt_dir=ckpt)
    assert save_spec.argv[-6:] == ["--save", str(ckpt), "--save-interval", "6", "--exit-interval", "6"]
    assert restore_spec.argv[-3:] == ["--load", str(ckpt), "--exit-on-missing-checkpoint"]
    assert "--train-iters" in save_spec.argv  # same schedule length in both jobs
    ti = save_spec.argv.index("--train-iters")
    assert save_spec.argv[ti + 1] == restore_spec.argv[restore_spec.argv.index("--train-iters") + 1] == "14"

    saved = _run(save_spec)
    assert saved.ok, saved.failure_detail
    assert _iterations(save_spec)[-1] == 6  # exited at the exit interval, not at --train-iters
    assert CheckpointPaths(ckpt).tracker.read_text() == "6"
    assert (ckpt / "iter_0000006" / CheckpointPaths.TWIN_MARKER).is_file()
    out = "".join(p.read_text() for p in Path(save_spec.job_dir).glob("rank-*.*"))
    assert "saving checkpoint at iteration       6 to" in out and "successfully saved checkpoint from iteration" in out
    assert "exiting program at iteration 6" in out
    lo, hi = saved.timers_ms["save-checkpoint"]
    assert 0 < lo <= hi and saved.ckpt_save_s == pytest.approx(hi / 1000.0)
    # the save time follows the size model: the heaviest rank's weights + optimizer at ckpt_gb_s (noise 3%)
    job = load_job(save_spec.argv, {"ORCH_JOB_SPEC": str(Path(save_spec.job_dir) / "job.json")})
    gb = max(truth.evaluate(job.case()).checkpoint_gb)
    assert saved.ckpt_save_s == pytest.approx(gb / cfg.workload.twin.ckpt_gb_s, rel=0.15)

    restored = _run(restore_spec)
    assert restored.ok, restored.failure_detail
    its = _iterations(restore_spec)
    assert its[0] == 7 and its[-1] == 14  # numbering resumes after the checkpoint
    assert restored.measure_iters == 8 - min(cfg.stage.warmup_iters, 4)
    assert restored.timers_ms["load-checkpoint"][1] > 0 and restored.ckpt_restore_s > 0
    assert restored.tokens_per_s_after_restart == restored.tokens_per_s > 0
    # Q_effective: below steady tokens/s by the checkpoint and failure share
    for r in (saved, restored):
        assert 0 < r.effective_fraction < 1 and r.q_effective < r.tokens_per_s
        assert r.q_effective == pytest.approx(r.tokens_per_s * r.effective_fraction)


def test_restore_without_checkpoint_is_a_clear_failure(tmp_path):
    cfg = _cfg(tmp_path)
    _, restore_spec = runspec.long_run_specs(cfg, _planned(cfg), sweep="lr", attempt=1, ckpt_dir=tmp_path / "none")
    res = _run(restore_spec)  # Megatron exits 0 with --exit-on-missing-checkpoint: collect must not call it a run
    assert not res.ok and res.measure_iters == 0
    assert "restore job loaded no checkpoint" in res.failure_detail
    assert "could not find the metadata file" in res.failure_detail
    assert res.q_effective is None and res.tokens_per_s_after_restart is None


def test_tracker_without_checkpoint_files_fails_with_file_not_found(tmp_path):
    cfg = _cfg(tmp_path)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    CheckpointPaths(ckpt).tracker.write_text("10")  # the tracker names iteration 10, whose files are gone
    _, restore_spec = runspec.long_run_specs(cfg, _planned(cfg), sweep="lr", attempt=1, ckpt_dir=ckpt)
    res = _run(restore_spec)
    assert not res.ok and res.exit_code == 1
    assert res.failure_class == "CRASH" and "FileNotFoundError" in res.failure_detail


def test_measurement_job_gets_q_effective_from_default_checkpoint_times(tmp_path):
    cfg = _cfg(tmp_path)
    spec = runspec.build_spec(cfg, _planned(cfg), sweep="m", attempt=1)
    assert spec.effective == cfg.effective and spec.role == "measure"
    res = _run(spec)
    assert res.ok and res.ckpt_save_s is None and res.ckpt_restore_s is None
    from orchestrator.evidence.effective import effective_throughput

    e = cfg.effective
    want = effective_throughput(
        res.tokens_per_s,
        n_gpus=spec.n_gpus,
        save_s=e.default_save_s,
        restore_s=e.default_restore_s,
        checkpoint_interval_s=e.checkpoint_interval_s,
        interruption_rate_per_gpu_hour=e.interruption_rate_per_gpu_hour,
        restart_overhead_s=e.restart_overhead_s,
    )
    assert res.q_effective == pytest.approx(want.q_effective) and res.q_effective < res.tokens_per_s


def test_twin_ignores_sigusr2_and_finishes(tmp_path):
    """Slurm's time-limit warning (USR2) reaches every process of the step; the twin must keep training."""
    cfg = _cfg(tmp_path, "++workload.twin.time_scale=0.05", "++workload.twin.max_sleep_s=0.1")
    spec = runspec.build_spec(cfg, _planned(cfg), sweep="sig", attempt=1)
    spec.save(Path(spec.job_dir) / "job.json")
    env = {
        **os.environ,
        "ORCH_JOB_SPEC": str(Path(spec.job_dir) / "job.json"),
        "ORCH_SINGLE_PROCESS": "1",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.job.twin", *spec.argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    line = ""
    while "iteration" not in line and time.monotonic() < deadline:  # training has started
        line = proc.stdout.readline()
    proc.send_signal(signal.SIGUSR2)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "after training is done" in out and "received signal" not in err


def test_twin_without_spec_counts_blocks_from_the_pattern(tmp_path):
    cfg = compose(["+stage=slice", "cluster=local"]).cfg
    pl = planner.evaluate(cfg.model, cfg.hardware, cfg.stage, Layout(pp=2, cp=2, ep=32), workload="twin")
    spec = runspec.build_spec(cfg, pl, sweep="ns", attempt=1, job_dir=tmp_path / "j")
    argv = spec.argv
    num_layers = int(argv[argv.index("--num-layers") + 1])
    job = load_job(argv, {"WORLD_SIZE": "64", "RANK": "63"})  # torchrun's env, no ORCH_JOB_SPEC
    assert num_layers > 4 and job.model.num_layers == 4  # --num-layers counts symbols, blocks are 4
    assert len(truth.evaluate(job.case()).stage_gb) == 2  # one figure per pipeline stage of the pattern


def test_entry_starts_workloads_with_sigusr2_ignored(tmp_path):
    """A workload that installs no handler (a real Megatron) must survive Slurm's USR2 warning too."""
    from orchestrator.job import entry

    script = "import os, signal, time; os.kill(os.getpid(), signal.SIGUSR2); time.sleep(0.2); print('alive')"
    from orchestrator.core.paths import JobPaths
    from orchestrator.job.ranklog import RankOutput

    paths = JobPaths(tmp_path)
    with RankOutput(paths, 0, evidence=True) as output:
        code = entry._run_subprocess([sys.executable, "-c", script], dict(os.environ), tmp_path, output)
    out, err = paths.stdout(0), paths.stderr(0)
    assert code == 0 and out.read_text().strip() == "alive", err.read_text()
