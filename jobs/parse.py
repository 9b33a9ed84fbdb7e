"""Streaming parser for Megatron-LM / torch / Slurm job output -> typed records.

Why streaming and bytes-level: a long job writes hundreds of MB per rank file, mostly noise and timer
rows. The file is read in 32 MB chunks (cut before the last iteration line, so no timer block is
split); a dozen keywords are found with `bytes.find` over the whole chunk (C speed), and only lines
holding one are decoded and regex-matched. Timer rows are kept as bytes and converted to floats when
first read (`TimerBlock.timers`). Formats are the ones Megatron prints (training.py iteration line,
common_utils.report_memory, core/timers.py, core/utils.py straggler, training/utils [OOM]), torch's
ProcessGroupNCCL watchdog, and slurmstepd's `*** JOB ... CANCELLED AT ... ***` epilogue.

Robust to: `srun -l` prefixes (`12: `), torchrun prefixes (`[rank3]:`, `[default3]:`), logging
prefixes (`INFO:megatron.core.timers:`), carriage returns, missing optional fields, non-UTF-8 bytes
(decoded with errors="replace" and counted as garbage) and a truncated last line (no newline): that
line is only searched for failure signatures, never for metrics, and `ParsedLog.truncated` is set.

The twin (simulated workload) prints ordinary Megatron-format lines plus note lines that start with
SIMULATED_MARKER; any such line makes `ParsedLog.simulated` true.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

SIMULATED_MARKER = "[SIMULATED]"
_SIM_B = SIMULATED_MARKER.encode()

__all__ = [
    "SIMULATED_MARKER",
    "EventRecord",
    "IterationRecord",
    "MemoryRecord",
    "NcclTimeoutRecord",
    "OOMRecord",
    "ParsedLog",
    "SimulatedMarker",
    "SlurmCancelRecord",
    "StragglerRanksRecord",
    "StragglerRecord",
    "TimerBlock",
    "TracebackRecord",
    "ValidationError",
    "parse_bytes",
    "parse_file",
    "parse_stream",
    "rank_from_path",
]


# --------------------------------------------------------------------------- records
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
    """A configuration rejected by Megatron's argument/config validation (or argparse)."""

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
    """Everything one output file said, by record type, plus parse-health counters."""

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

    @property
    def simulated(self) -> bool:
        return bool(self.simulated_markers)

    def add(self, rec: Record) -> None:
        getattr(self, _BUCKET[type(rec)]).append(rec)


_BUCKET = {
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

# --------------------------------------------------------------------------- regexes
_SRUN_PREFIX = re.compile(rb"\s*(\d+): ")
_TORCHRUN_PREFIX = re.compile(rb"\[(?:rank|default)(\d+)\]:")
_LOGGING_PREFIX = re.compile(rb"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]+:")
_ITER_HEAD = re.compile(r"(?:\[([0-9-]+ [0-9:.]+)\] )?iteration\s+(\d+)/\s*(\d+) \|")
_MEMORY = re.compile(r"\[Rank (\d+)\] (.*?)memory \(MB\)((?: \| [a-z ]+: [-0-9.e+naif]+)+)\s*$")
_AFTER_ITERS = re.compile(r"\(after (\d+) iterations\)")
_STRAG_FIELD = re.compile(r"(\w+)/Rnk: ([-0-9.]+|nan|inf)([A-Za-z%]*)/(\d+)")
_STRAG_TS = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]")
_STRAG_RANKS = re.compile(r"\^\^\^\^ (Bottom|Top)\s+\d+ Ranks")
_STRAG_ENTRY = re.compile(r"([-0-9.]+)TF/(\d+)")
_SLURM = re.compile(r"\*\*\* (JOB|STEP) (\S+)(?: ON (\S+))? CANCELLED AT (\S+)(?: DUE TO ([^*]*?))?\s*\*\*\*")
_NCCL_CAUGHT = re.compile(r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+)[^)]*?Timeout\(ms\)=(\d+)\) ran for (\d+) milliseconds")
_NCCL_PG = re.compile(r"\[PG (?:ID )?(\d+)(?: PG GUID ([^\s(\]]+))?\s*(?:\(([^)]*)\))? Rank (\d+)\]")
_NCCL_DETECTED = re.compile(
    r"detected by watchdog at work(?: sequence id)?: (\d+),?(?: PG status:)? last enqueued "
    r"(?:NCCL )?work: (-?\d+), last completed (?:NCCL )?work: (-?\d+)"
)
_NCCL_STUCK = re.compile(r"watchdog got stuck for (\d+) seconds")
_TRIED = re.compile(r"Tried to allocate ([0-9.]+ ?[KMGT]i?B)")
_OOM_SNAPSHOT = re.compile(r"\[OOM\] rank (\d+) saved memory snapshot to (\S+)")
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))(?:: (.*))?$")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')
_EVENT = re.compile(r"\[([^\[\]]+)\] datetime: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)")
_ARGPARSE = re.compile(r"^\S+\.py: error: (.+)$")
_RANK_IN_PATH = re.compile(r"rank[-_]?(\d+)")

_TIMER_HEADERS = (
    (b"(min, max) time across ranks (ms):", "minmax"),
    (b"max time across ranks (ms):", "max"),
    (b"times across ranks (ms):", "all"),
)
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

_ITER_KEYS = {
    "consumed samples": ("consumed_samples", int),
    "skipped samples": ("skipped_samples", int),
    "elapsed time per iteration (ms)": ("elapsed_ms", float),
    "throughput per GPU (TFLOP/s/GPU)": ("tflops_per_gpu", float),
    "energy per GPU (J/iter/GPU)": ("energy_j_per_gpu", float),
    "power per GPU (W/GPU)": ("power_w_per_gpu", float),
    "learning rate": ("learning_rate", float),
    "global batch size": ("global_batch_size", int),
    "loss scale": ("loss_scale", float),
    "grad norm": ("grad_norm", float),
    "num zeros": ("num_zeros", float),
    "params norm": ("params_norm", float),
    "number of skipped iterations": ("skipped_iterations", int),
    "number of nan iterations": ("nan_iterations", int),
}
_MEM_KEYS = {
    "allocated": "allocated",
    "max allocated": "max_allocated",
    "reserved": "reserved",
    "max reserved": "max_reserved",
    "total device memory used": "total_device_used",
}


def _timestamp(s: bytes, end: int) -> str | None:
    """The `[YYYY-MM-DD HH:MM:SS.ffffff]` just before `iteration`, if any."""
    i = s.rfind(b"[", 0, end)
    j = s.find(b"]", i, end)
    return s[i + 1 : j].decode("ascii", "replace") if i >= 0 and j > i else None


def _dec(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _is_validation(exc_type: str, message: str, last_frame: str | None) -> bool:
    short = exc_type.rsplit(".", 1)[-1]
    if short in ("AssertionError", "ValueError", "RuntimeError") and any(p in message for p in RUNTIME_CONFIG_ERRORS):
        return True
    if short not in ("AssertionError", "ValueError"):
        return False
    if "is not divisible" in message or "should be divisible" in message:
        return True
    in_config_code = bool(last_frame) and any(s in last_frame for s in VALIDATION_SOURCES)
    return in_config_code or any(w in message for w in VALIDATION_WORDS)


# --------------------------------------------------------------------------- parser
# A line is looked at only if it contains one of these (found with bytes.find over whole chunks,
# so the ~all of a log that is noise or timer rows costs one C scan per keyword).
_KEYWORDS = (
    b"consumed samples:",
    b"memory",  # memory (MB) line, CUDA out of memory, [OOM] snapshot, cgroup out-of-memory kill
    b"across ranks (ms):",
    b"MnRtt/Rnk: ",
    b"^^^^",
    b"] datetime: ",
    _SIM_B,
    b"CANCELLED",
    b"atchdog",
    b"Traceback",
    b"rror",  # rror: XError lines and argparse `: error:`
)
_TRACEBACK_KEYWORDS = (b'File "', b"Exception")  # only while a traceback can be open
_CHUNK = 32 << 20
_BLOCK_MAX = 1 << 20  # a (min, max) block is a few KB; only a huge per-rank "all" block can be split
# Row: 4 spaces, `name + ' '` padded with dots to 48 chars, `: (min, max)` or `: max`. The padded
# name is captured raw and cleaned once per distinct name (cache), which keeps the regex trivial.
_ROW_MINMAX = re.compile(rb"    ([^:\n]+): \(([^,\n]+), ([^)\n]+)\)")
_ROW_NAME = re.compile(rb"\n    ([^ \n]+)")  # Megatron timer names have no spaces
_ROW_VALUES = re.compile(rb": \(([^,\n]+), ([^)\n]+)\)")
_ROW_MAX = re.compile(rb"    ([^:\n]+): ([-+0-9.eE]+|nan|inf)[ \t\r]*$", re.M)
_ITER_STRICT = re.compile(
    rb"()iteration\s+(\d+)/\s*(\d+) \| consumed samples:\s+(\d+) \|"  # literal-led: fast search
    rb"(?: skipped samples:\s+(\d+) \|)?"
    rb" elapsed time per iteration \(ms\): ([^ |]+) \|"
    rb"(?: throughput per GPU \(TFLOP/s/GPU\): ([^ |]+) \|)?"
    rb"(?: energy per GPU \(J/iter/GPU\): ([^ |]+) \| power per GPU \(W/GPU\): ([^ |]+) \|)?"
    rb"(?: learning rate: ([^ |]+) \|)?"
    rb" global batch size:\s+(\d+) \|"
    rb"((?: [^|:]+: [^ |]+ \|)*?)"  # losses and MoE metrics: any `name: value`
    rb" loss scale: ([^ |]+) \|"
    rb"(?: grad norm: ([^ |]+) \|)?(?: num zeros: ([^ |]+) \|)?(?: params norm: ([^ |]+) \|)?"
    rb" number of skipped iterations:\s+(\d+) \| number of nan iterations:\s+(\d+) \|"
)
_ITER_LOSS = re.compile(rb" ([^|:]+): ([^ |]+) \|")
_ITER_FIELD = re.compile(r" ([^|:]+): ([^|]+?) (?=\|)")
_NON_ASCII = re.compile(rb"[\x80-\xff\x00]")


class _Parser:
    """Chunked scanner plus a small per-source state machine (open traceback), keyed by the rank
    prefix so interleaved `srun -l` output from many ranks does not mix tracebacks or timer rows."""

    def __init__(self, source_rank: int | None = None) -> None:
        self.source_rank = source_rank
        self.lines = 0
        self.bytes = 0
        self.garbage = 0
        self.truncated = False
        self.last_iteration: int | None = None
        self._tb: dict[int | None, list[str]] = {}  # open traceback frames per source
        self._iteration_lines: set = set()
        self._row_re: dict[bytes, re.Pattern[bytes]] = {}

    # ---- chunks
    def chunk(self, buf: bytes, final: bool) -> tuple[list[Record], bytes]:
        """Parse the complete part of `buf`; return (records, unparsed rest to prepend next time)."""
        if not final:
            cut = self._safe_cut(buf)
            work, rest = buf[:cut], buf[cut:]
        else:
            work, rest = buf, b""
        tail = b""
        if final and work and not work.endswith(b"\n"):
            i = work.rfind(b"\n") + 1
            work, tail = work[:i], work[i:]
        out: list[Record] = []
        if work:
            self.lines += work.count(b"\n")
            self.bytes += len(work)
            self._count_garbage(work)
            candidates = self._candidates(work)
            iteration_lines = self._iteration_lines
            for ls in candidates:
                le = work.find(b"\n", ls)
                if le < 0:
                    le = len(work)
                if ls in iteration_lines:  # hot path: most candidates are iteration lines
                    raw = work[ls:le]
                    src, s, _ = self._prefix(raw)
                    if (
                        src not in self._tb
                        and b"iteration" in s
                        and b"\r" not in raw
                        and b"\x00" not in raw
                        and not s.startswith(_SIM_B)
                    ):
                        rec = self._iteration(s, src)
                        if rec is not None:
                            out.append(rec)
                        continue
                out.extend(self._candidate(work, ls, le))
        if tail:
            self.truncated = True
            self.lines += 1
            self.bytes += len(tail)
            self._count_garbage(tail)
            for seg in tail.replace(b"\x00", b"").split(b"\r"):
                if seg:
                    seg_src, seg_s, _ = self._prefix(seg)
                    out.extend(self._line(seg_s, seg_src, complete=False))
        if final:
            self._tb.clear()  # a traceback with no exception line (killed): nothing to report
        return out, rest

    @staticmethod
    def _safe_cut(buf: bytes) -> int:
        """Cut before the last iteration line: timer blocks follow iteration lines, so no block
        (or its interleaved rows) is split between chunks. Without one, cut before the last
        timer header, else at the last newline."""
        i = buf.rfind(b"consumed samples:")
        if i > 0:
            ls = buf.rfind(b"\n", 0, i) + 1
            if ls > 0:
                return ls
        h = buf.rfind(b"across ranks (ms):")
        if h >= 0 and len(buf) - h < _BLOCK_MAX:  # keep a block that may go on whole (0 = wait)
            return buf.rfind(b"\n", 0, h) + 1
        return buf.rfind(b"\n") + 1

    def _count_garbage(self, work: bytes) -> None:
        if work.isascii() and b"\x00" not in work:
            return
        pos = 0
        while (m := _NON_ASCII.search(work, pos)) is not None:  # one check per line, not per byte
            ls = work.rfind(b"\n", 0, m.start()) + 1
            le = work.find(b"\n", m.start())
            le = len(work) if le < 0 else le
            pos = le + 1
            line = work[ls:le]
            if b"\x00" in line:
                self.garbage += 1
                continue
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                self.garbage += 1

    def _candidates(self, work: bytes) -> list[int]:
        """Sorted starts of lines holding a keyword; `_iteration_lines` gets those holding the
        iteration line's keyword (the chunk loop sends them straight to `_iteration`)."""
        starts: set = set()
        find, rfind = work.find, work.rfind
        traceback = bool(self._tb)
        for kw in _KEYWORDS + _TRACEBACK_KEYWORDS:
            if kw is _TRACEBACK_KEYWORDS[0] and not traceback:
                break  # frames and `...Exception:` lines matter only inside a traceback
            i = find(kw)
            if i >= 0 and kw == b"Traceback":
                traceback = True
            if kw is _KEYWORDS[0]:
                first = i
                while i >= 0:
                    ls = rfind(b"\n", 0, i) + 1
                    starts.add(ls)
                    le = find(b"\n", i)
                    i = find(kw, le) if le >= 0 else -1
                self._iteration_lines = set(starts) if first >= 0 else set()
                continue
            while i >= 0:
                ls = rfind(b"\n", 0, i) + 1
                starts.add(ls)
                le = find(b"\n", i)
                if le < 0:
                    break
                i = find(kw, le)
        return sorted(starts)

    def _prefix(self, s: bytes) -> tuple[int | None, bytes, bytes]:
        """(source rank, content, raw rank prefix) with srun/torchrun/logging prefixes removed."""
        src = self.source_rank
        pre = b""
        if s[:1] == b"[" and (s.startswith(b"[rank") or s.startswith(b"[default")):
            m = _TORCHRUN_PREFIX.match(s)
            if m:
                src, pre, s = int(m.group(1)), s[: m.end()], s[m.end() :]
        elif s[:1].isdigit() or (s[:1] == b" " and s.lstrip(b" ")[:1].isdigit()):
            m = _SRUN_PREFIX.match(s)
            if m:
                src, pre, s = int(m.group(1)), s[: m.end()], s[m.end() :]
                m = _TORCHRUN_PREFIX.match(s)
                if m:
                    src, pre, s = int(m.group(1)), pre + s[: m.end()], s[m.end() :]
        if s[:4] in (b"INFO", b"WARN", b"ERRO", b"DEBU", b"CRIT"):
            m = _LOGGING_PREFIX.match(s)
            if m:
                s = s[m.end() :]
        return src, s, pre

    def _candidate(self, work: bytes, ls: int, le: int) -> list[Record]:
        raw = work[ls:le]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if b"\x00" in raw:
            raw = raw.replace(b"\x00", b"")
        src, s, pre = self._prefix(raw)
        if b"across ranks (ms):" in s and src not in self._tb:
            out_h: list[Record] = []
            if s.startswith(_SIM_B):
                out_h.append(SimulatedMarker(_dec(s[len(_SIM_B) :]).strip(), rank=src))
            for header, kind in _TIMER_HEADERS:
                if header in s:
                    out_h.append(self._timer_block(work, le, kind, src, pre))
                    return out_h
        if b"\r" in s:  # progress bars: each \r-separated segment is its own line
            out: list[Record] = []
            for seg in s.split(b"\r"):
                if seg:
                    out.extend(self._line(seg, src, True))
            return out
        return self._line(s, src, True)

    # ---- one logical line (prefixes removed)
    def _line(self, s: bytes, src: int | None, complete: bool = True) -> list[Record]:
        out: list[Record] = []
        if s.startswith(_SIM_B):  # a marker line; whatever follows the marker is read as usual
            out.append(SimulatedMarker(_dec(s[len(_SIM_B) :]).strip(), rank=src))
            s = s[len(_SIM_B) :].lstrip(b" ")
            if not s:
                return out
        if src in self._tb:
            if s.startswith(b" ") or not s.strip():
                if s.lstrip().startswith(b'File "'):
                    self._tb[src].append(_dec(s))
                return out
            exc = self._exception(s, src, self._tb.pop(src))
            if exc:  # the exception line may also be an OOM / NCCL signature
                return out + exc + self._signatures(s, src, exception_done=True)
            # not an exception line: the traceback was cut short; read the line normally
        if complete:
            metric = self._metric(s, src)
            if metric is not None:  # a metric line (a record, or nothing if it was mangled)
                return out + metric
        out.extend(self._signatures(s, src, exception_done=False))
        return out

    def _metric(self, s: bytes, src: int | None) -> list[Record] | None:
        """Records of a metric line; None if `s` is not one. Only complete lines get here."""
        rec: Record | None
        if b"consumed samples:" in s and b"iteration" in s:
            rec = self._iteration(s, src)
        elif b"memory (MB)" in s and b"[Rank " in s:
            rec = self._memory(s)
        elif b"MnRtt/Rnk: " in s:
            rec = self._straggler(s, src)
        elif s.startswith(b"^^^^ "):
            rec = self._straggler_ranks(s, src)
        elif b"] datetime: " in s:
            m = _EVENT.search(_dec(s))
            rec = EventRecord(m.group(1), m.group(2), rank=src) if m else None
        else:
            return None
        return [rec] if rec is not None else []

    def _signatures(self, s: bytes, src: int | None, exception_done: bool) -> list[Record]:
        out: list[Record] = []
        if b"*** " in s and b"CANCELLED" in s:
            t = _dec(s)
            m = _SLURM.search(t)
            if m:
                reason = (m.group(5) or "").strip()
                if reason.startswith("NODE FAILURE"):
                    reason = "NODE FAILURE"
                out.append(SlurmCancelRecord(m.group(1), m.group(2), m.group(3), m.group(4), reason, t.strip()))
            return out
        if b"oom-kill" in s or b"oom_kill" in s or b"xceeded job memory limit" in s:
            out.append(OOMRecord("host", _dec(s).strip(), rank=src))
            return out
        if b"out of memory" in s:
            t = _dec(s).strip()
            if "CUDA out of memory" in t:
                m = _TRIED.search(t)
                out.append(OOMRecord("cuda", t, rank=src, tried_to_allocate=m.group(1) if m else None))
        elif b"[OOM] rank" in s:
            t = _dec(s).strip()
            m = _OOM_SNAPSHOT.search(t)
            if m:
                out.append(OOMRecord("snapshot", t, rank=int(m.group(1)), snapshot_path=m.group(2)))
            return out
        if b"atchdog" in s:
            rec = self._nccl(_dec(s).strip(), src)
            if rec is not None:
                out.append(rec)
        if b"Traceback (most recent call last)" in s:
            self._tb[src] = []
            return out
        if exception_done:
            return out
        if b": error: " in s:
            m = _ARGPARSE.match(_dec(s).strip())
            if m:
                out.append(ValidationError("argparse", m.group(1), m.group(0), rank=src))
                return out
        if b"Error" in s or b"Exception" in s or b"Interrupt" in s:
            out.extend(self._exception(s, src, None))
        return out

    # ---- record builders
    def _iteration(self, s: bytes, src: int | None) -> IterationRecord | None:
        m = _ITER_STRICT.search(s)
        if m is not None:  # fast path: Megatron's own field order, one regex, no decode
            g = m.groups()
            losses = {}
            for k, v in _ITER_LOSS.findall(g[11]):
                with contextlib.suppress(ValueError):
                    losses[_name(k)] = float(v)
            rec = IterationRecord(
                int(g[1]),
                int(g[2]),
                int(g[3]),
                float(g[5]),
                int(g[10]),
                losses,
                None if g[4] is None else int(g[4]),
                None if g[6] is None else float(g[6]),
                None if g[7] is None else float(g[7]),
                None if g[8] is None else float(g[8]),
                None if g[9] is None else float(g[9]),
                float(g[12]),
                None if g[13] is None else float(g[13]),
                None if g[14] is None else float(g[14]),
                None if g[15] is None else float(g[15]),
                int(g[16]),
                int(g[17]),
                _timestamp(s, m.start()),
                src,
            )
            self.last_iteration = rec.iteration
            return rec
        return self._iteration_generic(s, src)

    def _iteration_generic(self, s: bytes, src: int | None) -> IterationRecord | None:
        """Any field order / unknown extra fields (e.g. RL packing info)."""
        t = _dec(s)
        m = _ITER_HEAD.search(t)
        if m is None or "number of nan iterations" not in t:
            self.garbage += 1
            return None
        vals: dict[str, object] = {}
        losses: dict[str, float] = {}
        try:
            for key, val in _ITER_FIELD.findall(t, m.end()):
                spec = _ITER_KEYS.get(key)
                if spec is not None:
                    vals[spec[0]] = spec[1](val)
                else:
                    try:
                        losses[key] = float(val)
                    except ValueError:
                        pass  # non-numeric extras (e.g. RL packing info) are not metrics
            rec = IterationRecord(
                iteration=int(m.group(2)),
                train_iters=int(m.group(3)),
                consumed_samples=vals.pop("consumed_samples"),
                elapsed_ms=vals.pop("elapsed_ms"),
                losses=losses,
                timestamp=m.group(1),
                rank=src,
                **vals,
            )
        except (KeyError, ValueError, TypeError):
            self.garbage += 1
            return None
        self.last_iteration = rec.iteration
        return rec

    def _memory(self, s: bytes) -> MemoryRecord | None:
        t = _dec(s)
        m = _MEMORY.search(t)
        if m is None:
            self.garbage += 1
            return None
        vals: dict[str, float] = {}
        for part in m.group(3).split("|"):
            key, sep, val = part.partition(":")
            name = _MEM_KEYS.get(key.strip())
            if sep and name:
                vals[name] = float(val)
        a = _AFTER_ITERS.search(m.group(2))
        try:
            return MemoryRecord(rank=int(m.group(1)), after_iterations=int(a.group(1)) if a else None, **vals)
        except TypeError:
            self.garbage += 1
            return None

    def _timer_block(self, work: bytes, pos: int, kind: str, src: int | None, pre: bytes) -> TimerBlock:
        """Rows follow the header (`pos` = its newline). Fast path: one regex over the run of
        consecutive rows with the header's own prefix; if another rank's line interrupts the run,
        walk on line by line, taking only this source's rows, until this source prints a non-row."""
        blk = TimerBlock(kind=kind, after_iteration=self.last_iteration, rank=src)
        if kind != "all":
            run = self._row_re.get(pre)
            if run is None:
                run = self._row_re[pre] = re.compile(rb"(?:\n" + re.escape(pre) + rb"    [^\n]*)*")
            m = run.match(work, pos)
            region = m.group(0)
            blk.raw = region.replace(b"\n" + pre, b"\n") if pre else region
            pos = m.end()
            if not pre or not work.startswith(b"\n", pos) or work.startswith(b"\n" + pre, pos):
                return blk  # not interleaved: the block ended at a non-row line of its own source
            nxt = work.find(b"\n" + pre, pos)
            if nxt < 0 or not work.startswith(b"    ", nxt + 1 + len(pre)):
                return blk  # this source's next line is not a row: the block is complete
        self._walk_rows(blk, work, pos, pre)
        return blk

    def _walk_rows(self, blk: TimerBlock, work: bytes, pos: int, pre: bytes) -> None:
        """Rows of this source (lines starting with its own prefix `pre`), skipping other ranks'
        lines, until this source prints a non-row (or 10,000 foreign lines pass)."""
        name: str | None = None
        foreign = 0
        n, k = len(work), len(pre)
        rows: list[bytes] = [blk.raw] if blk.raw else []
        mark = b"    " if blk.kind == "max" else b": ("
        while pos < n and foreign < 10000:
            ls = pos + 1
            le = work.find(b"\n", ls)
            if le < 0:
                le = n
            pos = le
            if not work.startswith(pre, ls):
                foreign += 1
                continue
            s = work[ls + k : le].rstrip(b"\r")
            if blk.kind == "all":
                st = s.strip()
                if s.startswith(b"     rank ") and b": " in s and name is not None:
                    r, _, v = st[5:].partition(b":")
                    try:
                        blk.per_rank[name][int(r)] = float(v)
                        continue
                    except ValueError:
                        break
                if s.startswith(b"  ") and st.endswith(b":") and b" " not in st:
                    name = _dec(st[:-1])
                    blk.per_rank[name] = {}
                    continue
                break
            if not s.startswith(b"    ") or mark not in s or b": " not in s:
                break
            rows.append(b"\n" + s)
        blk.raw = b"".join(rows)

    def _straggler(self, s: bytes, src: int | None) -> StragglerRecord | None:
        t = _dec(s)
        fields = {m.group(1): (float(m.group(2)), m.group(3), int(m.group(4))) for m in _STRAG_FIELD.finditer(t)}
        if "MnRtt" not in fields and "MxRtt" not in fields:
            self.garbage += 1
            return None
        ts = _STRAG_TS.search(t)

        def get(k: str) -> tuple[float | None, int | None]:
            v = fields.get(k)
            return (v[0], v[2]) if v else (None, None)

        mn, mnr = get("MnRtt")
        mx, mxr = get("MxRtt")
        emn, emnr = get("MnEtpt")
        emx, emxr = get("MxEtpt")
        return StragglerRecord(
            mn, mnr, mx, mxr, emn, emnr, emx, emxr, fields, ts.group(1) if ts else None, self.last_iteration, src
        )

    def _straggler_ranks(self, s: bytes, src: int | None) -> StragglerRanksRecord | None:
        t = _dec(s)
        m = _STRAG_RANKS.search(t)
        if m is None:
            return None
        tail = t.split(":", 1)[1] if ":" in t else ""
        entries = [(float(v), int(r)) for v, r in _STRAG_ENTRY.findall(tail)]
        return StragglerRanksRecord(m.group(1).lower(), entries, src)

    def _nccl(self, t: str, src: int | None) -> NcclTimeoutRecord | None:
        pg = _NCCL_PG.search(t)
        rec: NcclTimeoutRecord | None = None
        m = _NCCL_CAUGHT.search(t)
        if m:
            rec = NcclTimeoutRecord(
                "caught",
                t,
                src,
                op_type=m.group(2),
                seq_num=int(m.group(1)),
                timeout_ms=int(m.group(3)),
                ran_ms=int(m.group(4)),
            )
        elif (m := _NCCL_DETECTED.search(t)) is not None:
            rec = NcclTimeoutRecord(
                "detected",
                t,
                src,
                seq_num=int(m.group(1)),
                last_enqueued=int(m.group(2)),
                last_completed=int(m.group(3)),
            )
        elif (m := _NCCL_STUCK.search(t)) is not None:
            rec = NcclTimeoutRecord("stuck", t, src, timeout_ms=int(m.group(1)) * 1000)
        if rec is not None and pg is not None:
            rec.pg_id = int(pg.group(1))
            rec.process_group = pg.group(3) or None
            rec.group_rank = int(pg.group(4))
        return rec

    def _exception(self, s: bytes, src: int | None, frames: list[str] | None) -> list[Record]:
        t = _dec(s).strip()
        m = _EXC_LINE.match(t)
        if m is None:
            return []  # not an exception line (a traceback cut short by a kill): nothing to claim
        exc_type, message = m.group(1), (m.group(2) or "").strip()
        last = _last_frame(frames) if frames else None
        if frames is None and (not exc_type.endswith("Error") or m.group(2) is None):
            return []  # a bare `Foo: ...` line without traceback is too weak unless it is an XError
        out: list[Record] = [TracebackRecord(exc_type, message, t, last, src)]
        if _is_validation(exc_type, message, last):
            out.append(ValidationError(exc_type.rsplit(".", 1)[-1], message, t, last, src))
        return out


_NAMES: dict[bytes, str] = {}  # timer name cache (a run has a few dozen distinct names)


def _name(raw: bytes) -> str:
    name = _NAMES.get(raw)
    if name is None:
        name = _dec(raw.rstrip(b". "))
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
                return {_name(n): (float(lo), float(hi)) for n, (lo, hi) in zip(ns, vals)}
            except ValueError:
                pass
        for n, lo, hi in _ROW_MINMAX.findall(raw):
            try:
                out[_name(n)] = (float(lo), float(hi))
            except ValueError:
                continue
        return out
    for n, hi in _ROW_MAX.findall(raw):
        out[_name(n)] = (None, float(hi))
    return out


def _last_frame(frames: list[str] | None) -> str | None:
    if not frames:
        return None
    m = _FRAME.match(frames[-1])
    if not m:
        return frames[-1].strip()
    return f"{m.group(1)}:{m.group(2)} in {m.group(3).strip()}"


# --------------------------------------------------------------------------- public API
def _chunks(src: Iterable[bytes] | object) -> Iterator[bytes]:
    """Byte chunks from a binary file object (read()) or an iterable of lines. A line without a
    trailing newline gets one unless it is the last (which then counts as truncated)."""
    read = getattr(src, "read", None)
    if read is not None:
        while True:
            data = read(_CHUNK)
            if not data:
                return
            yield data
        return
    buf: list[bytes] = []
    size = 0
    prev: bytes | None = None
    for line in src:  # type: ignore[union-attr]
        if isinstance(line, str):
            line = line.encode("utf-8", "replace")
        if prev is not None:
            buf.append(prev if prev.endswith(b"\n") else prev + b"\n")
            size += len(prev)
            if size >= _CHUNK:
                yield b"".join(buf)
                buf, size = [], 0
        prev = line
    if prev is not None:
        buf.append(prev)
    if buf:
        yield b"".join(buf)


def _run(parser: _Parser, src: Iterable[bytes]) -> Iterator[Record]:
    rest = b""
    for data in _chunks(src):
        recs, rest = parser.chunk(rest + data if rest else data, final=False)
        yield from recs
    recs, _ = parser.chunk(rest, final=True)
    yield from recs


def parse_stream(src: Iterable[bytes], source_rank: int | None = None) -> Iterator[Record]:
    """Yield records from a binary file object or an iterable of bytes lines (keep the newlines:
    a last line without one is treated as truncated)."""
    return _run(_Parser(source_rank), src)


def rank_from_path(path: str | Path) -> int | None:
    """`rank-12.out` -> 12 (the job folder's naming, see DESIGN.md)."""
    m = _RANK_IN_PATH.search(Path(path).name)
    return int(m.group(1)) if m else None


def _collect(parser: _Parser, src: Iterable[bytes], log: ParsedLog) -> ParsedLog:
    buckets = {cls: getattr(log, name) for cls, name in _BUCKET.items()}
    for rec in _run(parser, src):
        buckets[type(rec)].append(rec)
    log.lines, log.bytes = parser.lines, parser.bytes
    log.garbage_lines, log.truncated = parser.garbage, parser.truncated
    return log


def parse_file(path: str | Path, source_rank: int | None = None) -> ParsedLog:
    """Parse one output file into a ParsedLog. The rank defaults to the file name's `rank-<r>`."""
    if source_rank is None:
        source_rank = rank_from_path(path)
    with open(path, "rb", buffering=0) as f:
        return _collect(_Parser(source_rank), f, ParsedLog(path=str(path), source_rank=source_rank))


def parse_bytes(data: bytes, source_rank: int | None = None) -> ParsedLog:
    """Parse an in-memory blob (e.g. a stderr tail) the same way as a file."""
    return _collect(_Parser(source_rank), [data] if data else [], ParsedLog(source_rank=source_rank))
