"""Issue 22 item 1: sweeps of one stage on one ledger never read each other's rows.

Before, a sweep's round gathered observations (measurements, screens, the stage's noise) and known keys from
every sweep of the stage and matched them to its own candidates by layout key (orchestrator/sweep/decide.py):
a second sweep skipped the layouts the first had measured, sized its screens from the first's noise, and
confirmed its own screen because of the other's p50. Now everything a sweep decides comes from its own rows
(or from the source it promotes from, named by id): the same sweep decides the same rounds on a ledger that
holds another sweep of its stage as on a ledger of its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import UNCUT, cli, sweep_args

SCREENED = [  # short screens once noise is measured, so later rounds confirm contenders and propose new ones
    "policy.schedule.round0_size=3",
    "policy.schedule.round_size=3",
    "stage.budget.max_rounds=5",
    "stage.budget.max_runs=16",
    "stage.warmup_iters=6",
    "stage.measure_iters=40",
    "stage.screen.enabled=true",
    "stage.screen.warmup_iters=3",
    "stage.screen.min_measure_iters=4",
    "stage.screen.resolution=0.2",
    UNCUT,
]


def _sweep(tmp_path: Path, folder: str, name: str, seed: int) -> None:
    (tmp_path / folder).mkdir(exist_ok=True)
    args = sweep_args(tmp_path / folder, name, *SCREENED, f"++workload.twin.seed={seed}")
    proc = cli("sweep", *args, "--plain", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]


def _decisions(url: str, name: str) -> list[tuple]:
    """What the sweep decided, round by round: each candidate's key, round and why (its decision), each
    attempt's fidelity, and each round event's confirms and reasons."""
    with Ledger.open(url) as led:
        cands = [
            (c.key, c.round, c.decision.move, tuple(str(a.fidelity) for a in led.attempts(c.id)))
            for c in led.candidates(name)
        ]
        rounds = [(e.message, tuple(e.data.get("confirms") or ())) for e in led.events(name, kind="round")]
    return [*sorted(cands), *rounds]


@pytest.mark.long
def test_a_sweep_decides_the_same_with_or_without_another_sweep_of_its_stage_on_the_ledger(tmp_path):
    _sweep(tmp_path, "shared", "other", seed=7)  # another sweep of the stage first: its own noise and optimum
    _sweep(tmp_path, "shared", "mine", seed=0)
    _sweep(tmp_path, "alone", "mine", seed=0)
    shared = _decisions(f"sqlite:///{tmp_path / 'shared' / 'ledger.sqlite'}", "mine")
    alone = _decisions(f"sqlite:///{tmp_path / 'alone' / 'ledger.sqlite'}", "mine")
    assert shared == alone


@pytest.mark.long
def test_a_second_sweep_of_a_stage_says_before_it_launches_what_the_first_already_measured(tmp_path, capsys):
    """Issue 45 item 7: by design a second sweep of a stage on a shared ledger measures the same layouts again;
    it now says so in its first lines, with what the first measured and spent and the command that continues it.
    A warning, not an error: the second sweep runs."""
    from orchestrator import history
    from orchestrator.cli import main
    from orchestrator.config import root_from_yaml
    from orchestrator.core.schema import StageConfig

    tiny = ("policy.schedule.round0_size=2", "stage.budget.max_rounds=1", UNCUT)
    assert main(["sweep", *sweep_args(tmp_path, "first", *tiny), "--plain"]) == 0
    assert "warning:" not in capsys.readouterr().out  # the stage's first sweep: nothing to share
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    with Ledger.open(url) as led:
        stage: StageConfig = root_from_yaml(led.get_sweep("first").config_yaml).required_stage()
        spent = history.spent(led, "first", stage=stage)
    assert spent.runs == 2 and spent.gpu_hours > 0

    assert main(["sweep", *sweep_args(tmp_path, "second", *tiny), "--plain"]) == 0
    out = capsys.readouterr().out.splitlines()
    (i,) = [n for n, line in enumerate(out) if line.startswith("warning: sweep first of stage smoke")]
    j = next(n for n in range(i + 1, len(out)) if not out[n].startswith("  "))  # a plain line folds under 200
    warning = " ".join([out[i], *(line.strip() for line in out[i + 1 : j])])
    assert all(len(line) < 200 for line in out[i:j])
    assert (
        f"already measured 2 layout(s) in this ledger ({spent.gpu_hours:,.1f} simulated GPU-hours); sweep second "
        f"reads none of its rows and measures them again (up to {spent.gpu_hours:,.1f} GPU-hours more)"
    ) in warning, warning
    assert warning.endswith(": `python -m orchestrator best --sweep first` has its answer"), warning  # first is done
    assert i < next(n for n, line in enumerate(out) if line.startswith("submitted "))  # before anything launched

    # a sweep not done is continued instead: the line names its `resume`, with the ledger this command was given
    from orchestrator.commands.sweep import resume_command
    from orchestrator.config import compose
    from orchestrator.core.states import SweepStatus
    from orchestrator.sweep.preview import same_stage

    args = sweep_args(tmp_path, "third", *tiny)
    with Ledger.open(url) as led:
        led.set_sweep_status("first", SweepStatus.INTERRUPTED)
        lines = same_stage(led, compose(args).cfg, "third", lambda name: resume_command(name, args))
    assert [line.split(" of stage")[0] for line in lines] == ["warning: sweep second", "warning: sweep first"]
    assert lines[1].endswith(
        f": `python -m orchestrator resume first ledger.url={url} ++ledger.lease_ttl_s=4` continues it"
    )
