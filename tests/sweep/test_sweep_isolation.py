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

from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import UNCUT, cli, sweep_args

SCREENED = [  # short screens once noise is measured, so later rounds confirm contenders and propose new ones
    "policy.round0_size=3",
    "policy.round_size=3",
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
            (c.key, c.round, (c.decision or {}).get("reason"), tuple(str(a.fidelity) for a in led.attempts(c.id)))
            for c in led.candidates(name)
        ]
        rounds = [(e.message, tuple(e.data.get("confirms") or ())) for e in led.events(name, kind="round")]
    return [*sorted(cands), *rounds]


def test_a_sweep_decides_the_same_with_or_without_another_sweep_of_its_stage_on_the_ledger(tmp_path):
    _sweep(tmp_path, "shared", "other", seed=7)  # another sweep of the stage first: its own noise and optimum
    _sweep(tmp_path, "shared", "mine", seed=0)
    _sweep(tmp_path, "alone", "mine", seed=0)
    shared = _decisions(f"sqlite:///{tmp_path / 'shared' / 'ledger.sqlite'}", "mine")
    alone = _decisions(f"sqlite:///{tmp_path / 'alone' / 'ledger.sqlite'}", "mine")
    assert shared == alone
