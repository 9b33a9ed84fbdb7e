"""What a launch costs: the one GPU-hour formula of the budget, `status`, the report, the search and the bench.

GPU-hours of one launch = GPUs x (start-up + the iterations of that launch's own window x its step) / 3600.
Start-up (process start, model build, the first step: minutes at scale, `stage.budget.startup_s`) is paid by
every launch that ran, whatever its window; a screen or a probe pays its own short window, not the stage's
full one; a one-GPU rank probe pays one GPU. Before a launch the step is a prediction; after it, the
measured mean step, or (a job that ended without a measured step) the wall time it held its GPUs.
"""

from __future__ import annotations

SECONDS_PER_HOUR = 3600.0


def launch_gpu_hours(n_gpus: int, startup_s: float, step_s: float, iterations: int) -> float:
    """GPU-hours of one launch of `iterations` steps of `step_s` seconds on `n_gpus` GPUs."""
    return n_gpus * (startup_s + max(0.0, step_s) * max(0, iterations)) / SECONDS_PER_HOUR


def attempt_gpu_hours(
    n_gpus: int,
    startup_s: float,
    *,
    step_mean_s: float | None,
    iterations: int,
    wall_s: float | None,
) -> float:
    """GPU-hours one attempt spent: its measured iterations x mean step when it measured a step, else the
    wall time it ran; an attempt that never started (no step, no wall time) cost nothing."""
    if step_mean_s:
        return launch_gpu_hours(n_gpus, startup_s, step_mean_s, iterations)
    if wall_s is not None:
        return n_gpus * (startup_s + max(0.0, wall_s)) / SECONDS_PER_HOUR
    return 0.0


def launch_gpus(stage_gpus: int, probed_ranks: int = 0) -> int:
    """GPUs one launch holds: a one-GPU rank probe (Megatron's --fake-process-group) holds one GPU per rank it
    probes (each its own 1-GPU task), any other launch the stage's N."""
    return max(1, probed_ranks) if probed_ranks > 0 else stage_gpus


def rank_probe_gpu_hours(probed_ranks: int, startup_s: float, step_s: float, iterations: int) -> float:
    """GPU-hours of one rank probe: each probed rank is 1 GPU x (start-up + iterations x its compute-only step)."""
    return launch_gpu_hours(launch_gpus(0, probed_ranks), startup_s, step_s, iterations)


def cluster_hours(gpu_hours: float, n_gpus: int) -> float:
    """Wall-clock hours a cluster of `n_gpus` GPUs spends on `gpu_hours` run one job after another."""
    return gpu_hours / n_gpus if n_gpus > 0 else 0.0


def decision_hours(jobs: list[tuple[int, float]], cluster_gpus: int, probe_gpus: int) -> tuple[float, float]:
    """(cluster hours, side-pool hours) of a sweep's jobs, each (GPUs, GPU-hours): a job on more than
    `probe_gpus` GPUs runs on the stage's cluster, one after another (its GPU-hours over `cluster_gpus`); a
    smaller one (a probe) runs in parallel on the side pool of `probe_gpus` GPUs. The decision takes the
    longer of the two."""
    big = sum(h for n, h in jobs if n > probe_gpus)
    small = sum(h for n, h in jobs if n <= probe_gpus)
    return cluster_hours(big, cluster_gpus), cluster_hours(small, probe_gpus)
