"""orchestrator/core/paths.py: one owner of the job folder's names, and the one atomic write."""

from __future__ import annotations

import os

import pytest

from orchestrator import runspec
from orchestrator.config import compose
from orchestrator.core import paths as paths_mod
from orchestrator.core.paths import CheckpointPaths, JobPaths, atomic_write
from orchestrator.evidence.collect import collect, load_result
from orchestrator.job.entry import run_task
from orchestrator.plan import planner
from orchestrator.plan.layout import Layout

FAST = ["++workload.twin.time_scale=0.00001", "++workload.twin.max_sleep_s=0.001"]


def test_names_of_an_attempt_folder(tmp_path):
    p = JobPaths.of_attempt(tmp_path, "s1", "abc", 2)
    assert p.folder == tmp_path.resolve() / "s1" / "abc" / "attempt-2"
    assert (p.spec.name, p.result.name) == ("job.json", "result.json")
    assert (p.stdout(3).name, p.stderr(3).name, p.sidecar(3).name) == (
        "rank-3.out",
        "rank-3.err",
        "sidecar-rank-3.json",
    )
    for f in (p.stdout(12), p.stderr(12), p.sidecar(12), p.time_limit_mark(12)):
        assert JobPaths.rank_of(f) == 12 and f.parent == p.folder
    assert CheckpointPaths(tmp_path).twin_marker(6) == tmp_path / "iter_0000006" / "twin-checkpoint.json"


def test_collect_reads_what_the_twin_writes(tmp_path):
    """The workload side (entry, twin) and the reading side (collect) meet only through JobPaths."""
    cfg = compose(["+stage=smoke", "cluster=local", f"cluster.folder={tmp_path / 'runs'}", *FAST]).cfg
    planned = planner.evaluate(cfg.model, cfg.hardware, cfg.stage, Layout(pp=2, ep=8), workload=cfg.workload.name)
    assert isinstance(planned, planner.Planned), planned
    spec = runspec.build_spec(cfg, planned, sweep="p", attempt=1)
    folder = JobPaths(spec.job_dir)
    assert folder == JobPaths.of_attempt(cfg.cluster.folder, "p", planned.key, 1)
    spec.save(folder.spec)
    run_task(spec)  # one process stands for the job: rank N-1 writes the rank files and one sidecar per stage
    n = spec.n_gpus
    assert folder.rank_logs() == [folder.stdout(n - 1), folder.stderr(n - 1)]
    assert [JobPaths.rank_of(p) for p in folder.sidecars()] == [0, n // 2]  # the DP-0, TP-0, CP-0 rank per stage
    res = collect(folder.folder, slurm_state="COMPLETED", exit_code=0)
    assert res.ok and res.simulated
    assert res.log_paths == [str(p) for p in folder.rank_logs()]
    assert res.sidecar_paths == [str(p) for p in folder.sidecars()]
    assert folder.result.is_file() and load_result(folder.folder) == res
    assert not [p for p in folder.folder.iterdir() if p.name.endswith(".tmp")]


def test_atomic_write_replaces_whole_files(tmp_path):
    target = tmp_path / "deep" / "result.json"
    atomic_write(target, "first")
    atomic_write(target, b"second")
    assert target.read_bytes() == b"second"
    assert os.listdir(target.parent) == ["result.json"]


def test_atomic_write_leaves_no_partial_file_when_the_writer_fails(tmp_path, monkeypatch):
    target = tmp_path / "job.json"
    target.write_text("old, complete")

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(paths_mod.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, "new " * 10_000)
    assert target.read_text() == "old, complete"  # the reader still sees the old file, whole
    assert os.listdir(tmp_path) == ["job.json"]  # and no temporary file is left behind
    with pytest.raises(OSError):
        atomic_write(tmp_path / "fresh.json", "x")
    assert os.listdir(tmp_path) == ["job.json"]  # a new file appears whole or not at all


def test_a_candidate_folder_reads_as_its_number_and_layout_and_ends_with_its_key():
    from orchestrator.core.paths import candidate_folder

    key = "0123456789abcdef" * 2
    name = candidate_folder(key, 7, "TP1 PP8 VPP1 CP1 EP64 ETP1 MBS1 rc=mhc+mla_up_proj flex:deepep")
    assert name == f"c7-TP1-PP8-VPP1-CP1-EP64-ETP1-MBS1-rc=mhc+mla_up_proj-flex_deepep-{key}"
    assert candidate_folder(key) == key  # a layout that is no candidate (a parity reference): its key alone
    assert "/" not in candidate_folder(key, 1, "a/b c") and candidate_folder(key, 1, "a/b c").endswith(key)
