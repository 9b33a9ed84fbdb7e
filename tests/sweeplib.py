"""Helpers for the sweep tests: run the real CLI in a subprocess and read the ledger it wrote."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from orchestrator.core.states import AttemptState, CandidateStatus
from orchestrator.ledger.ledger import AttemptRow, Ledger, SweepRow

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
# The early cut (stage.screen.cut) stops a running job the driver reads over its line: whether a poll catches a
# fast twin job while it runs is timing, so sweeps whose windows are long enough to be cut and that test something
# else turn it off (tests/sweep/test_cutoff.py tests the cut itself, and in-process sweeps cut deterministically).
UNCUT = "stage.screen.cut=false"
FAST_TWIN = ["++workload.twin.time_scale=0.000001", "++workload.twin.max_sleep_s=0.001"]
# A sweep whose finalists run: the correctness gate (parity) and the long-run save/restore, round 0 four layouts
# (add ++workload.twin.diverge_when={...} for the finalists that fail the gate)
FINALISTS_SWEEP = (
    "parity.enabled=true",
    "++effective.long_run=true",
    "++effective.long_run_save_at=6",
    "++effective.long_run_after_iters=6",
    "policy.search.promote_top_k=3",
    "policy.schedule.round0_size=4",
    "stage.budget.max_runs=4",
)


def sweep_args(tmp_path: Path, name: str, *extra: str, stage: str = "smoke", cluster: str = "local") -> list[str]:
    return [
        f"+stage={stage}",
        f"cluster={cluster}",
        f"sweep.name={name}",
        f"ledger.url={ledger_url(tmp_path)}",
        f"cluster.folder={tmp_path / 'runs'}",
        "++cluster.poll_interval_s=0.3",
        "++ledger.lease_ttl_s=4",
        *FAST_TWIN,
        # the whole sweep's price (schema default 4 samples, tens of CPU-seconds at 1k and 8k) is tested on its own
        *([] if any("price_samples" in x for x in extra) else ["stage.budget.price_samples=0"]),
        *extra,
    ]


def new_sweep(ledger: Ledger, name: str, composed) -> SweepRow:
    """A sweep row for a composed config (orchestrator.config.compose), as `sweep` creates it."""
    cfg = composed.cfg
    return ledger.create_or_get_sweep(
        name,
        stage=cfg.required_stage().name,
        config_yaml=composed.to_yaml(),
        model=cfg.model.name,
        hardware=cfg.hardware.name,
        workload=cfg.workload.name,
        provenance={},
    )


def ledger_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.sqlite'}"


def cli(*args: str, timeout: float = 600, env=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "orchestrator", *args]
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def _take_sigint() -> None:
    """In the forked child, before exec: SIGINT at its default, as in a terminal's foreground process."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen(*args: str, log: Path, env=None, interruptible: bool = False) -> subprocess.Popen:
    """The CLI in the background. `interruptible`: it takes SIGINT as Ctrl-C at a terminal would reach it, even
    when this process ignores SIGINT (pytest started by a script with `&`, as CI may: an ignored signal is
    inherited, and the sweep then ran to its end through the test's SIGINT, exit 0 where 130 was expected)."""
    out = open(log, "w")
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **(env or {})},
        preexec_fn=_take_sigint if interruptible else None,
    )


def wait_for(pred: Callable[[], T], timeout: float, what: str, every: float = 0.3) -> T:
    """Ask `pred` until it answers (truthy): the event itself, polled, never a fixed sleep."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def all_attempts(ledger: Ledger, sweep: str):
    """Every attempt of the sweep, of every role (the finalists' jobs are attempts too)."""
    return [a for c in ledger.candidates(sweep) for a in ledger.attempts(c.id, roles=None)]


def assert_accounted(ledger: Ledger, sweep: str) -> None:
    """Every candidate ended (done / failed / cancelled), each attempt that ran has a job id, ids are unique."""
    cands = ledger.candidates(sweep)
    assert cands
    for c in cands:
        assert c.status in CandidateStatus.TERMINAL, (c.key, c.status)
    atts = [a for a in all_attempts(ledger, sweep) if not a.aborted]  # a launch intent that never ran has no id
    ids = [a.job_id for a in atts]
    assert all(ids) and len(ids) == len(set(ids)), ids
    for c in cands:
        if c.status == CandidateStatus.DONE:
            assert ledger.evidence.result(ledger.attempts(c.id)[-1].id) is not None


def last_iteration(job_dir: str) -> int:
    """The highest iteration any rank file of the job printed so far (0: none yet)."""
    from orchestrator.core.paths import JobPaths
    from orchestrator.evidence.parse import parse_file

    return max((r.iteration for p in JobPaths(job_dir).rank_logs() for r in parse_file(p).iterations), default=0)


def first_running(ledger: Ledger, sweep: str) -> AttemptRow | None:
    """An attempt sacct (or the local executor) reports RUNNING on a known node, else None."""
    return next((a for a in all_attempts(ledger, sweep) if a.state == AttemptState.RUNNING and a.node_list), None)


def _arg(args: Sequence[str], key: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"{key}="))


@dataclass
class RunningSweep:
    """A `sweep` CLI process in the background and the ledger it writes (see running_sweep)."""

    proc: subprocess.Popen
    name: str
    url: str
    log: Path

    def wait_ledger(self, pred: Callable[[Ledger], T], timeout: float, what: str) -> T:
        """Until `pred(ledger)` answers; asked only once the sweep exists (before that nothing is there)."""
        with Ledger.open(self.url) as led:
            return wait_for(lambda: led.get_sweep(self.name) is not None and pred(led), timeout, what)

    def attempts(self, n: int, timeout: float) -> list[AttemptRow]:
        """Until at least n attempts have a job id in the ledger (submitted, ids stored)."""

        def enough(led: Ledger) -> list[AttemptRow] | None:
            atts = [a for a in all_attempts(led, self.name) if a.job_id]  # not launch intents without an id
            return atts if len(atts) >= n else None

        return self.wait_ledger(enough, timeout, f"{n} job(s) in the ledger")

    def wait(self, timeout: float) -> int:
        """The process's exit status (it must end by itself within `timeout`)."""
        return self.proc.wait(timeout=timeout)

    def output(self) -> str:
        return self.log.read_text()

    def kill(self) -> None:
        """kill -9 the orchestrator only: the jobs it launched live on (what `resume` must find)."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@contextmanager
def running_sweep(args: Sequence[str], *, log: Path, env=None, interruptible: bool = False) -> Iterator[RunningSweep]:
    """`python -m orchestrator sweep ARGS --plain` in the background (`args` as from sweep_args: they name
    the sweep and the ledger; `interruptible`: see popen). On the way out a process still running is killed with
    its process group (its local jobs), so no test leaves an orchestrator behind."""
    proc = popen("sweep", *args, "--plain", log=log, env=env, interruptible=interruptible)
    try:
        yield RunningSweep(proc, _arg(args, "sweep.name"), _arg(args, "ledger.url"), log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---- Slurm: shims that count (and can fail) the client, and the three accounting checks ------------------


@dataclass
class SlurmShims:
    """A PATH whose sbatch / sinfo / sacct log each call and exec the real command; `down(n)` makes each of
    them fail (exit 1, "Unable to contact slurm controller") for its next n calls: a brief Slurm outage as the
    orchestrator sees it. `submitted()` = the job ids sbatch really returned, whoever asked."""

    bindir: Path

    @property
    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.bindir}:{os.environ['PATH']}"}

    def down(self, calls: int = 0, **per_tool: int) -> None:
        """The next `calls` calls of each of sbatch / sinfo / sacct fail (per_tool: sbatch=2, sinfo=1 ...)."""
        for name in ("sbatch", "sinfo", "sacct"):
            (self.bindir / f"{name}.down").write_text(str(per_tool.get(name, calls)))

    def calls(self, name: str) -> list[str]:
        p = self.bindir / f"{name}.calls"
        return p.read_text().splitlines() if p.exists() else []

    def failed(self, name: str) -> int:
        p = self.bindir / f"{name}.failed"
        return len(p.read_text().splitlines()) if p.exists() else 0

    def submitted(self) -> set[str]:
        p = self.bindir / "sbatch.ids"
        return {ln.split()[-1] for ln in p.read_text().splitlines() if ln.strip()} if p.exists() else set()


def slurm_shims(tmp_path: Path) -> SlurmShims:
    bindir = tmp_path / "slurm-bin"
    bindir.mkdir()
    for name in ("sbatch", "sinfo", "sacct"):
        real = subprocess.run(["bash", "-lc", f"command -v {name}"], capture_output=True, text=True).stdout.strip()
        assert real, f"{name} not on PATH"
        d = bindir
        # flock: the orchestrator and its tests call these concurrently; the down-counter must not race.
        ids = f'out=$({real} "$@"); rc=$?; echo "$out"; echo "$out" | grep "^Submitted batch job" >> {d}/sbatch.ids'
        run = f"{ids}; exit $rc" if name == "sbatch" else f'exec {real} "$@"'
        (bindir / name).write_text(
            "#!/bin/bash\n"
            f'echo "$*" >> {d}/{name}.calls\n'
            f"exec 9>{d}/{name}.lock; flock 9\n"
            f"n=$(cat {d}/{name}.down 2>/dev/null || echo 0)\n"
            'if [ "$n" -gt 0 ]; then\n'
            f"  echo $((n - 1)) > {d}/{name}.down; echo x >> {d}/{name}.failed; flock -u 9\n"
            f'  echo "{name}: error: Unable to contact slurm controller (connect failure)" >&2; exit 1\n'
            "fi\n"
            "flock -u 9; exec 9>&-\n"
            f"{run}\n"
        )
        (bindir / name).chmod(0o755)
    return SlurmShims(bindir)


def sacct_runs(job_ids: Sequence[str]) -> dict[str, list[str]]:
    """Every run sacct recorded of each job (`--duplicates`: a job Slurm requeued has one row per run), by id."""
    bases = sorted({str(j).split("_")[0] for j in job_ids})
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "--duplicates", "-o", "JobID,State", "-j", ",".join(bases)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    runs: dict[str, list[str]] = {}
    for line in out.splitlines():
        if "|" in line:
            jid, state = line.split("|", 1)
            runs.setdefault(jid, []).append(state)
    return runs


def sacct_nodes(job_ids: Sequence[str]) -> dict[str, str]:
    """The node list sacct gives each job (an array task under its own id `123_0`; the latest run's)."""
    bases = sorted({str(j).split("_")[0] for j in job_ids})
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "--duplicates", "-o", "JobID,NodeList", "-j", ",".join(bases)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def wrong_nodes(ledger: Ledger, sweep: str) -> list[tuple[str, str, str]]:
    """Attempts whose recorded node is not the one sacct says their job ran on: (job id, ledger, sacct)."""
    atts = [a for a in all_attempts(ledger, sweep) if a.job_id and a.node_list]
    nodes = sacct_nodes([str(a.job_id) for a in atts]) if atts else {}
    return [
        (str(a.job_id), str(a.node_list), nodes[str(a.job_id)])
        for a in atts
        if nodes.get(str(a.job_id)) and nodes[str(a.job_id)] != a.node_list
    ]


def assert_slurm_accounted(ledger: Ledger, sweep: str, shims: SlurmShims) -> dict[str, int]:
    """The three numbers every fault test must show as 0, on the real cluster: untracked jobs (sbatch returned
    an id the ledger does not hold), duplicate launches (a candidate whose attempts outnumber its failures + 1,
    or a job sacct ran more than once) and lost results (an attempt Slurm COMPLETED without a full result)."""
    assert_accounted(ledger, sweep)
    atts = all_attempts(ledger, sweep)
    bases = {str(a.job_id).split("_")[0] for a in atts}
    untracked = shims.submitted() - bases
    runs = wait_for(lambda: _settled(sacct_runs([a.job_id for a in atts])), 120, "sacct to settle")
    rerun = {j: s for j, s in runs.items() if len(s) > 1}
    per_cand = [ledger.attempts(c.id) for c in ledger.candidates(sweep)]
    twice = [[a.job_id for a in cand] for cand in per_cand if sum(1 for a in cand if not a.failure_class) > 1]
    lost = []
    for a in atts:
        res = ledger.evidence.result(a.id)
        if (
            str(a.job_id) in runs
            and runs[str(a.job_id)][-1] == AttemptState.COMPLETED
            and (res is None or res["partial"])
        ):
            lost.append(a.job_id)
    wrong = wrong_nodes(ledger, sweep)  # each task's node as sacct lists it (issue 22 item 5)
    got = {"untracked": len(untracked), "duplicates": len(rerun) + len(twice), "lost": len(lost)}
    assert got == {"untracked": 0, "duplicates": 0, "lost": 0} and not wrong, (
        got,
        untracked,
        rerun,
        twice,
        lost,
        wrong,
    )
    return got


def _settled(runs: dict[str, list[str]]) -> dict[str, list[str]] | None:
    """sacct's answer once no listed job is live any more (accounting lags the end by a second or two)."""
    live = {s.split()[0] for s in AttemptState.LIVE}
    return runs if runs and not any(s[-1].split()[0] in live for s in runs.values()) else None


def ledger_rows(url: str) -> dict[str, list[tuple]]:
    """Every row of every ledger table, in primary-key order (the schema revision included): what "nothing
    written" compares, on SQLite and PostgreSQL alike."""
    from sqlalchemy import create_engine, select

    from orchestrator.ledger import models

    engine = create_engine(url)
    try:
        with engine.connect() as con:
            return {
                t.name: [tuple(r) for r in con.execute(select(t).order_by(*t.primary_key.columns))]
                for t in models.Base.metadata.sorted_tables
            } | {"alembic_version": [tuple(r) for r in con.exec_driver_sql("SELECT * FROM alembic_version")]}
    finally:
        engine.dispose()
