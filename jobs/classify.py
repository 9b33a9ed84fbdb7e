"""Why did an attempt fail? One class from ordered evidence, plus the line that proves it.

Order (first hit wins), strongest evidence first:
 1. slurmstepd's epilogue line `*** JOB|STEP id ON node CANCELLED AT t DUE TO <reason> ***`:
    TIME LIMIT -> TIMEOUT, PREEMPTION / JOB REQUEUE -> PREEMPTED, NODE FAILURE -> NODE_FAIL.
 2. the Slurm (sacct) state: TIMEOUT, DEADLINE -> TIMEOUT; PREEMPTED, REQUEUED -> PREEMPTED;
    NODE_FAIL, BOOT_FAIL -> NODE_FAIL; OUT_OF_MEMORY (host cgroup) -> OOM.
    (FAILED, COMPLETED and running states decide nothing by themselves.)
 3. a successful run (exit 0 / COMPLETED with iteration lines) -> no failure.
 4. log signatures, in FAILURE_CLASSES order: Megatron/argparse validation error -> INVALID_CONFIG;
    CUDA or host OOM; NCCL watchdog (group mapped to EP/DP/PP/CP/TP from Megatron's process-group
    names); any other traceback -> CRASH. Root causes before symptoms: when one rank dies of a bad
    config or an OOM, its peers wait in a collective until the NCCL watchdog fires.
 5. plain cancellation (epilogue without reason, or sacct CANCELLED / "CANCELLED by N") -> CANCELLED.
    It comes after the log signatures on purpose: the orchestrator cancels a job that hangs after one
    rank OOMed or timed out in NCCL, and that signature is the real cause.
 6. non-zero exit code -> CRASH; no iteration line and nothing known -> NO_OUTPUT.

Retry: NODE_FAIL, PREEMPTED and NCCL_TIMEOUT are infrastructure, retried; TIMEOUT is retried once
(a second time limit means the layout is too slow for the window); the rest are deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from jobs.parse import NcclTimeoutRecord, ParsedLog, parse_bytes
from jobs.result import FAILURE_CLASSES, RETRYABLE, JobResult

DEFAULT_RETRIES = 2
_EPILOGUE = {
    "TIME LIMIT": "TIMEOUT",
    "PREEMPTION": "PREEMPTED",
    "JOB REQUEUE": "PREEMPTED",
    "NODE FAILURE": "NODE_FAIL",
}
_SACCT = {
    "TIMEOUT": "TIMEOUT",
    "DEADLINE": "TIMEOUT",
    "PREEMPTED": "PREEMPTED",
    "REQUEUED": "PREEMPTED",
    "NODE_FAIL": "NODE_FAIL",
    "BOOT_FAIL": "NODE_FAIL",
    "OUT_OF_MEMORY": "OOM",
}
_DETAIL_MAX = 500


@dataclass(frozen=True)
class Classification:
    failure_class: str | None  # one of FAILURE_CLASSES, None = success
    retryable: bool
    detail: str  # the evidence line
    nccl_group: str | None = None  # EP | DP | PP | CP | TP when the log names the group
    source: str = ""  # slurm-line | sacct | log | exit-code | none
    rank: int | None = None

    def apply(self, result: JobResult) -> JobResult:
        result.failure_class, result.retryable = self.failure_class, self.retryable
        result.failure_detail, result.nccl_group = self.detail, self.nccl_group
        result.ok = self.failure_class is None
        return result


def retry_limit(failure_class: str | None, default: int = DEFAULT_RETRIES) -> int:
    """Extra attempts allowed for a class: TIMEOUT once, other retryable classes `default`."""
    if failure_class == "TIMEOUT":
        return 1
    return default if failure_class in RETRYABLE else 0


def normalize_state(state: str | None) -> str:
    """'CANCELLED by 1000' -> CANCELLED, 'CANCELLED+' -> CANCELLED, ' timeout ' -> TIMEOUT."""
    if not state:
        return ""
    return state.strip().split()[0].rstrip("+").upper() if state.strip() else ""


def nccl_group_of(process_group: str | None) -> str | None:
    """Megatron's group_desc (parallel_state.py) -> EP/DP/PP/CP/TP. Expert-data-parallel groups
    count as DP (their collectives are gradient reductions); default_pg and MODEL_PARALLEL -> None."""
    if not process_group:
        return None
    g = process_group.upper()
    if "EXPERT" in g:
        if "DATA" in g:
            return "DP"
        if g.startswith("EXPERT_TENSOR_PARALLEL") or "GTP" in g:
            return "TP"
        return "EP"
    if "PIPELINE" in g or "EMBEDDING" in g:
        return "PP"
    if "CONTEXT" in g:
        return "CP"
    if "DATA" in g or "DISTRIBUTED_OPTIMIZER" in g:
        return "DP"
    if "TENSOR" in g or "GTP" in g:
        return "TP"
    return None


def _cut(line: str) -> str:
    return line if len(line) <= _DETAIL_MAX else line[:_DETAIL_MAX] + "..."


def _make(
    cls: str | None, detail: str, source: str, *, group: str | None = None, rank: int | None = None
) -> Classification:
    assert cls is None or cls in FAILURE_CLASSES
    return Classification(cls, cls in RETRYABLE, _cut(detail), group, source, rank)


def _nccl(records: list[NcclTimeoutRecord]) -> Classification:
    caught = [r for r in records if r.kind == "caught"]
    first = caught[0] if caught else records[0]
    named = [r for r in records if r.process_group and r.process_group != "default_pg"]
    same = [r for r in named if r.rank == first.rank and (first.seq_num is None or r.seq_num in (None, first.seq_num))]
    pick = (same or named or [None])[0]
    group = nccl_group_of(pick.process_group) if pick else None
    detail = first.line
    if pick is not None and pick.process_group not in detail:
        detail = f"{detail} [{pick.process_group}]"
    if group is None and first.op_type and first.op_type.upper().startswith("ALLTOALL"):
        group = "EP"  # Megatron's only NCCL all-to-all is the MoE token dispatch over EP
        detail += " [group inferred from OpType]"
    return _make("NCCL_TIMEOUT", detail, "log", group=group, rank=first.rank)


def classify(
    logs: Sequence[ParsedLog],
    slurm_state: str | None = None,
    exit_code: int | None = None,
    stderr_tail: bytes | str | Iterable[str] | None = None,
) -> Classification:
    """Classify one attempt from every rank's parsed output plus Slurm's view of it."""
    logs = list(logs)
    if stderr_tail:
        if isinstance(stderr_tail, str):
            stderr_tail = stderr_tail.encode("utf-8", "replace")
        elif not isinstance(stderr_tail, bytes):
            stderr_tail = "\n".join(stderr_tail).encode("utf-8", "replace")
        logs.append(parse_bytes(stderr_tail if stderr_tail.endswith(b"\n") else stderr_tail + b"\n"))

    cancels = [c for log in logs for c in log.slurm_cancels]
    for c in cancels:
        cls = _EPILOGUE.get(c.reason)
        if cls:
            return _make(cls, c.line, "slurm-line")
    state = normalize_state(slurm_state)
    if state in _SACCT:
        return _make(_SACCT[state], f"sacct state {slurm_state.strip()}", "sacct")  # type: ignore[union-attr]

    has_iters = any(log.iterations for log in logs)
    # A run with iteration lines is healthy only if nothing says it failed: a FAILED sacct state wins over
    # an exit code of 0 (a wrapper that caught the task's exception exits 0).
    if has_iters and state != "FAILED" and (exit_code == 0 or (exit_code is None and state == "COMPLETED")):
        return _make(None, "", "none")

    invalid = [v for log in logs for v in log.validation_errors]
    if invalid:
        v = invalid[0]
        return _make("INVALID_CONFIG", v.line, "log", rank=v.rank)
    ooms = [o for log in logs for o in log.ooms]
    if ooms:
        o = next((o for o in ooms if o.kind == "cuda"), ooms[0])
        return _make("OOM", o.line, "log", rank=o.rank)
    nccl = [n for log in logs for n in log.nccl]
    if nccl:
        return _nccl(nccl)
    tracebacks = [t for log in logs for t in log.tracebacks]
    if tracebacks:
        t = tracebacks[0]
        where = f" (at {t.last_frame})" if t.last_frame else ""
        return _make("CRASH", t.line + where, "log", rank=t.rank)

    if cancels:
        return _make("CANCELLED", cancels[0].line, "slurm-line")
    if state == "CANCELLED":
        return _make("CANCELLED", f"sacct state {slurm_state.strip()}", "sacct")  # type: ignore[union-attr]
    if exit_code not in (None, 0):
        return _make("CRASH", f"exit code {exit_code}" + (f", sacct state {state}" if state else ""), "exit-code")
    if state == "FAILED":
        return _make("CRASH", "sacct state FAILED", "sacct")
    if not has_iters:
        return _make("NO_OUTPUT", "no iteration line and no known failure signature", "none")
    return _make(None, "", "none")
