"""The sweep's live view: a rich table when stdout is a terminal, one plain line per event otherwise."""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.core import metrics
from orchestrator.core.metrics import STEP_P50

if TYPE_CHECKING:
    from rich.live import Live


@dataclass
class Snapshot:
    sweep: str
    round: int
    counts: dict[str, int]
    best: dict | None
    gpu_hours: float
    simulated: bool
    note: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        c = self.counts
        best = "-"
        if self.best:
            best = f"{metrics.text(STEP_P50, self.best[STEP_P50])} {self.best['layout']}"
        gh = f"{self.gpu_hours:.1f} GPU-h" + (" (simulated)" if self.simulated else "")
        return (
            f"[{self.sweep}] round {self.round} queued {c['queued']} running {c['running']} done {c['done']} "
            f"failed {c['failed']} | best {best} | {gh}"
        )


PLAIN_WIDTH = 199  # a plain (log, CI, pipe) line's most characters: the detail is in the ledger's events


def folded(message: str, width: int = PLAIN_WIDTH) -> list[str]:
    """`message` as lines of at most `width` characters, broken after "; " (else ", ", else anywhere), each line
    after the first indented: a log reader greps a line, not a screen of one."""
    lines: list[str] = []
    rest = message
    while len(rest) > width:
        cut = max(rest.rfind("; ", 0, width - 1), rest.rfind(", ", 0, width - 1))
        cut = cut + 2 if cut > width // 3 else width
        lines.append(rest[:cut].rstrip())
        rest = "  " + rest[cut:].lstrip()
    return [*lines, rest]


def folded_command(label: str, command: str, width: int = PLAIN_WIDTH) -> list[str]:
    """`label` then a shell command, broken between words with a line continuation (` \\`) where the line would
    pass `width`: pasted into a shell, the lines are still the one command (a ledger URL makes them long)."""
    words = [shlex.quote(w) for w in shlex.split(command)]  # never broken inside a quoted argument
    lines, line = [], label + words[0]
    for word in words[1:]:
        if len(line) + len(word) + 3 > width:
            lines.append(line + " \\")
            line = "      " + word
        else:
            line += " " + word
    return [*lines, line]


class View:
    """Live rich table on a tty (refreshes in place); plain stdout lines otherwise (logs, CI, pipes)."""

    def __init__(self, *, live: bool | None = None, stream=None):
        self.stream = stream or sys.stdout
        self.live_mode = self.stream.isatty() if live is None else live
        self._live: Live | None = None
        self._last = ""
        self._t0 = time.monotonic()

    def __enter__(self) -> View:
        if self.live_mode:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(console=Console(file=self.stream), refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def event(self, message: str) -> None:
        """A decision worth a line (round proposed, job failed, retry, stop reason)."""
        if self._live is not None:
            self._live.console.print(message)
        else:
            for line in message.splitlines() or [""]:
                print("\n".join(folded(line)), file=self.stream, flush=True)

    def update(self, snap: Snapshot) -> None:
        if self._live is not None:
            self._live.update(self._table(snap))
            return
        line = snap.line()
        if line != self._last:  # plain mode: print only when something changed
            print("\n".join(folded(line)), file=self.stream, flush=True)
            self._last = line

    def _table(self, snap: Snapshot):
        from rich.table import Table

        t = Table(
            title=f"sweep {snap.sweep} - round {snap.round} - {time.monotonic() - self._t0:.0f}s", show_header=True
        )
        for col in ("queued", "running", "done", "failed", "best step p50", "best layout", "GPU-hours"):
            t.add_column(col)
        b = snap.best
        t.add_row(
            *(str(snap.counts[k]) for k in ("queued", "running", "done", "failed")),
            metrics.text(STEP_P50, b[STEP_P50]) if b else "-",
            b["layout"] if b else "-",
            f"{snap.gpu_hours:.1f}" + (" simulated" if snap.simulated else ""),
        )
        return t
