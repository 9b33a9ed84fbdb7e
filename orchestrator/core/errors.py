"""User-facing errors. Any exception with a class attribute `user_facing = True` (also the ledger's,
which lives in orchestrator/ledger/ and does not import this module) is printed by the CLI as one line + exit 2.

A stop whose cause is outside the input (a full disk, a ledger locked past its wait or out of reach, a signal)
carries `again`: how to go on once the cause is gone. It reads "run the command again" until a command that
knows better sets it: a sweep's is `python -m orchestrator resume NAME` (orchestrator/sweep `carry_on`)."""

from __future__ import annotations

import signal

AGAIN = "run the command again"


class UserError(Exception):
    """Bad input from the user: the message names the problem and the fix."""

    user_facing = True


class DiskFull(UserError):
    """A write that the file system refused for want of room (or a quota, or a read-only mount): one line that
    names where and the fix, never an OSError traceback from whichever write met it first."""

    def __init__(self, what: str, fix: str, again: str = AGAIN) -> None:
        self.what, self.fix, self.again = what, fix, again
        super().__init__(what)

    def __str__(self) -> str:
        return f"{self.what}: {self.fix}, then {self.again}"


class Interrupted(KeyboardInterrupt):
    """A signal told the process to stop: SIGINT (Ctrl-C) or SIGTERM (kill, systemd, Slurm ending the driver's
    job). A KeyboardInterrupt, so every cleanup written for Ctrl-C runs for SIGTERM too (the driver records the
    stop, marks its sweep interrupted, releases its lease); the CLI prints it and exits 128 + the signal number.
    Without it SIGTERM ended the driver at once, exit 143 and not a word."""

    def __init__(self, signum: int = signal.SIGINT, again: str = "") -> None:
        self.signum, self.again = int(signum), again
        super().__init__(self.name)

    @property
    def name(self) -> str:
        name = signal.Signals(self.signum).name
        return f"{name} (Ctrl-C)" if self.signum == signal.SIGINT else name

    def __str__(self) -> str:
        return f"stopped on {self.name}" + (f": {self.again}" if self.again else "")
