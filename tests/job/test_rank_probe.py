"""One-GPU rank probes (Megatron's --fake-process-group): the job runs each bounding rank of the N-GPU job alone
on one GPU, the twin and the stand-ins show that rank's memory without NCCL and dispatcher buffers and its
compute alone, and the cost is one GPU per probed rank on the side pool."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from orchestrator.core import cost
from orchestrator.core.spec import ALONE_INDEX_ENV
from orchestrator.core.states import Fidelity
from orchestrator.evidence.collect import collect
from orchestrator.job import entry
from orchestrator.job.twin import truth
from orchestrator.plan import argv as A
from orchestrator.plan import ranks
from orchestrator.runspec import build_spec, launch_task
from orchestrator.search.select import probe_margin_gb
from orchestrator.search.types import Observation

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def piped(smoke):
    """A smoke-stage layout with PP > 1 and its bounding ranks."""
    cfg, cands = smoke
    planned = next(c for c in cands if c.layout.pp > 1)
    bound = ranks.probe_ranks(planned.layout, cfg.stage.gpus, planned.prediction.heaviest_stage)
    return cfg, planned, bound


def test_the_bounding_ranks_are_the_first_and_last_stage_and_the_heaviest():
    from orchestrator.plan.layout import Layout

    lay = Layout(tp=1, pp=8, cp=1, ep=64, etp=1, mbs=1)
    assert ranks.probe_ranks(lay, 1024, 3) == [0, 3 * 128, 1023]
    assert ranks.probe_ranks(lay, 1024, 0) == [0, 1023]  # deduplicated
    assert ranks.probe_ranks(dataclasses.replace(lay, pp=1), 1024, 0) == [1023]  # one stage: the last rank
    for r in ranks.probe_ranks(lay, 1024, 5):
        assert ranks.coords(lay, 1024, r)["pp"] in (0, 5, 7)


@pytest.mark.long
def test_a_rank_probe_job_runs_each_bounding_rank_alone_and_reads_its_memory(piped, tmp_path):
    cfg, planned, bound = piped
    n = cfg.stage.gpus
    spec = build_spec(
        cfg,
        planned,
        sweep="p",
        attempt=1,
        job_dir=tmp_path / "probe",
        window=(0, 5),
        fidelity=Fidelity.PROBE,
        probe_ranks=bound,
    )
    assert spec.argv[-1] == A.PROBE_FLAG and spec.n_gpus == n
    task = launch_task(cfg, spec)  # one one-GPU task per probed rank (Slurm: array tasks of their own)
    assert (task.n_gpus, task.alone) == (1, len(bound)) and spec.launch_gpus == len(bound)
    # off Slurm one process per probed rank, each rank RANK of WORLD_SIZE = N, alone
    envs = entry.rank_envs(spec)
    assert [(e.rank, e.world_size, e.single_process) for e in envs] == [(r, n, False) for r in bound]
    for i, r in enumerate(bound):  # an array task started alone (ALONE_INDEX_ENV = i) runs probed rank i only
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(ALONE_INDEX_ENV, str(i))
            assert [(e.rank, e.world_size, e.local_rank) for e in entry.rank_envs(spec)] == [(r, n, 0)]
    entry.run_task(spec)
    probe = collect(tmp_path / "probe")
    full_spec = build_spec(cfg, planned, sweep="p", attempt=1, job_dir=tmp_path / "full", window=(0, 5))
    entry.run_task(full_spec)
    full = collect(tmp_path / "full")
    assert probe.ok and full.ok
    s = truth.evaluate(
        truth.Case(
            cfg.model, cfg.hardware, cfg.stage, cfg.workload.twin, planned.layout, planned.prediction.layer_pattern
        )
    )
    stages = [ranks.coords(planned.layout, n, r)["pp"] for r in bound]
    # the probe sees its ranks' memory less NCCL's and the dispatcher's buffers: below the full-scale peak
    assert probe.peak_reserved_gb == pytest.approx(max(s.stage_probe_gb[p] for p in stages), rel=0.01)
    assert probe.peak_reserved_gb < full.peak_reserved_gb
    assert {m.rank for m in probe.rank_memory} <= set(bound)
    # and its compute alone: no collective, no bubble, so faster than the job's step
    assert max(s.stage_probe_s) < s.step_s


def test_a_stand_in_keeps_the_probe_contract(tmp_path):
    """workload.command stand-ins get --fake-process-group with RANK / WORLD_SIZE: a probe of rank r."""
    sys.path.insert(0, str(ROOT / "tests" / "workloads"))
    import megatron_io

    step, mem = megatron_io.probe(2.0, 100.0)
    assert step < 2.0 and mem == 100.0 - megatron_io.PROBE_UNSEEN_GB


def test_a_probe_is_charged_one_gpu_per_rank_on_the_side_pool():
    one = cost.rank_probe_gpu_hours(3, 300.0, 2.0, 5)
    assert one == pytest.approx(3 * (300.0 + 10.0) / 3600.0)
    assert cost.launch_gpus(1024, 3) == 3 and cost.launch_gpus(1024, 0) == 1024
    cluster_h, pool_h = cost.decision_hours([(1024, 1024.0), (3, one)], 1024, 8)
    assert (cluster_h, pool_h) == (1.0, pytest.approx(one / 8))


def test_known_to_fit_from_a_probe_needs_its_peak_plus_the_learned_margin_under_hbm():
    from orchestrator.plan.layout import Layout

    assert probe_margin_gb([], 6.0) == 6.0  # the schema's default until a probed layout ran at full scale
    assert probe_margin_gb([(130.0, 126.5), (120.0, 118.0)], 6.0) == 3.5  # the largest gap measured
    assert probe_margin_gb([(100.0, 101.0)], 6.0) == 0.0

    def row(peak):  # observe adds the margin to a rank probe's peak
        return Observation(
            key="k",
            layout=Layout(),
            raw_components={},
            raw_step_s=1.0,
            raw_memory_gb=150.0,
            peak_gb=peak,
            hbm_gb=141.0,
            fidelity=Fidelity.PROBE,
            probe_margin_gb=3.5,
        )

    assert row(138.0 + 3.5).probed_fit is False and row(137.0 + 3.5).probed_fit is True  # measured 138 vs 137
