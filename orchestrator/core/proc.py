"""A process of this host named so that a reused pid is never taken for it: `pid:start`.

Why: pids wrap (at 32,768 on a default Linux), so on a busy host a pid recorded an hour ago can name another
process (a CI run met a killed local job's pid in a resumed one). The kernel's start time of a process (proc(5)
`stat` field 22, clock ticks since boot) tells two holders of one pid apart. Linux /proc only: where it is absent
nothing can be confirmed. stdlib only: the job side names its controller with it (orchestrator/launch/task.py),
the local launcher its jobs, the ledger its lease holders.
"""

from __future__ import annotations

import os
import signal


def stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat fields from field 3 (state) on; [] when there is no such process; None where there is
    no /proc to ask (not Linux)."""
    try:
        with open(f"/proc/{int(pid)}/stat") as fh:
            text = fh.read()
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        return None
    return text[text.rfind(")") + 2 :].split()  # comm may hold spaces and parentheses


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (proc(5) field 22), '' when unknown."""
    fields = stat(pid)
    return fields[19] if fields and len(fields) > 19 else ""


def identity(pid: int) -> str:
    """`pid:start` of a live process; the bare pid where its start time cannot be read."""
    start = start_time(pid)
    return f"{int(pid)}:{start}" if start else str(int(pid))


def parse(ident: str) -> tuple[int, str] | None:
    """(pid, start) of `pid:start`, (pid, '') of a bare pid, None of anything else."""
    pid, _, start = str(ident).partition(":")
    if not pid.isdigit() or (start and not start.isdigit()) or int(pid) <= 0:
        return None
    return int(pid), start


def live(pid: int, start: str = "") -> bool:
    """Whether `pid` names a running process (not a zombie: killed, its parent not yet reaping it) and, when
    `start` is given, the one that started at that tick. False where /proc cannot tell."""
    fields = stat(pid)
    if not fields or fields[0] in ("Z", "X"):
        return False
    return not start or (len(fields) > 19 and fields[19] == start)


def running(ident: str) -> bool:
    """Whether the very process `pid:start` runs. A bare pid is never confirmed (its holder may be another
    process): callers that must accept one check it by other evidence."""
    parsed = parse(ident)
    return parsed is not None and bool(parsed[1]) and live(*parsed)


def cmdline(pid: int) -> list[str]:
    """The process's argv ([] when gone or unreadable)."""
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as fh:
            raw = fh.read()
    except (OSError, ValueError):
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def children(pid: int) -> list[str]:
    """The identities (`pid:start`) of the processes `pid` started (every thread's `children` list); [] where
    none, or no /proc."""
    out: list[str] = []
    try:
        for thread in os.scandir(f"/proc/{int(pid)}/task"):
            with open(os.path.join(thread.path, "children")) as fh:
                out += [identity(int(c)) for c in fh.read().split()]
    except (OSError, ValueError):
        return []
    return out


def send(ident: str, sig: int) -> bool:
    """Signal the very process `pid:start`; whether it was signalled. The process is pinned by a pidfd before its
    start time is checked, so a pid that ends and is reused between the check and the signal is never hit
    (where pidfds are missing, the check comes just before a plain kill)."""
    parsed = parse(ident)
    if parsed is None or not parsed[1]:
        return False
    pid, start = parsed
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = -1
    try:
        if not live(pid, start):
            return False
        if fd >= 0:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except OSError:  # ended meanwhile
        return False
    finally:
        if fd >= 0:
            os.close(fd)
