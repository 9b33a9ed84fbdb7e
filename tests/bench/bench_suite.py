"""The test suite's own timings: each tier's last run, read from the junit xml the Makefile leaves.

`make check` writes .test-times/check.xml and `make test` .test-times/test.xml (Makefile, TIMES). This bench
runs no test: it prints what the last run of each tier took (pytest's wall time, from session start to end),
its outcome counts, the time spent in each Slurm lane (tests/conftest.py) and the slowest tests, so a slower
suite is seen where it is paid for; for `make check`, how many of its tests took LONG_S or more (the fast tier
stays fast only while such tests carry the `long` marker). Alone: `python tests/bench/run_all.py bench_suite`.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMES = Path(os.environ.get("TIMES", ROOT / ".test-times"))
TIERS = {"check": "make check (no services)", "test": "make test (everything, what CI runs)"}
SLOWEST = 12
# `make check` deselects the tests marked `long`: one of its own that takes this long is named, to be marked or sped up
LONG_S = 2.0


@dataclass(frozen=True)
class Case:
    nodeid: str
    seconds: float
    outcome: str


@dataclass(frozen=True)
class Run:
    tier: str
    wall_s: float
    started: str
    cases: tuple[Case, ...]

    def count(self, outcome: str) -> int:
        return sum(c.outcome == outcome for c in self.cases)


def _outcome(case: ET.Element) -> str:
    for tag in ("failure", "error", "skipped"):
        if case.find(tag) is not None:
            return tag
    return "passed"


def read(path: Path, tier: str) -> Run:
    """One tier's run from pytest's junit xml (`--junitxml`): the suite's time and each test's."""
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise ValueError(f"{path}: no <testsuite> element (not a pytest --junitxml file)")
    cases = tuple(
        Case(f"{c.get('classname', '')}::{c.get('name', '')}", float(c.get("time") or 0.0), _outcome(c))
        for c in suite.iter("testcase")
    )
    started = suite.get("timestamp") or datetime.fromtimestamp(path.stat().st_mtime).isoformat(timespec="seconds")
    return Run(tier, float(suite.get("time") or 0.0), started, cases)


def lanes(run: Run) -> dict[str, float]:
    """Seconds of tests per Slurm lane (xdist puts the group in the test's name after an @)."""
    out: dict[str, float] = {}
    for c in run.cases:
        if "@slurm" in c.nodeid:
            lane = c.nodeid.rsplit("@", 1)[1]
            out[lane] = out.get(lane, 0.0) + c.seconds
    return out


def show(run: Run) -> None:
    m, s = divmod(run.wall_s, 60)
    print(f"  {TIERS.get(run.tier, run.tier)}: {int(m)} min {s:04.1f} s of pytest (started {run.started})")
    counts = ", ".join(f"{run.count(o)} {o}" for o in ("passed", "failure", "error", "skipped") if run.count(o))
    print(f"    {len(run.cases)} tests: {counts}; {sum(c.seconds for c in run.cases):.0f} s summed over workers")
    for lane, secs in sorted(lanes(run).items()):
        print(f"    lane {lane}: {secs:.0f} s of tests (its waits for the cluster not counted)")
    print(f"    slowest {min(SLOWEST, len(run.cases))}:")
    for c in sorted(run.cases, key=lambda c: -c.seconds)[:SLOWEST]:
        print(f"      {c.seconds:7.1f} s  {c.nodeid}{'' if c.outcome == 'passed' else f'  ({c.outcome})'}")
    slow = unmarked_long(run)
    if slow:
        print(f"    {len(slow)} check-tier test(s) of {LONG_S:.0f} s or more: mark them `long` or make them faster")


def unmarked_long(run: Run) -> list[Case]:
    """The check tier's tests that took LONG_S or more (none is marked `long`: `make check` deselects those)."""
    return (
        sorted((c for c in run.cases if c.seconds >= LONG_S), key=lambda c: -c.seconds) if run.tier == "check" else []
    )


def main() -> None:
    """A report, not a goal: a tier not run yet is said, not failed."""
    for tier in TIERS:
        path = TIMES / f"{tier}.xml"
        if path.is_file():
            show(read(path, tier))
        else:
            print(f"  {TIERS[tier]}: no run recorded ({path} is missing: `make {tier}` writes it)")


if __name__ == "__main__":
    main()
