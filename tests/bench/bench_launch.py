"""Launch control-plane cost: 200 trivial jobs as Slurm arrays on the local cluster, polled to the end.

What is measured is the orchestrator's side only (submit + poll, own CPU plus its sbatch/sacct child
processes), per job, and how many sacct calls each poll costs (goal: exactly 1, whatever the job
count). The jobs themselves (Python start-up on 2 shared cores) dominate the wall time and are not
the orchestrator's cost. Skips with a note when no Slurm cluster answers
(start one: bash tests/cluster/slurm_local.sh up).
"""

from __future__ import annotations

import os
import resource
import shutil
import sys
import tempfile
import time

N_JOBS = int(os.environ.get("BENCH_LAUNCH_JOBS", "200"))
GOAL_CPU_MS_PER_JOB = 50.0
POLL_S = 2.0


def _cpu() -> float:
    """This process's CPU plus that of its finished children (sbatch, sacct)."""
    own = time.process_time()
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own + ch.ru_utime + ch.ru_stime


def main() -> bool | None:
    from orchestrator.core.schema import ClusterConfig, SlurmConfig
    from orchestrator.launch import LaunchTask
    from orchestrator.launch.slurm import SlurmLauncher, slurm_available

    ok, why = slurm_available()
    if not ok:
        print(f"   skipped: no Slurm cluster answers ({why}); start one with bash tests/cluster/slurm_local.sh up")
        return None
    cluster = ClusterConfig(kind="slurm", min_time_min=5, slurm=SlurmConfig(array_parallelism=16, max_array_size=1000))
    launcher = SlurmLauncher(cluster)
    root = tempfile.mkdtemp(prefix="bench-launch-")
    # time.sleep(0): a stdlib function, so the job unpickles it on any node; the work is nothing.
    tasks = [
        LaunchTask(
            fn=time.sleep,
            args=(0.0,),
            n_gpus=1,
            gpus_per_node=8,
            name="bench-launch",
            folder=os.path.join(root, f"job-{i:03d}"),
            time_min=5,
        )
        for i in range(N_JOBS)
    ]

    w0, c0 = time.perf_counter(), _cpu()
    subs = launcher.submit(tasks)
    submit_wall, submit_cpu = time.perf_counter() - w0, _cpu() - c0
    ids = [s.job_id for s in subs]

    poll_wall = poll_cpu = 0.0
    polls, t_start = 0, time.perf_counter()
    while True:
        w, c = time.perf_counter(), _cpu()
        states = launcher.poll(ids)
        poll_wall += time.perf_counter() - w
        poll_cpu += _cpu() - c
        polls += 1
        if all(s.terminal for s in states.values()):
            break
        if time.perf_counter() - t_start > 1800:
            launcher.cancel(ids)
            print("   gave up after 30 min; cancelled")
            return False
        time.sleep(POLL_S)
    total_wall = time.perf_counter() - w0
    shutil.rmtree(root, ignore_errors=True)
    finals = {}
    for s in states.values():
        finals[s.state] = finals.get(s.state, 0) + 1

    per_job_cpu_ms = 1000 * (submit_cpu + poll_cpu) / N_JOBS
    per_poll = launcher.sacct_calls / polls
    print(
        f"   {N_JOBS} jobs in {launcher.sbatch_calls} sbatch call(s) (arrays of <= {cluster.slurm.max_array_size}, "
        f"{cluster.slurm.array_parallelism} at once); final states {finals}"
    )
    print(
        f"   submit: {submit_wall:.2f} s wall, {submit_cpu:.2f} s CPU; poll: {polls} polls, "
        f"{poll_wall:.2f} s wall, {poll_cpu:.2f} s CPU; sacct calls per poll {per_poll:.2f}"
    )
    print(
        f"   control plane per job: {per_job_cpu_ms:.1f} ms CPU, "
        f"{1000 * (submit_wall + poll_wall) / N_JOBS:.1f} ms wall; all jobs done in {total_wall:.0f} s wall"
    )
    met = per_poll == 1.0 and per_job_cpu_ms < GOAL_CPU_MS_PER_JOB and finals == {"COMPLETED": N_JOBS}
    print(
        f"   goal: 1 sacct per poll, < {GOAL_CPU_MS_PER_JOB:.0f} ms CPU per job, all COMPLETED -> "
        f"{'met' if met else 'MISSED'}"
    )
    return met


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    result = main()
    raise SystemExit(0 if result in (True, None) else 1)
