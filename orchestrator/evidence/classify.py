"""Why did an attempt fail? One class from ordered evidence, plus the line that proves it.

The classes, what implies each and whether it is retried are orchestrator.core.failures' table; this module applies
that evidence in order (first hit wins), strongest first:
 1. slurmstepd's epilogue line `*** JOB|STEP id ON node CANCELLED AT t DUE TO <reason> ***`, for the
    classes whose Slurm evidence beats the logs (TIMEOUT, PREEMPTED, NODE_FAIL: stopped from outside).
 2. the Slurm (sacct) state, for the same classes and OOM (OUT_OF_MEMORY: the host cgroup).
    (FAILED, COMPLETED and running states decide nothing by themselves.)
 3. a successful run (exit 0 / COMPLETED with iteration lines) -> no failure.
 4. log signatures, in FAILURE_CLASSES order: a configuration error (argparse, or a traceback Megatron's
    validation raised: `config_errors`) -> INVALID_CONFIG; CUDA or host OOM; NCCL watchdog (group mapped
    to EP/DP/PP/CP from Megatron's process-group names); any other traceback -> CRASH. Root causes before
    symptoms: when one rank dies of a bad config or an OOM, its peers wait in a collective until the NCCL
    watchdog fires.
 5. the remaining Slurm evidence: a plain cancel (epilogue without reason, or sacct CANCELLED) ->
    CANCELLED. It comes after the log signatures on purpose: the orchestrator cancels a job that hangs
    after one rank OOMed or timed out in NCCL, and that signature is the real cause.
 6. non-zero exit code or sacct FAILED -> CRASH; no iteration line and nothing known -> NO_OUTPUT.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from orchestrator.core.failures import FAILURE_CLASSES, TABLE, Failure, retried_by_default
from orchestrator.core.result import JobResult
from orchestrator.core.states import AttemptState
from orchestrator.evidence.parse import parse_bytes
from orchestrator.evidence.records import ParsedLog, TracebackRecord, ValidationError

# Slurm's evidence, from the table: (epilogue reason | sacct state) -> class.
_EPILOGUE = {r: fc.name for fc in TABLE if fc.slurm_first for r in fc.epilogue}
_SACCT: dict[str, Failure] = {s: fc.name for fc in TABLE if fc.slurm_first for s in fc.sacct}
_EPILOGUE_LATE = {r: fc.name for fc in TABLE if not fc.slurm_first for r in fc.epilogue}
_LATE = tuple(fc for fc in TABLE if not fc.slurm_first and (fc.sacct or fc.exit_code))  # after the logs
_DETAIL_MAX = 500

# Where Megatron validates a configuration: an AssertionError/ValueError raised here is INVALID_CONFIG.
VALIDATION_SOURCES = (
    "arguments.py",
    "transformer_config.py",
    "model_parallel_config.py",
    "parallel_state.py",
    "num_microbatches_calculator.py",
    "yaml_arguments.py",
    "initialize.py",
    "config.py",
)
VALIDATION_WORDS = (
    "divisible",
    "must be",
    "should be",
    "not supported",
    "is not compatible",
    "cannot be",
    "requires",
    "only supported",
    "must have",
    "not allowed",
)
# Layout errors Megatron raises only once training starts (schedules.py, moe_layer.py): still the
# configuration's fault, whatever the exception type.
RUNTIME_CONFIG_ERRORS = (
    "dependency bubbles",  # M % microbatch group not 0 and < PP (interleaved schedule)
    "contiguous micro-batches in a virtual pipeline stage",  # group outside [PP, M]
    "without also enabling sequence parallelism",  # MoE with TP > 1 and no SP
)


@dataclass(frozen=True)
class Classification:
    failure_class: str | None  # one of FAILURE_CLASSES, None = success
    detail: str  # the evidence line
    nccl_group: str | None = None  # EP | DP | PP | CP | TP when the log names the group
    source: str = ""  # slurm-line | sacct | log | exit-code | none
    rank: int | None = None

    @property
    def retryable(self) -> bool:
        """Whether the default retry policy resubmits this class (orchestrator.core.failures)."""
        return retried_by_default(self.failure_class)

    @property
    def unexplained(self) -> bool:
        """A crash or no-output verdict that no log line explains (an exit code, a sacct state)."""
        return self.failure_class in (Failure.CRASH, Failure.NO_OUTPUT, Failure.PROBE_FAILED) and self.source != "log"

    def with_stderr(self, head: str) -> Classification:
        """This verdict with the first lines the job wrote to stderr appended to its detail (when
        `unexplained`), so the ledger says more than "exit code 1"."""
        if not head or not self.unexplained:
            return self
        return replace(self, detail=_cut(f"{self.detail}; stderr: {head}"))

    def apply(self, result: JobResult) -> JobResult:
        result.failure_class = self.failure_class
        result.failure_detail, result.nccl_group = self.detail, self.nccl_group
        result.ok = self.failure_class is None
        return result


def is_config_error(exc_type: str, message: str, last_frame: str | None) -> bool:
    """Whether an exception says the configuration is wrong (not the code, the data or the machine)."""
    short = exc_type.rsplit(".", 1)[-1]
    if short in ("AssertionError", "ValueError", "RuntimeError") and any(p in message for p in RUNTIME_CONFIG_ERRORS):
        return True
    if short not in ("AssertionError", "ValueError"):
        return False
    if "is not divisible" in message or "should be divisible" in message:
        return True
    in_config_code = bool(last_frame and any(s in last_frame for s in VALIDATION_SOURCES))
    return in_config_code or any(w in message for w in VALIDATION_WORDS)


def config_errors(log: ParsedLog) -> list[ValidationError]:
    """The configuration errors one log shows: argparse's usage errors, then the tracebacks that are
    Megatron's validation (`is_config_error`)."""
    return list(log.validation_errors) + [_as_validation(t) for t in log.tracebacks if _is_config(t)]


def _is_config(t: TracebackRecord) -> bool:
    return is_config_error(t.exc_type, t.message, t.last_frame)


def _as_validation(t: TracebackRecord) -> ValidationError:
    return ValidationError(t.exc_type.rsplit(".", 1)[-1], t.message, t.line, t.last_frame, t.rank)


def normalize_state(state: str | None) -> str:
    """'CANCELLED by 1000' -> CANCELLED, 'CANCELLED+' -> CANCELLED, ' timeout ' -> TIMEOUT."""
    if not state:
        return ""
    return AttemptState.parse(state) if state.strip() else ""


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
    return Classification(cls, _cut(detail), group, source, rank)


# ---------------------------------------------------------------------------------- log evidence
def _invalid(logs: list[ParsedLog]) -> Classification | None:
    invalid = [v for log in logs for v in config_errors(log)]
    return _make(Failure.INVALID_CONFIG, invalid[0].line, "log", rank=invalid[0].rank) if invalid else None


def _oom(logs: list[ParsedLog]) -> Classification | None:
    ooms = [o for log in logs for o in log.ooms]
    if not ooms:
        return None
    o = next((o for o in ooms if o.kind == "cuda"), ooms[0])
    return _make(Failure.OOM, o.line, "log", rank=o.rank)


def _nccl(logs: list[ParsedLog]) -> Classification | None:
    records = [n for log in logs for n in log.nccl]
    if not records:
        return None
    caught = [r for r in records if r.kind == "caught"]
    first = caught[0] if caught else records[0]
    named = [r for r in records if r.process_group and r.process_group != "default_pg"]
    same = [r for r in named if r.rank == first.rank and (first.seq_num is None or r.seq_num in (None, first.seq_num))]
    pick = next(iter(same or named), None)
    group = nccl_group_of(pick.process_group) if pick else None
    detail = first.line
    if pick is not None and pick.process_group and pick.process_group not in detail:
        detail = f"{detail} [{pick.process_group}]"
    if group is None and first.op_type and first.op_type.upper().startswith("ALLTOALL"):
        group = "EP"  # Megatron's only NCCL all-to-all is the MoE token dispatch over EP
        detail += " [group inferred from OpType]"
    return _make(Failure.NCCL_TIMEOUT, detail, "log", group=group, rank=first.rank)


def _crash(logs: list[ParsedLog]) -> Classification | None:
    tracebacks = [t for log in logs for t in log.tracebacks]
    if not tracebacks:
        return None
    t = tracebacks[0]
    where = f" (at {t.last_frame})" if t.last_frame else ""
    return _make(Failure.CRASH, t.line + where, "log", rank=t.rank)


# How each class with log evidence (orchestrator.core.failures, `log`) reads it; tried in the table's order.
FROM_LOG: dict[str, Callable[[list[ParsedLog]], Classification | None]] = {
    Failure.INVALID_CONFIG: _invalid,
    Failure.OOM: _oom,
    Failure.NCCL_TIMEOUT: _nccl,
    Failure.CRASH: _crash,
}


# ---------------------------------------------------------------------------------------- classify
# A probe's failures that say nothing about the layout (a crash in the fake process group or the probe mode, or
# no output): PROBE_FAILED. Megatron's validation (INVALID_CONFIG) is the argv's, as at scale; an OOM stays one.
PROBE_ONLY = (Failure.CRASH, Failure.NO_OUTPUT)


def as_probe(verdict: Classification) -> Classification:
    """A rank probe's verdict (orchestrator/evidence/collect.py): its crash or silence is PROBE_FAILED."""
    if verdict.failure_class in PROBE_ONLY:
        return replace(verdict, failure_class=Failure.PROBE_FAILED, detail=_cut(f"probe: {verdict.detail}"))
    return verdict


def classify(
    logs: Sequence[ParsedLog],
    slurm_state: str | None = None,
    exit_code: int | None = None,
    stderr_tail: bytes | str | Iterable[str] | None = None,
) -> Classification:
    """Classify one attempt from every rank's parsed output plus Slurm's view of it (a rank probe's: then
    `as_probe`)."""
    logs = list(logs)
    if stderr_tail:
        if isinstance(stderr_tail, str):
            stderr_tail = stderr_tail.encode("utf-8", "replace")
        elif not isinstance(stderr_tail, bytes):
            stderr_tail = "\n".join(stderr_tail).encode("utf-8", "replace")
        logs.append(parse_bytes(stderr_tail if stderr_tail.endswith(b"\n") else stderr_tail + b"\n"))
    said = (slurm_state or "").strip()

    cancels = [c for log in logs for c in log.slurm_cancels]
    for c in cancels:
        if c.reason in _EPILOGUE:
            return _make(_EPILOGUE[c.reason], c.line, "slurm-line")
    state = normalize_state(slurm_state)
    if state in _SACCT:
        return _make(_SACCT[state], f"sacct state {said}", "sacct")

    has_iters = any(log.iterations for log in logs)
    # A run with iteration lines is healthy only if nothing says it failed: a FAILED sacct state wins over
    # an exit code of 0 (a wrapper that caught the task's exception exits 0), and so does CANCELLED: sacct
    # gives a job scancel stopped the ExitCode "0:15" (status 0, signal 15), so its exit code alone reads 0.
    if (
        has_iters
        and state not in (AttemptState.FAILED, AttemptState.CANCELLED)
        and (exit_code == 0 or (exit_code is None and state == AttemptState.COMPLETED))
    ):
        return _make(None, "", "none")

    for fc in TABLE:
        found = FROM_LOG[fc.name](logs) if fc.log else None
        if found is not None:
            return found

    if cancels:  # a cancel no class above claims: with no reason, or one the table does not name
        c = cancels[0]
        return _make(_EPILOGUE_LATE.get(c.reason, _EPILOGUE_LATE[""]), c.line, "slurm-line")
    for fc in _LATE:
        if fc.exit_code and exit_code not in (None, 0):
            return _make(fc.name, f"exit code {exit_code}" + (f", sacct state {state}" if state else ""), "exit-code")
        if state in fc.sacct:
            return _make(fc.name, f"sacct state {said}", "sacct")
    if not has_iters:
        return _make(Failure.NO_OUTPUT, "no iteration line and no known failure signature", "none")
    return _make(None, "", "none")
