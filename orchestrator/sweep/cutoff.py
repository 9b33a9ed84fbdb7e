"""The early cut, applied to running jobs: the driver reads a launch's iteration lines as it polls and stops
it once its line (core/decision.CutLine, in its candidate's decision, lowered to the best the sweep holds as it
runs: core/windows.running_line) says it is clearly slower than the sweep's best full-window step.

Why in the driver and not on the compute node: the driver already polls every live job, reads job folders
through evidence/ and cancels through the launcher; one scancel stops every rank of the job at once, where
a rank stopping itself leaves the others waiting in a collective. The mark (JobPaths.CUT) is written
before the cancel, so whatever the order the driver dies in, the folder says what the job was: collect
reads the cut's window from it (evidence/collect.as_cut), and `settle` makes the attempt the screen of what
it ran before its result is recorded, so it never counts as a full window (orchestrator.core.ranking).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from orchestrator.core.decision import CutLine
from orchestrator.core.paths import JobPaths, atomic_write
from orchestrator.core.schema import StageConfig
from orchestrator.core.states import EventKind, Fidelity
from orchestrator.core.windows import running_line
from orchestrator.evidence.collect import cut_window, iteration_times, read_cut
from orchestrator.ledger.ledger import AttemptRow, CandidateRow, Ledger


@dataclass(frozen=True)
class Check:
    """One look at a running launch: `median_s` set when its cut is due; `done` once it can no longer be cut
    (it ran past its line's iterations under the line), so the driver stops reading its folder."""

    line: CutLine
    median_s: float | None = None
    done: bool = False
    reach: int = 0  # the iterations the verdict read (CutLine.reach: its first window, or more where that split)
    mark: dict | None = None  # the mark its folder holds already (an earlier poll, or a driver that died)

    @property
    def marked(self) -> bool:
        """Its folder holds the mark already: cancel again."""
        return self.mark is not None


def check(a: AttemptRow, c: CandidateRow, stage: StageConfig, best_s: float | None) -> Check | None:
    """The cut's verdict on a running measure attempt so far, against its running line (core/windows.running_line:
    its planned line, lowered to the sweep's best full-window p50 `best_s` now); None when it has no line (a
    probe, a launch planned before the sweep had a best, cut disabled)."""
    line = running_line(stage, c.decision, best_s)
    if line is None or a.fidelity not in (Fidelity.FULL, Fidelity.SCREEN) or not a.job_dir:
        return None
    if (marked := read_cut(a.job_dir)) is not None:
        return Check(line, float(marked.get("median_s") or 0.0), mark=marked)
    times = iteration_times(a.job_dir, line.longest)
    med, reach = line.verdict(times)
    return Check(line, med, done=med is None and len(times) >= reach, reach=reach)


def mark(a: AttemptRow, found: Check) -> dict:
    """Write the cut's mark into the job folder (before the cancel: see the module docstring); the mark."""
    assert found.median_s is not None
    # the window collect reads the result over (evidence/collect.cut_window): the iterations the verdict read
    warmup, measure = found.line.window_at(found.reach or found.line.after)
    body = {**found.line.to_dict(), "warmup_iters": warmup, "measure_iters": measure}
    body.update(median_s=found.median_s, job_id=a.job_id, token=a.launch_token)  # the launch it is of (ingest)
    atomic_write(JobPaths(a.job_dir).cut, json.dumps(body, indent=1))
    return body


def settle(ledger: Ledger, a: AttemptRow) -> AttemptRow:
    """A terminal attempt whose folder holds the cut's mark becomes a screen (before its result is recorded);
    the attempt as it now stands."""
    if a.job_dir and a.fidelity != Fidelity.SCREEN and read_cut(a.job_dir) is not None:
        return ledger.update_attempt(a.id, fidelity=Fidelity.SCREEN)
    return a


def log(ledger: Ledger, sweep: str, candidate_id: int, job_id: str | None, mark: dict, *, how: str = "") -> str:
    """The ledger's `cut` event of one cut launch, from its mark (the driver's as it cuts, `ledger ingest`'s
    when it rebuilds the launch from its folder: one wording, one data shape); the message."""
    line = CutLine.from_dict(mark)
    assert line is not None
    median = float(mark.get("median_s") or 0.0)
    window = cut_window(mark)  # the iterations the verdict read, as every mark states them (`mark`)
    assert window is not None
    warmup, measure = window
    why = (
        f"cut early: median step {median:.4g}s over iterations {warmup + 1}-{warmup + measure}"
        f" is above its line {line.step_s:.4g}s" + (f" ({how})" if how else "")
    )
    ledger.log_event(sweep, EventKind.CUT, why, candidate_id=candidate_id, data={"job_id": job_id, **line.to_dict()})
    return why
