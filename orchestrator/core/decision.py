"""Why a candidate runs, and how: the typed decision stored with it (candidate.decision), and its early cut.

One owner for the decision's keys: the search writes one (`orchestrator/search/types.Proposal.decision`), the
schedule and the driver change it (a confirmation at the full window keeps the one it replaces as `previous`;
the warm start's wait resolves to `warm_from` or `seed_save`), and every reader (the fidelity's window, the
warm start, the rank probe's ranks, the cut, the report's search path) reads these fields, never a dict key.
The ledger decodes the stored JSON once (orchestrator/ledger/convert.py) and writes `to_dict`, whose shape is
the one stored since the decision existed: an older ledger's decision, missing keys or carrying ones this code
does not know, reads (missing: the defaults below; unknown: kept in `extra` and written back as they were).

Stdlib only (core/): the ledger, the schedule and the driver all import it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from orchestrator.core.states import Fidelity


@dataclass(frozen=True)
class CutLine:
    """The early cut of one launch (stage.screen.cut*), stored in its candidate's decision (`cut`) so a resumed
    driver applies the same line: stop once iterations skip+1..after are run and their median step is above
    `step_s` (the sweep's best full-window p50 x (1 + cut_margin) when the round was planned; the driver lowers it
    to the best it holds as the launch runs, core/windows.running_line). What ran is a screen of the iterations
    after `skip` that the verdict read: it ranks, never decides a best.

    `split` (stage.screen.cut_split; 0: off): a window whose fastest iteration is more than `split` under its median
    ran at two levels, a straggler's spikes over a fast step rather than a slow layout, so the verdict reads as many
    iterations again (`reach`) before it cuts. Why: three spikes in five iterations cut held-out twin:overpredicted
    s136's 1k optimum (median 59.7 s, its step 38.4 s) and the sweep never came back to it (docs/search-log.md "A
    split window reads on")."""

    step_s: float
    after: int
    skip: int
    split: float = 0.0

    @property
    def longest(self) -> int:
        """The most iterations a verdict reads (a split first window's `reach`)."""
        return 2 * self.after - self.skip if self.split > 0 else self.after

    def reach(self, times: Sequence[float]) -> int:
        """How many iterations (from iteration 1) the verdict on `times` reads: `after`, or `longest` where the
        first window's median is over the line and its fastest iteration more than `split` under that median (so a
        window under the line is never read on: the split only ever spares a launch)."""
        if self.split > 0 and len(times) >= self.after:
            first = times[self.skip : self.after]
            med = statistics.median(first)
            if med > self.step_s and min(first) * (1.0 + self.split) < med:
                return self.longest
        return self.after

    def window_at(self, reach: int) -> tuple[int, int]:
        """(warm-up, measured iterations) of the result a launch cut after `reach` iterations leaves."""
        return self.skip, reach - self.skip

    def verdict(self, times: Sequence[float]) -> tuple[float | None, int]:
        """(the median step that cuts the launch, or None; the iterations the verdict reads, `reach`), given its
        per-iteration seconds from iteration 1 on: None while fewer than its reach have run or when their median is
        at or under the line."""
        n = self.reach(times)
        if len(times) < n:
            return None, n
        med = statistics.median(times[self.skip : n])
        return (med if med > self.step_s else None), n

    def due(self, times: Sequence[float]) -> float | None:
        """The median step that cuts the launch (`verdict`), or None."""
        return self.verdict(times)[0]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.split:  # a line without the split is stored as it always was
            d.pop("split")
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> CutLine | None:
        """A stored line (a decision's `cut`, a job folder's cut mark); None: never cut. One stored before the
        split has none."""
        if not d:
            return None
        return cls(float(d["step_s"]), int(d["after"]), int(d["skip"]), float(d.get("split") or 0.0))


# The keys every decision the search writes carries (null when unset), in the stored order.
_ALWAYS = ("kind", "move", "fidelity", "measure_iters", "predicted_gain", "uncertainty", "parent", "revived")
# The keys written only when set (a rank probe's ranks, the warm start's, the cut, the replaced decision).
_WHEN_SET = ("probe_ranks", "warm_from", "seed_save", "after_seed", "warmup_iters", "cut", "previous")
KEYS = frozenset(_ALWAYS + _WHEN_SET)


@dataclass(frozen=True)
class Decision:
    """Why a candidate was proposed and what its next launch runs. `stored`: False for a candidate that carries
    no decision (added by run-one, `plan --save` or an older tool): it runs at the full window, cold."""

    kind: str | None = None  # the move's kind: the reason's first word (neighbour, model-top, round0 ...)
    move: str | None = None  # the whole reason (neighbour:tp, joint:ep+etp, model-top (revived: ...))
    fidelity: Fidelity = Fidelity.FULL  # the window its next attempt runs
    measure_iters: int | None = None  # a screen's measured window (schedule/fidelity.screen_iters)
    predicted_gain: float | None = None  # over the best measured step, as the searcher rated it
    uncertainty: float | None = None  # that gain's sd
    parent: str | None = None  # the key of the layout it moved from
    revived: bool = False  # pruned by the uncalibrated memory model, fits the calibrated one
    probe_ranks: tuple[int, ...] = ()  # a rank probe's ranks of the N-GPU job (orchestrator.plan.ranks)
    warm_from: str | None = None  # loads the sweep's seed from this checkpoint folder
    seed_save: bool = False  # saves the sweep's seed at its end
    after_seed: bool = False  # waits for the seed its round's first launch saves (orchestrator/sweep/seeding.py)
    warmup_iters: int | None = None  # a warm launch's learned warm-up (schedule/fidelity.learned_warmup)
    cut: CutLine | None = None  # its early cut, set as the round is planned (the early_cut step)
    previous: Decision | None = None  # the decision a confirmation at the full window replaced
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this code does not know, kept as stored
    stored: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "fidelity", Fidelity(self.fidelity or Fidelity.FULL))
        object.__setattr__(self, "probe_ranks", tuple(int(r) for r in self.probe_ranks))

    @property
    def warms(self) -> bool:
        """The launch loads the sweep's seed: it names it (`warm_from`), or waits for it (`after_seed`: it goes
        only once the seed is there, orchestrator/sweep/seeding.py, and then names it)."""
        return bool(self.warm_from or self.after_seed)

    def probed_ranks(self) -> tuple[int, ...]:
        """The ranks a rank probe runs: its own, or those of the decision it was probed under before a
        confirmation replaced it (`previous`); a probe decided before rank probes names none (full scale)."""
        d: Decision | None = self
        while d is not None:
            if d.probe_ranks:
                return d.probe_ranks
            d = d.previous
        return ()

    def but(self, **changes: Any) -> Decision:
        """This decision with `changes` (dataclasses.replace): a resolved wait, a cut, a confirmation."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The stored JSON (candidate.decision, JobSpec.decision): the shape Proposal.decision wrote before this
        type existed, so an older reader and an older ledger see no difference."""
        out: dict[str, Any] = {k: getattr(self, k) for k in _ALWAYS}
        if self.probe_ranks:
            out["probe_ranks"] = list(self.probe_ranks)
        if self.warm_from:
            out["warm_from"] = self.warm_from
        if self.seed_save:
            out["seed_save"] = True
        if self.after_seed:
            out["after_seed"] = True
        if self.warmup_iters is not None:
            out["warmup_iters"] = self.warmup_iters
        if self.cut is not None:
            out["cut"] = self.cut.to_dict()
        if self.previous is not None:
            out["previous"] = self.previous.to_dict() if self.previous.stored else None
        return {**out, **{k: v for k, v in self.extra.items() if k not in out}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Decision:
        """A stored decision; None (a candidate without one) is `Decision(stored=False)`: full window, cold."""
        if d is None:
            return cls(stored=False)
        w, m = d.get("warmup_iters"), d.get("measure_iters")
        prev = d.get("previous", ...)
        return cls(
            kind=d.get("kind"),
            move=d.get("move"),
            fidelity=Fidelity(d.get("fidelity") or Fidelity.FULL),
            measure_iters=None if m is None else int(m),
            predicted_gain=d.get("predicted_gain"),
            uncertainty=d.get("uncertainty"),
            parent=d.get("parent"),
            revived=bool(d.get("revived")),
            probe_ranks=tuple(d.get("probe_ranks") or ()),
            warm_from=d.get("warm_from") or None,
            seed_save=bool(d.get("seed_save")),
            after_seed=bool(d.get("after_seed")),
            warmup_iters=None if w is None else int(w),
            cut=CutLine.from_dict(d.get("cut")),
            previous=None if prev is ... else cls.from_dict(prev),
            extra={k: v for k, v in d.items() if k not in KEYS},
        )


NO_DECISION = Decision(stored=False)  # a candidate that carries none (the rows' default)
