"""The typed records orchestrator.evidence.parse yields from Megatron-LM / torch / Slurm output, and ParsedLog that
holds them.

Why apart from the parser: metrics, classify and collect read records without caring how they were
found, and the parser is about scanning bytes fast. One record type per thing a log can say; ParsedLog
keeps one list per type (`RECORD_LISTS` names them: orchestrator.core.failures cites them as evidence).

Timer blocks are decoded lazily (`TimerBlock.timers`): a long run prints one block per iteration and
metrics read only the measured window's, so the parser keeps each block's rows as raw bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from orchestrator.core.result import SIMULATED_MARKER  # noqa: F401 - re-exported for the parser


@dataclass(slots=True)
class IterationRecord:
    """One Megatron iteration line (printed by the last global rank every log_interval)."""

    iteration: int
    train_iters: int
    consumed_samples: int
    elapsed_ms: float  # mean over the log interval
    global_batch_size: int | None = None
    losses: dict[str, float] = field(default_factory=dict)  # lm loss, mtp_1 loss, load_balancing_loss...
    skipped_samples: int | None = None
    tflops_per_gpu: float | None = None  # Megatron's own (needs --log-throughput)
    energy_j_per_gpu: float | None = None
    power_w_per_gpu: float | None = None
    learning_rate: float | None = None
    loss_scale: float | None = None
    grad_norm: float | None = None
    num_zeros: float | None = None
    params_norm: float | None = None
    skipped_iterations: int | None = None
    nan_iterations: int | None = None
    timestamp: str | None = None
    rank: int | None = None  # source rank (srun/torchrun prefix or file name)


@dataclass(slots=True)
class MemoryRecord:
    """`[Rank r] (after k iterations) memory (MB) | ...` (DP-rank-0 GPUs only). Values in MiB."""

    rank: int
    after_iterations: int | None
    allocated: float
    max_allocated: float
    reserved: float
    max_reserved: float
    total_device_used: float | None = None


@dataclass(slots=True)
class TimerBlock:
    """One `... time across ranks (ms):` block. kind: minmax | max | all. Values: ms per iteration.

    timers maps name -> (min, max); min is None for kind "max". For kind "all", per_rank holds
    name -> {rank: ms} and timers holds the min/max over those ranks.

    Why lazy: a long run prints one block per iteration (~20 rows each, most of a log's bytes) and
    metrics read only the blocks inside the measurement window. The parser keeps the block's rows
    as raw bytes (`raw`) and `timers` converts them on first access (then caches).
    """

    kind: str
    per_rank: dict[str, dict[int, float]] = field(default_factory=dict)
    after_iteration: int | None = None  # last iteration line seen before the block, same stream
    rank: int | None = None
    raw: bytes = field(default=b"", repr=False, compare=False)  # undecoded rows, "\n    name...: v"
    _timers: dict[str, tuple[float | None, float]] | None = field(default=None, repr=False, compare=False)

    @property
    def timers(self) -> dict[str, tuple[float | None, float]]:
        if self._timers is None:
            self._timers = _decode_rows(self.kind, self.raw)
            for name, ranks in self.per_rank.items():
                if ranks:
                    self._timers[name] = (min(ranks.values()), max(ranks.values()))
        return self._timers

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TimerBlock):
            return NotImplemented
        return (self.kind, self.per_rank, self.after_iteration, self.rank, self.timers) == (
            other.kind,
            other.per_rank,
            other.after_iteration,
            other.rank,
            other.timers,
        )

    def __repr__(self) -> str:
        return (
            f"TimerBlock(kind={self.kind!r}, timers={self.timers!r}, "
            f"after_iteration={self.after_iteration!r}, rank={self.rank!r})"
        )


@dataclass(slots=True)
class StragglerRecord:
    """`--log-straggler` line from rank 0: min/max of each metric with the rank holding it."""

    min_rtt_ms: float | None
    min_rtt_rank: int | None
    max_rtt_ms: float | None
    max_rtt_rank: int | None
    min_etpt_tf: float | None = None
    min_etpt_rank: int | None = None
    max_etpt_tf: float | None = None
    max_etpt_rank: int | None = None
    fields: dict[str, tuple[float, str, int]] = field(default_factory=dict)  # MnPwr -> (v, unit, rank)
    timestamp: str | None = None
    after_iteration: int | None = None
    rank: int | None = None


@dataclass(slots=True)
class StragglerRanksRecord:
    """`^^^^ Bottom/Top k Ranks with lowest/highest Etpt(TF): v/r, ...`."""

    which: str  # bottom | top
    entries: list[tuple[float, int]] = field(default_factory=list)  # (TFLOP/s, rank)
    rank: int | None = None


@dataclass(slots=True)
class OOMRecord:
    """CUDA OOM (`kind="cuda"`), Megatron's `[OOM] rank N saved memory snapshot` (`"snapshot"`),
    or slurmstepd's cgroup oom-kill (`"host"`)."""

    kind: str
    line: str
    rank: int | None = None
    tried_to_allocate: str | None = None  # e.g. "2.00 GiB"
    snapshot_path: str | None = None
    device: int | None = None  # the local GPU index torch names ("GPU 3 has ...")
    total_capacity: str | None = None  # the device's total memory as torch states it, e.g. "96.00 GiB"


@dataclass(slots=True)
class NcclTimeoutRecord:
    """torch ProcessGroupNCCL watchdog evidence.

    kind: caught (`Watchdog caught collective operation timeout: WorkNCCL(...)`), detected
    (`Exception ... detected by watchdog at work: N`), stuck (heartbeat monitor). process_group is
    the group description from the `[PG ID i PG GUID g(NAME) Rank r]` prefix when torch prints it.
    """

    kind: str
    line: str
    rank: int | None = None  # source (global) rank
    op_type: str | None = None
    seq_num: int | None = None
    timeout_ms: int | None = None
    ran_ms: int | None = None
    pg_id: int | None = None
    process_group: str | None = None
    group_rank: int | None = None
    last_enqueued: int | None = None
    last_completed: int | None = None


@dataclass(slots=True)
class TracebackRecord:
    """A Python exception line (with its traceback when one preceded it)."""

    exc_type: str
    message: str
    line: str
    last_frame: str | None = None  # 'path:line in func'
    rank: int | None = None


@dataclass(slots=True)
class ValidationError:
    """A configuration rejected before training: argparse's usage error (the parser's only source), or a
    traceback orchestrator.evidence.classify.config_errors judges to be Megatron's validation."""

    exc_type: str  # AssertionError | ValueError | argparse
    message: str
    line: str
    last_frame: str | None = None
    rank: int | None = None


@dataclass(slots=True)
class SlurmCancelRecord:
    """slurmstepd/srun `*** JOB|STEP <id> [ON <node>] CANCELLED AT <t> [DUE TO <reason>] ***`."""

    entity: str  # JOB | STEP
    job_id: str
    node: str | None
    time: str
    reason: str  # TIME LIMIT | PREEMPTION | NODE FAILURE | JOB REQUEUE | "" (scancel) | other
    line: str


@dataclass(slots=True)
class SimulatedMarker:
    text: str
    rank: int | None = None


@dataclass(slots=True)
class EventRecord:
    """`[<event>] datetime: YYYY-mm-dd HH:MM:SS...` (init, build, train start, exit, done)."""

    name: str
    timestamp: str
    rank: int | None = None


Record = (
    IterationRecord
    | MemoryRecord
    | TimerBlock
    | StragglerRecord
    | StragglerRanksRecord
    | OOMRecord
    | NcclTimeoutRecord
    | TracebackRecord
    | ValidationError
    | SlurmCancelRecord
    | SimulatedMarker
    | EventRecord
)


@dataclass
class ParsedLog:
    """What one output file said, by record type (what of it is kept: orchestrator.evidence.keep), plus parse-health
    counters."""

    path: str | None = None
    source_rank: int | None = None
    iterations: list[IterationRecord] = field(default_factory=list)
    memory: list[MemoryRecord] = field(default_factory=list)
    timers: list[TimerBlock] = field(default_factory=list)
    stragglers: list[StragglerRecord] = field(default_factory=list)
    straggler_ranks: list[StragglerRanksRecord] = field(default_factory=list)
    ooms: list[OOMRecord] = field(default_factory=list)
    nccl: list[NcclTimeoutRecord] = field(default_factory=list)
    tracebacks: list[TracebackRecord] = field(default_factory=list)
    validation_errors: list[ValidationError] = field(default_factory=list)
    slurm_cancels: list[SlurmCancelRecord] = field(default_factory=list)
    simulated_markers: list[SimulatedMarker] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    lines: int = 0
    bytes: int = 0
    garbage_lines: int = 0  # undecodable bytes, NULs, or a line that looked like a record but was not
    truncated: bool = False  # the last line had no newline (writer killed mid-line)
    long_lines: int = 0  # lines longer than orchestrator.evidence.parse's line bound: only their head was read
    dropped: int = 0  # records the retention policy (orchestrator.evidence.keep) did not keep

    @property
    def simulated(self) -> bool:
        return bool(self.simulated_markers)

    def add(self, rec: Record) -> None:
        getattr(self, RECORD_LISTS[type(rec)]).append(rec)


RECORD_LISTS: dict[type, str] = {  # record type -> the ParsedLog list that holds it
    IterationRecord: "iterations",
    MemoryRecord: "memory",
    TimerBlock: "timers",
    StragglerRecord: "stragglers",
    StragglerRanksRecord: "straggler_ranks",
    OOMRecord: "ooms",
    NcclTimeoutRecord: "nccl",
    TracebackRecord: "tracebacks",
    ValidationError: "validation_errors",
    SlurmCancelRecord: "slurm_cancels",
    SimulatedMarker: "simulated_markers",
    EventRecord: "events",
}

# ------------------------------------------------------------------------- timer rows
# Row: 4 spaces, `name + ' '` padded with dots to 48 chars, `: (min, max)` or `: max`. The padded
# name is captured raw and cleaned once per distinct name (cache), which keeps the regex trivial.
_ROW_MINMAX = re.compile(rb"    ([^:\n]+): \(([^,\n]+), ([^)\n]+)\)")
_ROW_NAME = re.compile(rb"\n    ([^ \n]+)")  # Megatron timer names have no spaces
_ROW_VALUES = re.compile(rb": \(([^,\n]+), ([^)\n]+)\)")
_ROW_MAX = re.compile(rb"    ([^:\n]+): ([-+0-9.eE]+|nan|inf)[ \t\r]*$", re.M)
_NAMES: dict[bytes, str] = {}  # name cache (a run has a few dozen distinct timer and loss names)


def cached_name(raw: bytes) -> str:
    """A timer or loss name from its raw bytes (padding dots stripped), decoded once per distinct name."""
    name = _NAMES.get(raw)
    if name is None:
        name = raw.rstrip(b". ").decode("utf-8", "replace")
        if len(_NAMES) < 4096:
            _NAMES[raw] = name
    return name


def _decode_rows(kind: str, raw: bytes) -> dict[str, tuple[float | None, float]]:
    """Rows `\n    name ....: (min, max)` (minmax) or `\n    name ....: max` (max) -> dict.
    Rows whose numbers do not parse are skipped."""
    out: dict[str, tuple[float | None, float]] = {}
    if not raw or kind == "all":
        return out
    if kind == "minmax":
        ns = _ROW_NAME.findall(raw)
        vals = _ROW_VALUES.findall(raw)
        if len(ns) == len(vals):  # fast path: two literal-led scans instead of one row regex
            try:
                return {cached_name(n): (float(lo), float(hi)) for n, (lo, hi) in zip(ns, vals)}
            except ValueError:
                pass
        for n, lo, hi in _ROW_MINMAX.findall(raw):
            try:
                out[cached_name(n)] = (float(lo), float(hi))
            except ValueError:
                continue
        return out
    for n, hi in _ROW_MAX.findall(raw):
        out[cached_name(n)] = (None, float(hi))
    return out
