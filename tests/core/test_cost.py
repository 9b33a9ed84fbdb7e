"""The one GPU-hour formula: GPUs x (start-up + that launch's own iterations x step) / 3600."""

from __future__ import annotations

import pytest

from orchestrator.core.cost import attempt_gpu_hours, cluster_hours, decision_hours, launch_gpu_hours


def test_a_launch_pays_start_up_and_its_own_window():
    assert launch_gpu_hours(1024, 300.0, 10.0, 350) == pytest.approx(1024 * (300 + 3500) / 3600)
    # a screen of 60 iterations pays 60, not the full window; a one-GPU probe pays one GPU
    assert launch_gpu_hours(1024, 300.0, 10.0, 60) < launch_gpu_hours(1024, 300.0, 10.0, 350)
    assert launch_gpu_hours(1, 300.0, 10.0, 5) == pytest.approx((300 + 50) / 3600)


def test_an_attempt_without_a_measured_step_pays_its_wall_time_and_one_that_never_ran_nothing():
    assert attempt_gpu_hours(8, 60.0, step_mean_s=None, iterations=0, wall_s=600.0) == pytest.approx(8 * 660 / 3600)
    assert attempt_gpu_hours(8, 60.0, step_mean_s=None, iterations=0, wall_s=None) == 0.0
    assert attempt_gpu_hours(8, 60.0, step_mean_s=2.0, iterations=10, wall_s=9e9) == launch_gpu_hours(8, 60.0, 2.0, 10)
    assert cluster_hours(2048.0, 1024) == 2.0


def test_time_to_a_decision_runs_full_scale_jobs_in_turn_and_probes_beside_them():
    """Two 1,024-GPU jobs of 2,048 GPU-hours each take 4 h on a 1,024-GPU cluster; sixteen one-GPU probes of 0.5
    GPU-hours on an 8-GPU side pool take 1 h beside them."""
    jobs = [(1024, 2048.0), (1024, 2048.0), *[(1, 0.5)] * 16]
    assert decision_hours(jobs, 1024, 8) == (4.0, 1.0)
    assert decision_hours(jobs[:2], 1024, 8) == (4.0, 0.0)
