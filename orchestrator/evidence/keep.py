"""What a parsed log keeps of its records: what the metrics need, so memory stays flat whatever the log's size.

Why: a job's output can run to gigabytes (a long run, a chatty rank, NCCL debug, a progress bar) and the
parser finds a record in nearly every line of it. orchestrator.evidence.parse streams the records; a Keep decides
which of
them a ParsedLog holds (`Retainer`):
- iteration lines of the measured window (warm-up excluded, unless `warmup`: a job folder's collect keeps the
  warm-up's too, for how many iterations its step took to settle), plus the last one before it and the first one
  after it: orchestrator.evidence.metrics sees whether the job got past the window (partial) and on which side of
  the window a rank-0 straggler line's timestamp falls;
- timer blocks printed after a window iteration, and any block holding one of `timers` (the checkpoint
  save/restore timers are logged outside the window);
- straggler lines placed inside the window (those of a file without iteration lines cannot be placed yet:
  kept like the rest);
- one memory record per rank: its peaks (orchestrator.evidence.metrics.rank_memory reads only those);
- of everything else, the first records (root causes come first: the first OOM, traceback, cancel).
Each list holds at most `max_records`; the rest is counted in ParsedLog.dropped. Without a window (a log read
for a quick look) the first `max_records` iterations and timer blocks are kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from orchestrator.evidence.records import (
    RECORD_LISTS,
    IterationRecord,
    MemoryRecord,
    ParsedLog,
    Record,
    StragglerRecord,
    TimerBlock,
)

MAX_RECORDS = 4096  # per list: a measurement window is tens of iterations; failure evidence is a few lines


@dataclass(frozen=True)
class Keep:
    """A retention policy: the measured window (iterations warmup+1 .. warmup+measure) and timer names kept
    from every block. `window=None`: no window known."""

    window: tuple[int, int] | None = None  # (warmup, measure)
    timers: tuple[str, ...] = ()
    warmup: bool = False  # keep the warm-up's iteration lines too (what metrics.settled_iters reads)
    max_records: int = MAX_RECORDS

    def in_window(self, iteration: int | None) -> bool:
        if self.window is None or iteration is None:
            return False
        warmup, measure = self.window
        return warmup < iteration <= warmup + measure


class Retainer:
    """Fills one ParsedLog from a record stream under a Keep."""

    def __init__(self, log: ParsedLog, keep: Keep) -> None:
        self.log, self.keep = log, keep
        self._lists = {cls: getattr(log, name) for cls, name in RECORD_LISTS.items()}
        self._at: dict[tuple[int | None, int], int] = {}  # (rank, iteration) -> index in log.iterations
        self._before: IterationRecord | None = None  # the last iteration at or before the window
        self._after: IterationRecord | None = None  # the first iteration after it
        self._memory: dict[int, MemoryRecord] = {}

    def fill(self, records: Iterable[Record]) -> ParsedLog:
        for rec in records:
            self._add(rec)
        return self._finish()

    def _add(self, rec: Record) -> None:
        if isinstance(rec, IterationRecord):
            self._iteration(rec)
        elif isinstance(rec, MemoryRecord):
            self._peak(rec)
        elif isinstance(rec, TimerBlock):
            if self.keep.window is None or self.keep.in_window(rec.after_iteration) or self._named(rec):
                self._append(rec)
            else:
                self.log.dropped += 1
        elif isinstance(rec, StragglerRecord) and rec.after_iteration is not None and self.keep.window is not None:
            if self.keep.in_window(rec.after_iteration):
                self._append(rec)
            else:
                self.log.dropped += 1
        else:
            self._append(rec)

    def _finish(self) -> ParsedLog:
        self.log.iterations = [r for r in (self._before, *self.log.iterations, self._after) if r is not None]
        self.log.memory = [self._memory[r] for r in sorted(self._memory)]
        return self.log

    def _append(self, rec: Record) -> None:
        bucket = self._lists[type(rec)]
        if len(bucket) < self.keep.max_records:
            bucket.append(rec)
        else:
            self.log.dropped += 1

    def _iteration(self, rec: IterationRecord) -> None:
        window = self.keep.window
        if window is None:
            self._append(rec)
        elif self.keep.in_window(rec.iteration) or (self.keep.warmup and rec.iteration <= window[0]):
            at = self._at.get((rec.rank, rec.iteration))
            if at is not None:  # the same iteration again (a requeued run appends): the last one counts
                self.log.iterations[at] = rec
                self.log.dropped += 1
            elif len(self.log.iterations) < self.keep.max_records:
                self._at[rec.rank, rec.iteration] = len(self.log.iterations)
                self.log.iterations.append(rec)
            else:
                self.log.dropped += 1
        elif rec.iteration <= window[0]:
            self.log.dropped += self._before is not None
            self._before = rec
        elif self._after is None:
            self._after = rec
        else:
            self.log.dropped += 1

    def _peak(self, rec: MemoryRecord) -> None:
        cur = self._memory.get(rec.rank)
        if cur is None:
            self._memory[rec.rank] = rec
            return
        self.log.dropped += 1
        used = [v for v in (cur.total_device_used, rec.total_device_used) if v is not None]
        self._memory[rec.rank] = replace(
            rec,
            max_allocated=max(cur.max_allocated, rec.max_allocated),
            max_reserved=max(cur.max_reserved, rec.max_reserved),
            total_device_used=max(used) if used else None,
        )

    def _named(self, blk: TimerBlock) -> bool:
        return any(n in blk.per_rank or n.encode() in blk.raw for n in self.keep.timers)
