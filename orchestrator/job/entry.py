"""The function submitit runs on each task: set the rank env, run the workload, keep its output.

Why a subprocess: the workload is whatever `workload.command` names (Megatron's pretrain_hybrid.py in
the container, the twin, or a user's script), so the job only promises the contract: torchrun-style
rank env + the candidate's Megatron flags, stdout/stderr kept per evidence rank (the other ranks' in
their node's log, orchestrator.job.ranklog). A non-zero exit is raised after the files are written, so submitit marks
the task failed and Slurm records FAILED.

Imports stay light (stdlib; submitit lazily) because this runs inside the cluster's container.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from orchestrator.core.paths import JobPaths
from orchestrator.core.spec import ALONE_INDEX_ENV, JobSpec
from orchestrator.job.ranklog import RankOutput

# Slurm's stop (time limit, scancel) and Ctrl-C reach the workload. USR2 is not forwarded: it is
# submitit's early time-limit warning, which orchestrator.launch only records so Slurm's verdict stays TIMEOUT.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Slurm sends that warning to EVERY process of the step, the workload included, whose default action
# for USR2 is to die (exit 140, a FAILED job instead of TIMEOUT). The workload starts with it ignored
# (SIG_IGN survives exec); a workload that wants it (Megatron --exit-signal SIGUSR2) installs its handler.
IGNORED_IN_WORKLOAD = (signal.SIGUSR2,)
PROJECT_ROOT = Path(__file__).resolve().parent.parent


class TaskFailed(RuntimeError):
    """A rank's workload exited non-zero (or was killed by a signal): `returncode` (negative: the signal),
    which the job's exit marker records (orchestrator/launch/task.py; `ledger ingest` reads it)."""

    returncode: int | None = None


@dataclass
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    single_process: bool  # local executor: one process stands for the whole job

    def as_env(self) -> dict[str, str]:
        env = {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }
        if self.single_process:
            env["ORCH_SINGLE_PROCESS"] = "1"
        return env


@dataclass
class TaskOutcome:
    rank: int
    returncode: int
    stdout: str
    stderr: str
    job_dir: str
    single_process: bool


def master_port(spec: JobSpec, job_id: str | None) -> int:
    """The rendezvous port of this job: master_port + job id % master_port_span, so jobs that share a node
    (or a job started while an earlier one's port lingers in TIME_WAIT) do not collide on one fixed port.
    An array task has its own SLURM_JOB_ID; the local executor's job id is its pid."""
    digits = "".join(c for c in str(job_id or "") if c.isdigit())
    span = max(1, int(spec.master_port_span))
    return int(spec.master_port) + (int(digits) % span if digits else 0)


def rank_env(spec: JobSpec, job_env=None) -> RankEnv:
    """torchrun-equivalent rank variables.

    Under Slurm submitit's JobEnvironment gives one task per GPU; MASTER_ADDR is the first hostname.
    Anywhere else (submitit's local executor, or called directly) one process stands for the job:
    WORLD_SIZE = N and RANK = N - 1, the rank that prints Megatron's iteration lines.
    MASTER_PORT follows the job id (`master_port`).
    """
    if job_env is None:
        job_env = _submitit_env()
    if spec.probe_ranks:  # a rank probe: this task's one GPU runs one rank of the N-GPU job (--fake-process-group)
        return rank_envs(spec, job_env)[0]
    port = master_port(spec, _job_id(job_env))
    if job_env is not None and job_env.cluster == "slurm":
        hosts = list(job_env.hostnames) or [job_env.hostname]
        return RankEnv(
            rank=job_env.global_rank,
            world_size=job_env.num_tasks,
            local_rank=job_env.local_rank,
            master_addr=hosts[0],
            master_port=port,
            single_process=False,
        )
    n = max(1, int(spec.n_gpus))
    return RankEnv(
        rank=n - 1,
        world_size=n,
        local_rank=0,
        master_addr="127.0.0.1",
        master_port=port,
        single_process=True,
    )


def rank_envs(spec: JobSpec, job_env=None) -> list[RankEnv]:
    """The processes this task runs, one after another. One, except a rank probe (spec.probe_ranks) off Slurm:
    there one process per probed rank, each alone. A rank probe's process is rank RANK of WORLD_SIZE = N on
    its own GPU (LOCAL_RANK = the task's); a task the launcher started alone (ALONE_INDEX_ENV = i: one Slurm array
    task of one GPU) probes spec.probe_ranks[i] with LOCAL_RANK 0; else task i of the job probes spec.probe_ranks[i]."""
    if not spec.probe_ranks:
        return [rank_env(spec, job_env)]
    if job_env is None:
        job_env = _submitit_env()
    port = master_port(spec, _job_id(job_env))
    world = max(1, int(spec.n_gpus))

    def probe(rank: int, local: int) -> RankEnv:
        return RankEnv(rank, world, local, "127.0.0.1", port, single_process=False)

    alone = os.environ.get(ALONE_INDEX_ENV)
    if alone is not None and alone.isdigit():  # one array task of its own (the launcher's LaunchTask.alone)
        return [probe(spec.probe_ranks[min(int(alone), len(spec.probe_ranks) - 1)], 0)]
    if job_env is not None and job_env.cluster == "slurm":
        i = min(int(job_env.global_rank), len(spec.probe_ranks) - 1)
        return [probe(spec.probe_ranks[i], int(job_env.local_rank))]
    return [probe(r, 0) for r in spec.probe_ranks]


def _job_id(job_env) -> str | None:
    """SLURM_JOB_ID of this task (unique per array task), else the submitit job id, else None."""
    if os.environ.get("SLURM_JOB_ID"):
        return os.environ["SLURM_JOB_ID"]
    return str(getattr(job_env, "job_id", "") or "") or None


def _submitit_env():
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    try:
        import submitit

        return submitit.JobEnvironment()
    except Exception:  # noqa: BLE001 - not inside a submitit job
        return None


def task_env(spec: JobSpec, renv: RankEnv, job_dir: Path) -> dict[str, str]:
    """os.environ + cluster.env/workload.env (spec.env) + rank env + ORCH_* pointers."""
    env = dict(os.environ)
    env.update({k: str(v) for k, v in spec.env.items()})
    env.update({k: str(v) for k, v in spec.workload.env.items()})  # workload.env wins over cluster.env
    env.update(renv.as_env())
    if not renv.single_process:
        env.pop("ORCH_SINGLE_PROCESS", None)
    env["ORCH_JOB_DIR"] = str(job_dir)
    env["ORCH_JOB_SPEC"] = str(JobPaths(job_dir).spec)
    # `python -m orchestrator.job.twin` must import this project wherever the job's cwd is.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def resolve_command(spec: JobSpec) -> list:
    """workload.command + flags + extra_args; a bare `python` means the interpreter running this job
    (the container's Python under Slurm, the orchestrator's venv locally)."""
    cmd = spec.command
    if cmd and cmd[0] in ("python", "python3"):
        cmd[0] = sys.executable
    return cmd


def is_evidence_rank(spec: JobSpec, renv: RankEnv) -> bool:
    """Does this rank keep files of its own (orchestrator.plan.ranks.evidence_ranks)? The one process of a
    local job speaks for the whole job, so it does; so does every rank of a layout N does not divide."""
    if renv.single_process or spec.probe_ranks:
        return True
    from orchestrator.plan import ranks

    try:
        return renv.rank in ranks.evidence_ranks(spec.knobs, renv.world_size)
    except (TypeError, ValueError):
        return True


def entry_script(command: Sequence[str]) -> str:
    """The script an in-process workload runs: the last `.py` of workload.command (else its last word)."""
    return next((c for c in reversed(command) if c.endswith(".py")), command[-1])


def command_problem(command: Sequence[str], *, in_process: bool = False) -> str | None:
    """Why workload.command cannot start on this machine, or None: checked before a sweep writes anything,
    since a command that cannot start fails every job alike. A bare `python` is this interpreter
    (`resolve_command`); a relative path would be looked up in the job's own folder, where nothing is."""
    if not command:
        return (
            "workload.command is empty: name the program to run, e.g. "
            "workload.command=[python,-m,orchestrator.job.twin]"
        )
    if in_process:
        entry = entry_script(command)
        if not os.path.isfile(entry):
            return f"workload.command's entry script {entry} does not exist (workload.in_process runs it here)"
        return None
    exe = command[0]
    script = _interpreted_script(command)
    if script is not None and not os.path.isabs(script):
        return (
            f"workload.command's script {script} is a relative path (jobs run in their own folder, where it is not): "
            f"make it absolute, e.g. workload.command=[{exe},{os.path.abspath(script)}]"
        )
    if script is not None and not os.path.isfile(script):
        return f"workload.command's script {script} does not exist"
    if exe in ("python", "python3"):
        return None
    if os.sep not in exe:
        if shutil.which(exe) is None:
            return f"workload.command's program {exe!r} is not on PATH: give its absolute path"
        return None
    if not os.path.isabs(exe):
        return f"workload.command's program {exe} is a relative path (jobs run in their own folder): make it absolute"
    if not os.path.isfile(exe):
        return f"workload.command's program {exe} does not exist"
    if not os.access(exe, os.X_OK):
        return f"workload.command's program {exe} is not executable: chmod +x it, or run it as [bash,{exe}]"
    return None


INTERPRETERS = ("python", "python3", "bash", "sh")
_TAKES_A_VALUE = ("-W", "-X", "-o", "-O")  # an interpreter option whose value is the next word, not a script


def _interpreted_script(command: Sequence[str]) -> str | None:
    """The script an interpreter in workload.command runs (`python x.py`, `bash x.sh`: its first word that is
    not an option), or None: no interpreter, or a module or code string (`-m`, `-c`) instead of a script."""
    if os.path.basename(command[0]) not in INTERPRETERS:
        return None
    words = iter(command[1:])
    for word in words:
        if word.startswith("-") and word[1:].isalpha() and word[-1] in "cm":  # -c, -m, and grouped: -lc, -um
            return None
        if word in _TAKES_A_VALUE:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def run_task(spec: JobSpec | str | os.PathLike) -> dict:
    """Run this rank's workload; return TaskOutcome as a dict, or raise TaskFailed on non-zero exit.
    An evidence rank writes rank-<r>.out/.err, the others their node's shared log (orchestrator.job.ranklog)."""
    if not isinstance(spec, JobSpec):
        spec = JobSpec.load(spec)
    paths = JobPaths(spec.job_dir)
    job_dir = paths.folder
    job_dir.mkdir(parents=True, exist_ok=True)
    if not paths.spec.exists():
        spec.save(paths.spec)
    code = 0
    for renv in rank_envs(spec):  # one process; a rank probe off Slurm: each probed rank in turn
        env = task_env(spec, renv, job_dir)
        evidence = is_evidence_rank(spec, renv)
        with RankOutput(paths, renv.rank, evidence) as output:
            if spec.workload.in_process:
                code = _run_in_process(spec, renv, env, output)
            else:
                code = _run_subprocess(resolve_command(spec), env, job_dir, output)
        if code != 0:
            break
    outcome = TaskOutcome(
        rank=renv.rank,
        returncode=code,
        stdout=str(paths.stdout(renv.rank) if evidence else output.where),
        stderr=str(output.where),
        job_dir=str(job_dir),
        single_process=renv.single_process,
    )
    if code != 0:
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        failed = TaskFailed(f"rank {renv.rank} {how}; see {output.where}")
        failed.returncode = code
        raise failed
    return asdict(outcome)


def _run_subprocess(cmd: list, env: dict, cwd: Path, output: RankOutput) -> int:
    """Popen with output to the rank's files (or its node log); SIGTERM/SIGINT sent to this task are
    forwarded to the workload (then to the previous handler, so submitit's own handling still runs)."""
    out, err = output.out, output.err
    try:
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=str(cwd),
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            preexec_fn=_ignore_warning_signal,
        )
    except OSError as exc:  # command not found: record it where collect will look
        err.write(f"failed to start workload {cmd[:3]}: {exc}\n".encode())
        return 127
    previous: dict[int, Callable[[int, FrameType | None], Any] | int | signal.Handlers | None] = {}

    def forward(signum: int, frame: FrameType | None) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)
        prev = previous.get(signum)
        if callable(prev) and prev not in (signal.default_int_handler,):
            prev(signum, frame)

    in_main = _in_main_thread()
    if in_main:
        for sig in FORWARDED_SIGNALS:
            previous[sig] = signal.signal(sig, forward)
    try:
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if in_main:
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _ignore_warning_signal() -> None:
    """In the forked child, before exec: ignore Slurm's time-limit warning (see IGNORED_IN_WORKLOAD)."""
    for sig in IGNORED_IN_WORKLOAD:
        signal.signal(sig, signal.SIG_IGN)


def _run_in_process(spec: JobSpec, renv: RankEnv, env: dict, output: RankOutput) -> int:
    """Real Megatron, instrumented: runpy the entry script here with the router hook (orchestrator.job.megatron_run).
    fd 1/2 are redirected so native (NCCL, CUDA) output lands in the rank files (or node log) too.
    A rank that is not an evidence rank leaves its sidecar in a scratch folder that is then removed."""
    import tempfile

    from orchestrator.job import megatron_run  # imports torch/megatron: only on this path

    entry = entry_script(spec.workload.command)
    argv = list(spec.argv) + list(spec.workload.extra_args)
    window = spec.window  # the attempt's own (a screen, a probe, a finalist's), not the stage's
    saved_env = dict(os.environ)
    os.environ.update(env)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    saved_streams = sys.stdout, sys.stderr
    scratch = None if output.evidence else tempfile.TemporaryDirectory(prefix="orch-sidecar-")
    sidecar_dir = Path(spec.job_dir if scratch is None else scratch.name)
    try:
        os.dup2(output.out.fileno(), 1)
        os.dup2(output.err.fileno(), 2)
        # Python-level streams may not be fd 1/2 (a test runner's capture): point them at the files too.
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the task
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the task
        try:
            code = megatron_run.main(entry, argv, window, sidecar_dir, renv.rank)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - the traceback goes to the rank's .err for classify
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
                if stream not in saved_streams:
                    stream.close()  # closefd=False: fds 1/2 stay open
            sys.stdout, sys.stderr = saved_streams
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            os.environ.clear()
            os.environ.update(saved_env)
    finally:
        if scratch is not None:
            scratch.cleanup()
    return int(code or 0)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def main(argv: list | None = None) -> int:
    """`python -m orchestrator.job.entry <job.json>`: run one task by hand (debugging a job folder)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m orchestrator.job.entry <job_dir>/{JobPaths.SPEC}", file=sys.stderr)
        return 2
    try:
        run_task(args[0])
    except TaskFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
