"""SlurmLauncher on the real local cluster: arrays, one sacct per poll, scancel, TIMEOUT, array split.

`sbatch` and `sacct` are counted by shims on PATH that log each call and exec the real command: the
counters the launcher exposes must match what really ran (submitit must not poll on its own).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from datetime import UTC, datetime

import pytest

from orchestrator.core.paths import JobPaths
from orchestrator.core.schema import ClusterConfig, SlurmConfig
from orchestrator.launch import LaunchTask
from orchestrator.launch.auto import make_launcher
from orchestrator.launch.slurm import SlurmLauncher

# small 1-GPU tasks (at most a 2x2-GPU one): a shared lane, its module-scoped time-limit job kept across it
pytestmark = pytest.mark.slurm(shared=True)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def record(folder: str, value: int, sleep_s: float = 0.0) -> int:
    """Stands for the jobs side: every rank leaves a file, rank 0 writes result.json."""
    import submitit

    env = submitit.JobEnvironment()
    with open(os.path.join(folder, f"rank-{env.global_rank}.json"), "w") as fh:
        json.dump(
            {
                "rank": env.global_rank,
                "node": os.environ.get("SLURMD_NODENAME"),
                "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "ntasks": env.num_tasks,
                "env": os.environ.get("ORCH_TEST_ENV"),
            },
            fh,
        )
    time.sleep(sleep_s)
    if env.global_rank == 0:
        with open(os.path.join(folder, "result.json"), "w") as fh:
            json.dump({"value": value, "square": value * value}, fh)
    return value


@pytest.fixture
def counted(tmp_path, monkeypatch):
    """PATH shims that count real sbatch/sacct/scancel invocations."""
    shims = tmp_path / "shims"
    shims.mkdir()
    for name in ("sbatch", "sacct", "scancel"):
        real = shutil.which(name)
        path = shims / name
        path.write_text(f'#!/bin/sh\necho x >> "{shims}/{name}.calls"\nexec {real} "$@"\n')
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{shims}:{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", REPO)  # jobs unpickle these test functions by module name

    def calls(name: str) -> int:
        f = shims / f"{name}.calls"
        return len(f.read_text().splitlines()) if f.exists() else 0

    return calls


@pytest.fixture
def launchers():
    """SlurmLaunchers made by a test; whatever they submitted is cancelled when the test ends."""
    made = []

    def make(cfg: ClusterConfig) -> SlurmLauncher:
        made.append(SlurmLauncher(cfg))
        return made[-1]

    yield make
    for launcher in made:
        launcher.cancel(list(launcher._folders))


def cluster(max_array_size: int = 1000) -> ClusterConfig:
    slurm = SlurmConfig(array_parallelism=4, max_array_size=max_array_size)
    return ClusterConfig(
        kind="slurm", min_time_min=1, signal_delay_s=30, env={"ORCH_TEST_ENV": "from-cluster-env"}, slurm=slurm
    )


def task(folder, value, sleep_s=0.0, n_gpus=1, gpus_per_node=8, time_min=2, name="t") -> LaunchTask:
    os.makedirs(folder, exist_ok=True)
    return LaunchTask(
        fn=record,
        args=(str(folder), value, sleep_s),
        n_gpus=n_gpus,
        gpus_per_node=gpus_per_node,
        name=name,
        folder=str(folder),
        time_min=time_min,
    )


def poll_until(launcher, ids, done, timeout_s=240.0, counted=None):
    """Poll every 1 s; assert each poll costs exactly one sacct process."""
    deadline = time.monotonic() + timeout_s
    while True:
        before, real_before = launcher.sacct_calls, counted("sacct") if counted else 0
        states = launcher.poll(ids)
        assert launcher.sacct_calls == before + 1
        if counted:
            assert counted("sacct") == real_before + 1
        if done(states) or time.monotonic() > deadline:
            return states
        time.sleep(1.0)


@pytest.fixture(scope="module")
def timeout_job(slurm_cluster, tmp_path_factory):
    """Submitted first, checked last: a 2-minute job that sleeps 10 minutes. Slurm checks limits every 30 s, so
    with a 1-minute limit the USR2 warning (30 s before it) could land while the task is still starting up,
    before its handler exists, and kill it (FAILED): 2 minutes puts the warning at least 60 s in."""
    os.environ.setdefault("PYTHONPATH", REPO)
    folder = tmp_path_factory.mktemp("timeout") / "job"
    launcher = SlurmLauncher(cluster())
    [sub] = launcher.submit([task(folder, 1, sleep_s=600, time_min=2, name="timeout")])
    yield launcher, sub
    launcher.cancel([sub.job_id])


def test_auto_picks_slurm(slurm_cluster):
    launcher, reason = make_launcher(ClusterConfig(kind="auto"))
    assert launcher.kind == "slurm" and "sinfo lists 4 node(s)" in reason


def test_array_poll_cancel(slurm_cluster, timeout_job, tmp_path, counted, launchers):
    launcher = launchers(cluster())
    tasks = [task(tmp_path / "a", 2), task(tmp_path / "b", 3), task(tmp_path / "c", 4, sleep_s=600)]
    subs = launcher.submit(tasks)
    assert launcher.sbatch_calls == 1 == counted("sbatch")
    base = subs[0].job_id.split("_")[0]
    assert [s.job_id for s in subs] == [f"{base}_0", f"{base}_1", f"{base}_2"]
    assert [s.array_index for s in subs] == [0, 1, 2]
    assert [s.folder for s in subs] == [t.folder for t in tasks]
    ids = [s.job_id for s in subs]

    states = poll_until(
        launcher,
        ids,
        lambda st: st[ids[0]].terminal and st[ids[1]].terminal and st[ids[2]].state == "RUNNING",
        counted=counted,
    )
    for jid in ids[:2]:
        assert (states[jid].state, states[jid].exit_code, states[jid].terminal) == ("COMPLETED", 0, True)
        assert states[jid].node_list in {"n1", "n2", "n3", "n4"} and states[jid].end >= states[jid].start
    assert states[ids[2]].state == "RUNNING" and not states[ids[2]].terminal
    assert launcher.result(ids[0]) == {"value": 2, "square": 4}
    assert launcher.result(ids[1])["square"] == 9
    rank0 = json.loads((tmp_path / "a" / "rank-0.json").read_text())
    assert rank0["gpus"] in list("01234567") and rank0["env"] == "from-cluster-env"  # one GPU per task

    launcher.cancel([ids[2]])
    assert launcher.scancel_calls == 1 == counted("scancel")
    states = poll_until(launcher, ids, lambda st: st[ids[2]].terminal, timeout_s=60, counted=counted)
    assert (states[ids[2]].state, states[ids[2]].terminal) == ("CANCELLED", True)
    assert not (tmp_path / "c" / "result.json").exists()

    # Re-attach after a restart: a fresh launcher knows only the stored ids and folders.
    fresh = SlurmLauncher(cluster())
    again = fresh.poll(ids)
    assert fresh.sacct_calls == 1
    assert [again[j].state for j in ids] == ["COMPLETED", "COMPLETED", "CANCELLED"]
    fresh.attach(subs)
    assert fresh.result(ids[0])["value"] == 2
    assert counted("sbatch") == 1  # nothing was submitted twice


def test_an_array_task_started_before_submitit_placed_its_files_runs(slurm_cluster, tmp_path, monkeypatch, launchers):
    """submitit moves an array's pickles into place only after sbatch returns, and Slurm does not create a log's
    folder: a task Slurm starts in that gap must find its log folder and wait for its pickle. submitit's move is
    held here until Slurm has started the first task (sacct: past PENDING), then let go; every task must run."""
    import submitit.core.utils as submitit_utils

    launcher = launchers(cluster())
    move = submitit_utils.JobPaths.move_temporary_file
    started: list[str] = []

    def move_once_started(paths, tmp, name, keep_as_symlink=False):
        jid = f"{str(paths.job_id).split('_')[0]}_0"  # the first move is the array's sbatch script (no index)
        deadline = time.monotonic() + 240  # a guard only: the loop ends on Slurm's answer
        while not started and time.monotonic() < deadline:
            state = launcher.poll([jid])[jid].state
            if state not in ("PENDING", "UNKNOWN"):
                started.append(state)
            time.sleep(0.5)
        return move(paths, tmp, name, keep_as_symlink)

    monkeypatch.setattr(submitit_utils.JobPaths, "move_temporary_file", move_once_started)
    subs = launcher.submit([task(tmp_path / "a", 5), task(tmp_path / "b", 6)])
    assert started == ["RUNNING"]  # the first task ran before its pickle was in place (not FAILED on its log)
    ids = [s.job_id for s in subs]
    states = poll_until(launcher, ids, lambda st: all(s.terminal for s in st.values()))
    assert [states[j].state for j in ids] == ["COMPLETED", "COMPLETED"]
    assert [launcher.result(j)["value"] for j in ids] == [5, 6]


def test_multi_node_task_and_array_split(slurm_cluster, tmp_path, counted, launchers):
    """max_array_size=2: 5 same-shape tasks go out as 3 sbatch calls (2 + 2 + 1); a 2-node x 2-GPU task
    has its own shape, so its own sbatch."""
    launcher = launchers(cluster(max_array_size=2))
    small = [task(tmp_path / f"s{i}", i) for i in range(5)]
    wide = task(tmp_path / "wide", 10, n_gpus=4, gpus_per_node=2)
    seen = {}
    subs = launcher.submit(small + [wide], on_submitted=lambda pairs: seen.update((i, s.job_id) for i, s in pairs))
    assert launcher.sbatch_calls == 4 == counted("sbatch")
    assert seen == {i: s.job_id for i, s in enumerate(subs)}
    bases = [s.job_id.split("_")[0] for s in subs[:5]]
    assert bases[0] == bases[1] != bases[2] == bases[3] != bases[4]
    assert [s.array_index for s in subs[:5]] == [0, 1, 0, 1, None]
    ids = [s.job_id for s in subs]
    states = poll_until(launcher, ids, lambda st: all(s.terminal for s in st.values()), counted=counted)
    assert {s.state for s in states.values()} == {"COMPLETED"}
    assert [launcher.result(s.job_id)["value"] for s in subs] == [0, 1, 2, 3, 4, 10]
    ranks = sorted(json.loads((tmp_path / "wide" / f"rank-{r}.json").read_text())["node"] for r in range(4))
    assert len(ranks) == 4 and ranks[0] == ranks[1] != ranks[2] == ranks[3]
    assert json.loads((tmp_path / "wide" / "rank-3.json").read_text())["gpus"] == "0,1"
    assert states[subs[5].job_id].node_list.startswith("n")


def test_time_limit_gives_timeout(slurm_cluster, timeout_job):
    launcher, sub = timeout_job
    states = poll_until(launcher, [sub.job_id], lambda st: st[sub.job_id].terminal, timeout_s=300)
    st = states[sub.job_id]
    assert (st.state, st.terminal) == ("TIMEOUT", True)
    assert (st.end - st.start).total_seconds() >= 120
    # submitit's warning signal (USR2, 30 s before the limit) was recorded, not turned into a FAILED job.
    assert JobPaths(sub.folder).time_limit_mark(0).exists()
    assert not JobPaths(sub.folder).result.exists()


def test_a_failed_record_cancels_that_whole_array_and_find_sees_the_rest(tmp_path, counted, launchers):
    """Issue 10 fault 3: the caller cannot record array 2 -> every task of array 2 is cancelled in one scancel
    at once; array 1, recorded, runs on; `find` answers by launch token (the job name) in one query."""
    from datetime import UTC, datetime

    from orchestrator.core.states import AttemptState

    launcher = launchers(cluster(max_array_size=2))
    tasks = [task(tmp_path / f"t{i}", i, sleep_s=120, time_min=5) for i in range(4)]
    tok = [f"intents-{tmp_path.name[-8:]}.{k}" for k in ("a", "b")]
    for i, t in enumerate(tasks):
        t.token = tok[i // 2]
    assert launcher.arrays(tasks) == [[0, 1], [2, 3]]
    since, calls = datetime.now(UTC), []

    def record(pairs):
        calls.append([i for i, _ in pairs])
        if len(calls) == 2:
            raise RuntimeError("ledger locked")

    with pytest.raises(RuntimeError, match="ledger locked"):
        launcher.submit(tasks, on_submitted=record)
    assert calls == [[0, 1], [2, 3]] and counted("scancel") == 1
    # the folders of the cancelled array say so before the scancel: however a task ends, no verdict (resume)
    assert [JobPaths(t.folder).aborted.exists() for t in tasks] == [False, False, True, True]
    ids = list(launcher._folders)
    assert len(ids) == 4
    states = poll_until(launcher, ids, lambda st: all(st[j].state == AttemptState.CANCELLED for j in ids[2:]))
    assert all(states[j].state == AttemptState.CANCELLED for j in ids[2:]), states
    assert not any(states[j].terminal for j in ids[:2]), states  # recorded: left running
    found = launcher.find([(tok[0], 0, ""), (tok[0], 1, ""), (tok[1], 0, ""), (tok[1], 1, "")], since)
    assert {k: f.job_id for k, f in found.items() if k[0] == tok[0]} == {(tok[0], 0): ids[0], (tok[0], 1): ids[1]}
    assert all(f.state == AttemptState.CANCELLED for k, f in found.items() if k[0] == tok[1])


def test_a_task_with_a_launch_token_leaves_its_own_start_and_exit_markers(slurm_cluster, tmp_path, counted, launchers):
    """Every task of a sweep's launch (a token) writes job-started.json and job-exit.json naming the token and
    its job id, on Slurm as locally: what `ledger ingest` trusts a folder by when the ledger lost its rows."""
    from orchestrator.core.states import AttemptState

    launcher = launchers(cluster())
    t = task(tmp_path / "job", 3)
    t.token = f"markers-{tmp_path.name[-8:]}.a"
    [sub] = launcher.submit([t])
    states = poll_until(launcher, [sub.job_id], lambda st: st[sub.job_id].terminal)
    assert states[sub.job_id].state == AttemptState.COMPLETED, states
    paths = JobPaths(tmp_path / "job")
    started, exited = json.loads(paths.started.read_text()), json.loads(paths.exited.read_text())
    assert started["token"] == exited["token"] == t.token and exited["outcome"] == "ok"
    assert exited["job_id"] == sub.job_id


def probe_rank(spec_path: str) -> int:
    """Stands for a rank probe's task: the rank the job's entry gives this one-GPU task, left in its folder."""
    from orchestrator.core.spec import JobSpec
    from orchestrator.job import entry

    spec = JobSpec.load(spec_path)
    [renv] = entry.rank_envs(spec)
    with open(os.path.join(spec.job_dir, f"probe-rank-{renv.rank}.json"), "w") as fh:
        json.dump(
            {
                "rank": renv.rank,
                "world": renv.world_size,
                "local": renv.local_rank,
                "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "ntasks": os.environ.get("SLURM_NTASKS"),
                "array_task": os.environ.get("SLURM_ARRAY_TASK_ID"),
            },
            fh,
        )
    return renv.rank


def test_a_rounds_rank_probes_are_one_array_of_one_gpu_tasks_each_its_own_rank(
    slurm_cluster, smoke, tmp_path, counted, launchers
):
    """Two probes of 2-3 ranks each: ONE sbatch, an array of one-GPU tasks (one task per rank, each with one
    GPU), each task running its own RANK of WORLD_SIZE = N with LOCAL_RANK 0; each probe is one attempt whose
    id names its tasks ("123_[0-2]"), polled and finished as one."""
    from orchestrator.core.states import Fidelity
    from orchestrator.plan import ranks
    from orchestrator.runspec import build_spec, launch_task

    cfg, cands = smoke
    layouts = [c for c in cands if c.layout.pp > 1][:2]
    assert len(layouts) == 2
    tasks, bounds = [], []
    for i, planned in enumerate(layouts):
        bound = ranks.probe_ranks(planned.layout, cfg.stage.gpus, planned.prediction.heaviest_stage)
        spec = build_spec(
            cfg,
            planned,
            sweep="p",
            attempt=1,
            job_dir=tmp_path / f"probe{i}",
            fidelity=Fidelity.PROBE,
            probe_ranks=bound,
        )
        os.makedirs(spec.job_dir)
        spec.save(JobPaths(spec.job_dir).spec)
        t = launch_task(cfg, spec)
        t.fn, t.args = probe_rank, (str(JobPaths(spec.job_dir).spec),)
        tasks.append(t)
        bounds.append(bound)
    assert all(len(b) >= 2 for b in bounds)
    launcher = launchers(cluster())
    assert launcher.arrays(tasks) == [[0, 1]]  # one array for the round's probes
    token = f"probes.{os.getpid()}"
    for t in tasks:
        t.token = token
    since = datetime.now(UTC)
    subs = launcher.submit(tasks)
    assert launcher.sbatch_calls == 1 == counted("sbatch")
    base = subs[0].job_id.split("_")[0]
    assert subs[0].job_id == f"{base}_[0-{len(bounds[0]) - 1}]" and subs[0].array_index == 0
    assert subs[1].job_id == f"{base}_[{len(bounds[0])}-{len(bounds[0]) + len(bounds[1]) - 1}]"
    # adopted on resume by its launch intent: each probe as all of its tasks (up to the next intent's index)
    intents = [(token, s.array_index, s.folder) for s in subs]
    found = launcher.find(intents, since)
    assert [found[(token, s.array_index)].job_id for s in subs] == [s.job_id for s in subs]
    states = poll_until(launcher, [s.job_id for s in subs], lambda st: all(s.terminal for s in st.values()))
    assert {s.state for s in states.values()} == {"COMPLETED"}
    for sub, bound in zip(subs, bounds):
        seen = [json.loads((tmp_path / sub.folder / f"probe-rank-{r}.json").read_text()) for r in bound]
        assert [(x["rank"], x["world"], x["local"], x["ntasks"]) for x in seen] == [
            (r, cfg.stage.gpus, 0, "1") for r in bound
        ]
        assert all(x["gpus"] is not None and "," not in x["gpus"] for x in seen)  # one GPU each
    tasks_run = sorted(
        int(x["array_task"])
        for s, b in zip(subs, bounds)
        for x in (json.loads((tmp_path / s.folder / f"probe-rank-{r}.json").read_text()) for r in b)
    )
    assert tasks_run == list(range(sum(map(len, bounds))))  # every array task ran one rank
