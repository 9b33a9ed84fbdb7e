"""`make bench`: 200 twin jobs through the sweep loop; control-plane time per job and sacct calls per poll.

Runs on the local Slurm cluster when sbatch answers (the real sbatch/sacct path), else on the local
executor. Control-plane time = the loop's wall time minus its sleeps between polls: planning, spec
writing, sbatch, sacct, collecting job folders and ledger writes. Jobs are 2-GPU twin jobs so the
workload itself stays small; the figure is about the orchestrator.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
JOBS = int(os.environ.get("BENCH_SWEEP_JOBS", "200"))
STAGE = [
    "+stage=smoke",
    "stage.name=bench2",
    "stage.gpus=2",
    "stage.gpus_per_node=2",
    "stage.global_batch=16",
    "stage.search.pp=[1,2]",
    "stage.search.ep=[1,2]",
    "stage.search.mbs=[1,2,4,8]",
    "stage.search.dispatcher=[alltoall,allgather,flex:deepep,flex:hybridep]",
    "stage.search.recompute=[[],[moe_act],[full],[mla_up_proj,mhc]]",
    "stage.search.vpp=[1,2,3]",
    f"stage.budget.max_runs={JOBS}",
    "stage.budget.max_rounds=1",
    f"policy.schedule.round0_size={JOBS}",
    "++workload.twin.time_scale=0.000001",
    "++workload.twin.max_sleep_s=0.001",
    "stage.warmup_iters=2",
    "stage.measure_iters=3",
]


def main() -> bool:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from orchestrator.config import compose
    from orchestrator.launch.auto import make_launcher
    from orchestrator.ledger.ledger import Ledger
    from orchestrator.sweep import Driver
    from orchestrator.sweep.view import View

    tmp = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    try:
        kind = "slurm" if shutil.which("sbatch") else "local"
        composed = compose(
            STAGE
            + [
                f"cluster={kind}",
                f"ledger.url=sqlite:///{tmp / 'ledger.sqlite'}",
                f"cluster.folder={tmp / 'runs'}",
                "sweep.name=bench",
                f"++cluster.poll_interval_s={2.0 if kind == 'slurm' else 0.5}",
            ]
        )
        cfg = composed.cfg
        launcher, reason = make_launcher(cfg.cluster)
        view = View(live=False, stream=open("/dev/null", "w"))
        with Ledger.from_config(cfg.ledger) as ledger:
            sweep = ledger.create_or_get_sweep(
                "bench",
                stage=cfg.stage.name,
                config_yaml=composed.to_yaml(),
                model=cfg.model.name,
                hardware=cfg.hardware.name,
                workload=cfg.workload.name,
                provenance={},
            )
            driver = Driver(ledger, cfg, sweep, launcher, view)
            t0 = time.perf_counter()
            out = driver.run()
            wall = time.perf_counter() - t0
            done = len(ledger.evidence.measured(sweep="bench"))
        jobs = driver.stats["submitted"]
        control = wall - driver.stats["sleep_s"]
        sacct = getattr(launcher, "sacct_calls", None)
        polls = driver.stats["polls"]
        print(f"cluster {launcher.kind} ({reason}); {jobs} twin jobs (simulated), {done} measured, stop: {out.reason}")
        print(f"wall {wall:.1f}s, control-plane {control:.1f}s = {control / max(jobs, 1) * 1000:.1f} ms per job")
        if sacct is not None:
            print(
                f"sacct calls {sacct} over {polls} polls = {sacct / max(polls, 1):.2f} per poll; "
                f"sbatch calls {getattr(launcher, 'sbatch_calls', '?')}"
            )
        else:
            print(f"polls {polls} (local executor: no sacct)")
        return jobs == JOBS and (sacct is None or sacct <= polls)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
