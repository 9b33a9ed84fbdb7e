"""Whether Slurm answers on this host, and how a sweep bound to Slurm waits for it (the backend's probe and wait).

Why both `sbatch --version` and `sinfo`: the client can be installed with no reachable controller
(a laptop, a login node during maintenance); only a controller that answers can run jobs.
Why a bound sweep waits instead of falling back: a sweep is bound to the launcher its jobs run on
(`cluster=auto` resolves once, when the sweep starts); a Slurm that does not answer for a moment must not
turn its running jobs into "lost" local ones whose half-written folders read as results.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable

from orchestrator.core.errors import UserError
from orchestrator.core.schema import ClusterConfig
from orchestrator.launch.registry import Probe


def slurm_available(timeout_s: float = 20.0) -> tuple[bool, str]:
    """(answers, why) for this machine's Slurm client and controller."""
    if shutil.which("sbatch") is None:
        return False, "no sbatch on PATH"
    try:
        ver = subprocess.run(["sbatch", "--version"], capture_output=True, text=True, timeout=timeout_s)
        if ver.returncode != 0:
            return False, f"sbatch --version failed: {ver.stderr.strip()[:120]}"
        info = subprocess.run(["sinfo", "-h", "-o", "%D"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"Slurm does not answer ({exc})"
    if info.returncode != 0:
        last = (info.stderr.strip().splitlines() or ["?"])[-1]
        return False, f"sinfo failed: {last[:120]}"
    nodes = sum(int(x) for x in info.stdout.split() if x.isdigit())
    return True, f"{ver.stdout.strip()} answers, sinfo lists {nodes} node(s)"


def wait_for_slurm(
    cluster: ClusterConfig,
    event: Callable[[str], None],
    probe: Probe = slurm_available,
    *,
    sleep: Callable[[float], None] = time.sleep,
    first_pause_s: float = 2.0,
    max_pause_s: float = 30.0,
) -> str:
    """Until Slurm answers: probe, then pause 2, 4, 8 ... (at most 30) s, saying so each time, for at most
    `cluster.slurm.wait_s`. A UserError (one line, the last reason) when it still does not answer."""
    budget = max(0.0, float(cluster.slurm.wait_s))
    start, pause = time.monotonic(), first_pause_s
    while True:
        ok, why = probe()
        if ok:
            return why
        left = budget - (time.monotonic() - start)
        if left <= 0:
            raise UserError(
                f"Slurm does not answer after {budget:.0f}s ({why}); this sweep's jobs run on Slurm, so it is "
                "not resumed elsewhere: run the same command again once sinfo answers (cluster.slurm.wait_s "
                "sets the wait)"
            )
        pause = min(pause, max_pause_s, left)
        event(
            f"Slurm does not answer ({why}): this sweep's jobs run there; retrying in {pause:.0f}s ({left:.0f}s left)"
        )
        sleep(pause)
        pause *= 2
