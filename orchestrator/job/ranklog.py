"""Where one rank's stdout/stderr go: files of its own for an evidence rank, else its node's shared log.

Why: a file pair per rank is 16k files for an 8k-GPU job, and collect would read them all, while only a
few ranks print evidence (orchestrator.plan.ranks.evidence_ranks). The other ranks still print warnings
and, when something breaks, the traceback or NCCL error that explains it; those lines go to
`node-<host>.log`, labelled `<rank>: ` as `srun --label` does (orchestrator.evidence.parse reads that label), through a
pipe whose reader keeps the first `HEAD_BYTES` of each rank and then only its last `TAIL_BYTES`.

Each batch of whole lines is one O_APPEND write, so the ranks of a node do not tear each other's lines
(local and Lustre file systems; NFS does not promise atomic appends). Stdlib only: runs on compute nodes.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import deque
from pathlib import Path
from typing import BinaryIO

from orchestrator.core.paths import JobPaths

HEAD_BYTES = 1 << 20  # per rank, written as it comes
TAIL_BYTES = 64 << 10  # per rank, kept in memory past the head and written when the rank's output ends
CHUNK = 1 << 16


def node_name() -> str:
    """The short host name (what Slurm calls the node)."""
    return (os.environ.get("SLURMD_NODENAME") or socket.gethostname()).split(".")[0] or "node"


class NodeLog:
    """A pipe whose reader labels each line with the rank and appends it, bounded, to the node's log."""

    def __init__(self, paths: JobPaths, rank: int, *, head: int = HEAD_BYTES, tail: int = TAIL_BYTES) -> None:
        self.path = paths.node_log(node_name())
        self.rank, self.head, self.tail = rank, head, tail
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        read_fd, write_fd = os.pipe()
        self.writer: BinaryIO = os.fdopen(write_fd, "wb", buffering=0)
        self._reader = threading.Thread(target=self._pump, args=(read_fd,), name=f"node-log-{rank}", daemon=True)
        self._reader.start()

    def _pump(self, read_fd: int) -> None:
        label = f"{self.rank}: ".encode()
        written, dropped, partial = 0, 0, b""
        ring: deque[bytes] = deque()
        ring_size = 0
        with os.fdopen(read_fd, "rb", buffering=0) as src:
            while True:
                chunk = src.read(CHUNK)
                if not chunk:
                    break
                *lines, partial = (partial + chunk).split(b"\n")
                if len(partial) > CHUNK:  # a line without end (a progress bar): cut it, keep memory bounded
                    lines.append(partial)
                    partial = b""
                if not lines:
                    continue
                labelled = [label + line + b"\n" for line in lines]
                if written < self.head:  # whole lines up to the head's budget go out now
                    k, size = 0, 0
                    while k < len(labelled) and written + size < self.head:
                        size += len(labelled[k])
                        k += 1
                    os.write(self._fd, b"".join(labelled[:k]))
                    written += size
                    labelled = labelled[k:]
                for data in labelled:
                    ring.append(data)
                    ring_size += len(data)
                while ring_size > self.tail and len(ring) > 1:
                    dropped += len(ring[0])
                    ring_size -= len(ring.popleft())
        if partial:
            ring.append(label + partial + b"\n")
        if dropped:
            note = f"[orchestrator] rank {self.rank}: {dropped} bytes of output dropped after the first {self.head}"
            ring.appendleft(label + note.encode() + b"\n")
        if ring:
            os.write(self._fd, b"".join(ring))

    def close(self, timeout_s: float = 30.0) -> None:
        """Close this end; the reader writes what is left once every other writer (the workload) is gone."""
        if not self.writer.closed:
            self.writer.close()
        self._reader.join(timeout_s)
        os.close(self._fd)


class RankOutput:
    """stdout/stderr targets of one rank: `out` and `err` are binary files with a real file descriptor."""

    def __init__(self, paths: JobPaths, rank: int, evidence: bool) -> None:
        self.paths, self.rank, self.evidence = paths, rank, evidence
        self.node: NodeLog | None = None
        if evidence:
            self.out: BinaryIO = open(paths.stdout(rank), "ab")  # noqa: SIM115 - closed in close()
            self.err: BinaryIO = open(paths.stderr(rank), "ab")  # noqa: SIM115 - closed in close()
        else:
            self.node = NodeLog(paths, rank)
            self.out = self.err = self.node.writer

    @property
    def where(self) -> Path:
        """The file a reader should open for this rank's errors."""
        return self.node.path if self.node is not None else self.paths.stderr(self.rank)

    def close(self) -> None:
        if self.node is not None:
            self.node.close()
        else:
            self.out.close()
            self.err.close()

    def __enter__(self) -> RankOutput:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
