"""Every suggested fix is a command that then succeeds (issue 49 item 5): each user-facing error reachable here
(no Slurm, PostgreSQL or GPU: a partition is a stand-in read) is triggered through the real CLI in-process, the fix
it names is taken from its one `error:` line and run, and the fixed command must exit 0. The fix runs as `plan`, a
`--dry-run` or a read of a finished sweep where a real sweep would be slow; the partition's fix also runs up to the
sweep's first submission, past the partition check that refused the stage."""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.cli import main
from tests.sweeplib import FAST_TWIN

PREFIX = "python -m orchestrator "
SMALL = ["stage.budget.max_runs=2", "policy.schedule.round0_size=2", "stage.budget.max_rounds=1"]


def error_line(capsys, *argv: str) -> str:
    """The one `error:` line of a command that must exit 2."""
    capsys.readouterr()
    rc = main(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err and err[-1].startswith("error: "), (rc, err[-5:])
    return err[-1]


def succeeds(capsys, *argv: str) -> None:
    capsys.readouterr()
    rc = main(list(argv))
    assert rc == 0, (argv, capsys.readouterr().err[-2000:])


def commands(line: str) -> list[list[str]]:
    """Every backquoted `python -m orchestrator ...` of an error line, as argv."""
    return [shlex.split(c[len(PREFIX) :]) for c in re.findall(r"`([^`]+)`", line) if c.startswith(PREFIX)]


def replaced(args: list[str], fix: str) -> list[str]:
    """`args` with the override of the fix's key (or of the fix's group, `+stage=` for `stage=`) replaced by it."""
    key = fix.lstrip("+~").split("=", 1)[0]
    return [fix if a.lstrip("+~").split("=", 1)[0] == key else a for a in args]


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    """An empty working folder: the default ledger (./ledger.sqlite) and job folders (./runs) land in it, so a
    suggested command runs as the user would run it there, with no override added."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ------------------------------------------------------------------------------- config errors: an override
@pytest.mark.long
@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["+stage=1K"], r"did you mean (\S+)\?"),  # a group option in another case
        (["+stage=smoke", "hardware=h300"], r"did you mean (\S+)\?"),  # a group option mistyped
        (["+stage=custom", "stage.gpus=1001"], r"(?:use|or) (stage\.gpus=\d+)"),  # not a multiple of a node's GPUs
        (["+stage=smoke", "stage.gpus=33"], r"(?:use|or) (stage\.gpus=\d+)"),
        (["+stage=smoke", "stage.screen.cut_warmup_iters=50"], r"e\.g\. (\S+)$"),
        (["+stage=smoke", "workload.probe_mode=x"], r"(?:one of|,) (workload\.probe_mode=[^,\s]+)"),
        (["+stage=smoke", "cluster.env.FOO=1"], r"write (\S+) "),
    ],
)
def test_an_override_a_config_error_suggests_then_plans(capsys, here, args, pattern):
    line = error_line(capsys, "plan", *args)
    fixes = re.findall(pattern, line)
    assert fixes, line
    for fix in fixes:  # each alternative it offers
        succeeds(capsys, "plan", *replaced(args, fix), "--top", "1")


@pytest.mark.long
def test_a_mistyped_key_is_told_the_key_that_then_plans(capsys, here):
    line = error_line(capsys, "plan", "+stage=smoke", "stage.budget.max_run=3")
    [key] = re.findall(r"did you mean '([^']+)'\?", line)
    succeeds(capsys, "plan", "+stage=smoke", f"{key}=3", "--top", "1")


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "+stage=custom"],  # no size: an example size
        ["plan", "+stage=custom", "stage.gpus=-8"],  # was "leave stage.gpus out" to a stage with none
        ["plan", "+stage=1k", "stage.gpus=-8"],
        ["plan", "+stage=custom", "hardware=gb200"],  # 4 GPUs a node: the example is the planner's, not 64 nodes
    ],
)
@pytest.mark.long
def test_a_stage_size_error_names_a_stage_that_then_plans(capsys, here, args):
    line = error_line(capsys, *args)
    fixes = [f.split() for f in re.findall(r"`(\+stage=[^`]+)`", line)]
    assert fixes, line
    keep = [a for a in args[1:] if not a.lstrip("+").startswith(("stage=", "stage."))]
    for fix in fixes:
        succeeds(capsys, "plan", *fix, *keep, "--top", "1")


@pytest.mark.long
def test_a_sweep_without_a_stage_names_a_sweep_that_then_prices(capsys, here):
    line = error_line(capsys, "sweep", "cluster=local", "--plain")
    [fix] = commands(line)
    succeeds(capsys, *fix, "stage.budget.price_samples=0", "--dry-run")


def test_an_in_memory_ledger_names_a_file_that_then_opens(capsys, here):
    line = error_line(capsys, "db", "upgrade", "ledger.url=sqlite://")
    [fix] = re.findall(r"(ledger\.url=\S+)$", line)
    succeeds(capsys, "db", "upgrade", fix)
    assert (here / "ledger.sqlite").is_file()


@pytest.mark.long
def test_a_missing_ledger_names_the_command_that_makes_one(capsys, here):
    line = error_line(capsys, "status")
    [fix] = commands(line)
    succeeds(capsys, *fix)
    succeeds(capsys, "status")


# ------------------------------------------------------------------------------- a finished sweep's commands
@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Iterator[Path]:
    """One finished twin sweep (`smk`) in ./ledger.sqlite of its own folder."""
    tmp = tmp_path_factory.mktemp("fixes")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        assert main(["sweep", "+stage=smoke", "cluster=local", "sweep.name=smk", *FAST_TWIN, *SMALL, "--plain"]) == 0
    yield tmp


@pytest.fixture
def in_swept(swept, monkeypatch) -> Path:
    monkeypatch.chdir(swept)
    return swept


@pytest.mark.parametrize(
    "args",
    [["best", "--train"], ["export"]],
)
@pytest.mark.long
def test_a_command_missing_a_flag_names_the_command_that_then_succeeds(capsys, in_swept, args, tmp_path):
    if args[0] == "export":
        pytest.importorskip("mlflow")
    line = error_line(capsys, *args)
    fixes = commands(line)
    assert fixes, line
    for fix in fixes:
        succeeds(capsys, *fix)


@pytest.mark.parametrize(
    ("wrong", "right"),
    [
        (["status", "nosuch"], ["status", "smk"]),
        (["resume", "nosuch", "--plain"], ["resume", "smk", "--plain"]),
        (["cancel", "nosuch"], ["cancel", "smk"]),
        (["report", "nosuch"], ["report", "smk"]),
        (["best", "--sweep", "nosuch"], ["best", "--sweep", "smk"]),
    ],
)
@pytest.mark.long
def test_an_unknown_sweep_name_lists_the_known_ones_that_then_answer(capsys, in_swept, wrong, right):
    line = error_line(capsys, *wrong)
    assert re.search(r"(known|sweeps): smk\b", line), line
    succeeds(capsys, *right)


# ------------------------------------------------------------------------------- a partition too small
@pytest.fixture
def small_partition(monkeypatch) -> Callable[[], list[int]]:
    """Slurm "answers" and its partition is 4 nodes x 8 GPUs (a stand-in read, nothing reaches a cluster); a
    submission is recorded and stopped there (`Submitted`), so a sweep that gets past the partition check ends."""
    from orchestrator.launch import auto, registry
    from orchestrator.launch.slurm import partition
    from orchestrator.launch.slurm.launcher import SlurmLauncher

    auto.load()
    part = partition.Partition("debug", 4, 4, 64, 8, 240, None, "UP")
    monkeypatch.setattr(partition, "read", lambda name: part)
    monkeypatch.setitem(
        registry.BACKENDS, "slurm", dataclasses.replace(auto.backend("slurm"), probe=lambda: (True, "stand-in"))
    )
    submitted: list[int] = []

    def submit(self, tasks, on_submitted=None):
        self.check_fits(tasks)
        submitted.append(len(tasks))
        raise Submitted

    monkeypatch.setattr(SlurmLauncher, "submit", submit)
    return lambda: submitted


class Submitted(Exception):
    """The stand-in partition took a submission: the partition check passed."""


@pytest.mark.long
def test_a_stage_bigger_than_the_partition_names_a_sweep_that_runs_there(capsys, here, small_partition):
    """The issue's case: a 1k sweep on a 4-node partition was told `stage.gpus=32`, at which 1k has no legal
    layout; the fix named now plans (its dry run prices it) and gets past the partition to its first submission."""
    args = ["+stage=1k", "cluster=slurm", "stage.budget.price_samples=0"]
    line = error_line(capsys, "sweep", *args, "--plain")
    assert "partition debug: 4 nodes" in line and "stage.gpus=32" not in line, line
    [fix] = commands(line)
    assert fix[0] == "sweep" and "+stage=smoke" in fix, fix
    succeeds(capsys, *fix, "--dry-run")
    with pytest.raises(Submitted):
        main([*fix, "--plain"])
    assert small_partition() != []
