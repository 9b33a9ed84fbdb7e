"""A new user's first hour through the real CLI (issue 13): what a sweep says at its end, which sweep `best`
answers for, `cancel` of a finished sweep, and `status` while local jobs run (states and the lease)."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.commands.status import lease_line, lease_view
from orchestrator.core.paths import JobPaths
from orchestrator.core.spec import JobSpec
from orchestrator.core.states import SweepStatus
from orchestrator.ledger.leases import LeaseInfo, holder_alive, holder_id
from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import all_attempts, cli, ledger_url, running_sweep, sweep_args, wait_for

SMALL = ["stage.budget.max_runs=3", "policy.schedule.round0_size=3"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> tuple[Path, str, str]:
    """Two finished sweeps in one ledger: `older` (stage smoke), then `newer` (stage gpu1)."""
    tmp = tmp_path_factory.mktemp("first_hour")
    older = cli("sweep", *sweep_args(tmp, "older", *SMALL), "--plain")
    assert older.returncode == 0, older.stderr[-3000:]
    newer = cli("sweep", *sweep_args(tmp, "newer", stage="gpu1"), "--json")
    assert newer.returncode == 0, newer.stderr[-3000:]
    nxt = json.loads(newer.stdout[newer.stdout.index("\n{") :])["next"]  # --json carries the next steps too
    assert nxt["flags"].startswith("python -m orchestrator best --sweep newer --flags ledger.url=")
    assert nxt["report"].startswith("python -m orchestrator report newer ") and Path(nxt["job_folders"]).is_dir()
    return tmp, older.stdout, f"ledger.url={ledger_url(tmp)}"


@pytest.mark.long
def test_a_sweep_ends_with_the_best_layout_and_what_to_do_next(swept):
    tmp, out, _ = swept
    # a command line past 200 characters goes on with a shell continuation (` \`): read as the shell reads it
    tail = re.sub(r" \\\n +", " ", out[out.index("stopped:") :])
    best = re.search(r"^best layout \(measured, simulated\): (TP\d+ PP\d+ .+?)  step p50 [\d.]+ s$", tail, re.M)
    assert best, tail
    flags_cmd = re.search(r"^  its Megatron flags  (python -m orchestrator best --sweep older --flags .+)$", tail, re.M)
    assert flags_cmd and f"ledger.url={ledger_url(tmp)}" in flags_cmd[1], tail
    assert re.search(r"^  the report          python -m orchestrator report older ledger\.url=", tail, re.M), tail
    folders = re.search(r"^  job folders         (.+)/$", tail, re.M)
    assert folders and Path(folders[1]) == tmp / "runs" / "older" and Path(folders[1]).is_dir(), tail

    # The flags command runs as printed and gives the flags the best job ran with (its job.json).
    argv = shlex.split(flags_cmd[1])
    got = cli(*argv[3:])
    assert got.returncode == 0, got.stderr
    with Ledger.open(ledger_url(tmp)) as led:
        from orchestrator.ledger import queries

        hit = queries.best(led, sweep="older")
    assert hit is not None
    spec = JobSpec.load(JobPaths(Path(hit["attempt"]["job_dir"])).spec)
    printed = shlex.split(got.stdout.replace("\\\n", " "))
    assert printed == [*spec.argv, *spec.workload.extra_args] and "--expert-model-parallel-size" in printed


@pytest.mark.long
def test_best_defaults_to_the_most_recent_sweep_and_says_so(swept):
    tmp, _, url = swept
    got = cli("best", url)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["sweep"] == "newer"  # not the fastest step across every stage
    assert "best of sweep newer (stage gpu1; the most recently started sweep" in got.stderr
    # touching the older sweep (as a `resume` does) does not change which sweep answers: started, not touched
    import sqlalchemy as sa

    engine = sa.create_engine(ledger_url(tmp))
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE sweep SET updated_at = :t WHERE name = 'older'"), {"t": datetime(2100, 1, 1)})
    engine.dispose()
    got = cli("best", url)
    assert got.returncode == 0 and json.loads(got.stdout)["sweep"] == "newer", got.stderr
    got = cli("best", "--stage", "smoke", "--format", "json", url)
    assert got.returncode == 0 and json.loads(got.stdout)["sweep"] == "older", got.stderr
    assert "best of sweep older (stage smoke" in got.stderr
    got = cli("best", "--sweep", "older", "--format", "table", url)
    assert got.returncode == 0 and "best of sweep older (stage smoke)" in got.stdout, got.stderr
    assert "python -m orchestrator best --sweep older --flags" in got.stdout and "step p50 / p99" in got.stdout


@pytest.mark.long
def test_best_flags_train_is_the_training_run_and_plain_flags_says_it_measures(swept):
    """`best --flags --train`: the measured layout on conf/train/'s run (no mock data, a real tokenizer, the
    run's length, save/load, eval); plain `--flags` says on stderr that it is the measurement recipe."""
    _, _, url = swept
    plain = cli("best", "--sweep", "older", "--flags", url)
    assert plain.returncode == 0 and "# recipe: measurement" in plain.stderr, plain.stderr
    got = cli("best", "--sweep", "older", "--flags", "--train", url, "train.data_path=[/d/text]", "train.save=/ck")
    assert got.returncode == 0, got.stderr
    flags = shlex.split(got.stdout.replace("\\\n", " "))
    measured = shlex.split(plain.stdout.replace("\\\n", " "))
    assert "--mock-data" not in flags and "NullTokenizer" not in flags and "--mock-data" in measured
    assert flags[flags.index("--data-path") + 1] == "/d/text" and "--tokenizer-model" in flags
    assert flags[flags.index("--save") + 1] == flags[flags.index("--load") + 1] == "/ck"
    assert flags[flags.index("--train-iters") + 1] != measured[measured.index("--train-iters") + 1]
    assert int(flags[flags.index("--eval-iters") + 1]) > 0
    for knob in ("--tensor-model-parallel-size", "--expert-model-parallel-size", "--micro-batch-size"):
        assert flags[flags.index(knob) + 1] == measured[measured.index(knob) + 1]  # the winner's layout
    assert "# recipe: training run" in got.stderr and "train.tokenizer_model" in got.stderr  # the one left unset
    # the run's own LR schedule with warm-up and a seed, each value saying where it came from, on one line
    assert (flags[flags.index("--lr") + 1], flags[flags.index("--lr-warmup-iters") + 1]) == ("0.00022", "2000")
    assert (
        flags[flags.index("--seed") + 1] == "1234" and flags[flags.index("--tensorboard-dir") + 1] == "/ck/tensorboard"
    )
    assert measured[measured.index("--lr-warmup-iters") + 1] == "0"  # the measurement keeps the recipe's
    schedule = [line for line in got.stderr.splitlines() if line.startswith("# schedule: ")]
    assert len(schedule) == 1 and "lr 0.00022 (default: DeepSeek-V3 Technical Report" in schedule[0]
    assert "clip_grad 1.0 (performance recipe (workload.recipe))" in schedule[0]
    mine = cli("best", "--sweep", "older", "--flags", "--train", url, "train.lr=3e-4", "train.seed=7")
    assert (
        mine.returncode == 0
        and "lr 0.0003 (set: train.lr)" in mine.stderr
        and "seed 7 (set: train.seed)" in mine.stderr
    )
    short = cli("best", "--sweep", "older", "--flags", "--train", url, "train.train_iters=1000")
    assert short.returncode == 2 and short.stderr.startswith("error: train.lr_warmup_iters=2000 is not below"), (
        short.stderr
    )
    assert short.stdout == ""  # nothing half-written
    fix = "train.lr_warmup_iters=100"  # the fix the line names
    assert fix in short.stderr
    assert cli("best", "--sweep", "older", "--flags", "--train", url, "train.train_iters=1000", fix).returncode == 0
    wrong = cli("best", "--sweep", "older", "--train", url)
    assert wrong.returncode == 2 and wrong.stderr.startswith("error: --train goes with --flags"), wrong.stderr


@pytest.mark.long
def test_best_of_a_sweep_that_does_not_exist_lists_the_sweeps(swept):
    _, _, url = swept
    for args in (["--sweep", "nosuch"], ["--stage", "16k"]):
        got = cli("best", *args, url)
        lines = got.stderr.strip().splitlines()
        assert got.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), got.stderr
        assert "older" in lines[0] and "newer" in lines[0] and "measured result" not in lines[0], lines
    assert "no sweep named 'nosuch'" in cli("best", "--sweep", "nosuch", url).stderr


@pytest.mark.long
def test_cancel_of_a_finished_sweep_keeps_its_status(swept):
    tmp, _, url = swept
    got = cli("cancel", "older", url)
    assert got.returncode == 0 and "nothing to cancel" in got.stdout, (got.stdout, got.stderr)
    with Ledger.open(ledger_url(tmp)) as led:
        sweep = led.get_sweep("older")
        assert sweep is not None and sweep.status == SweepStatus.DONE
        assert not [e for e in led.events("older") if e.kind == "cancelled"]


@pytest.mark.long
def test_status_shows_local_jobs_running_while_the_round_goes_out_and_who_holds_the_lease(tmp_path):
    """6 jobs on 2 local slots: submit() waits for free slots, and the ledger must say `running` meanwhile
    (it said `queued 6 running 0` until the whole round had gone out)."""
    slow = ["policy.schedule.round0_size=6", "stage.budget.max_rounds=1", "cluster.local.max_workers=2"]
    slow += ["++workload.twin.time_scale=50", "++workload.twin.max_sleep_s=0.5"]  # after FAST_TWIN: wins
    args = sweep_args(tmp_path, "busy", *slow)
    url = f"ledger.url={ledger_url(tmp_path)}"
    with running_sweep(args, log=tmp_path / "sweep.log") as sweep:
        sweep.attempts(1, timeout=300)

        def running_while_submitting() -> str | None:
            out = cli("status", "busy", url).stdout
            with Ledger.open(ledger_url(tmp_path)) as led:  # read after status: launched attempts only grow
                launched = [a for a in all_attempts(led, "busy") if a.job_id]  # intents exist before submit
                submitting = len(launched) < len(led.candidates("busy"))
            m = re.search(r"queued (\d+)  running (\d+)", out)
            return out if m and int(m[2]) >= 1 and submitting else None

        out = wait_for(running_while_submitting, 300, "status showing a running job while the round goes out")
        holder = f"{socket.gethostname()}:{sweep.proc.pid}:"
        assert re.search(rf"lease: held by {re.escape(holder)}\d+ \(process alive\), expires \S+ UTC \(in \d+ s\)", out)
        assert sweep.wait(600) == 0, sweep.output()[-3000:]
    out = cli("status", "busy", url).stdout
    assert "lease: nobody drives this sweep (last: lease released by" in out, out


def test_lease_view_tells_a_dead_holder_from_a_live_one_and_another_host():
    """status reads orchestrator.ledger.leases' liveness: this process lives, a reaped child is gone, another host is
    unknowable."""
    t = datetime.now(UTC)
    info = dict(acquired_at=t, heartbeat_at=t, expires_at=t + timedelta(seconds=30), expired=False)
    here = socket.gethostname()
    me = holder_id()
    assert holder_alive(me) is True
    assert lease_view(LeaseInfo(holder=me, alive=holder_alive(me), **info), at=t)["alive"] is True
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    gone_holder = f"{here}:{dead}:0"
    gone = lease_view(LeaseInfo(holder=gone_holder, alive=holder_alive(gone_holder), **info), at=t)
    assert gone["alive"] is False and gone["expires_in_s"] == 30.0 and gone["pid"] == dead
    assert holder_alive("elsewhere.example:123:1") is None
    assert lease_line(gone, None).endswith("UTC (in 30 s)") and "takes over at once" in lease_line(gone, None)
    assert lease_view(None) is None


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


@pytest.mark.long
def test_best_gives_the_winners_evidence_bundle_beside_its_flags(swept):
    """`best --flags`: stdout is the flags alone (pipeable), stderr the bundle as `# ` lines; the JSON and the
    table carry it too. A twin sweep's versions are marked simulated; the env is what the ranks got."""
    _, _, url = swept
    got = cli("best", "--sweep", "older", "--flags", url)
    assert got.returncode == 0, got.stderr
    assert got.stdout.lstrip().startswith("--") and "# " not in got.stdout
    said = dict(line[2:].split(": ", 1) for line in got.stderr.splitlines() if line.startswith("# "))
    assert said["Megatron commit"].startswith("simulated") and said["NCCL"].startswith("simulated")
    assert "NCCL_IB_TIMEOUT=19" in said["NCCL/NVTE env"] and said["parity"].startswith("not run")
    assert {"container", "Transformer Engine", "DeepEP", "nodes"} <= set(said)
    doc = json.loads(cli("best", "--sweep", "older", "--format", "json", url).stdout)
    assert doc["bundle"]["versions"]["transformer_engine"] == "simulated" and doc["bundle"]["simulated"]
    table = cli("best", "--sweep", "older", "--format", "table", url)
    assert "Megatron commit" in table.stdout and "NCCL/NVTE env" in table.stdout


@pytest.mark.long
def test_the_console_command_runs_from_any_folder_with_its_own_name(tmp_path):
    """`dsv4-orchestrator` (pyproject's [project.scripts], installed by `make install`) is the CLI outside the
    checkout, where `python -m orchestrator` finds no module; its usage line carries the name it was called by."""
    import subprocess

    console = Path(sys.executable).parent / "dsv4-orchestrator"
    assert console.is_file(), f"{console} missing: `make install` (pip install -e .) installs it"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    helped = subprocess.run([console, "--help"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: dsv4-orchestrator"), helped.stdout[:300]
    planned = subprocess.run(
        [console, "plan", "+stage=smoke", "--top", "1", "--format", "json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert json.loads(planned.stdout)["stage"] == "smoke"
