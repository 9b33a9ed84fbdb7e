"""Streaming parser for Megatron-LM / torch / Slurm job output -> typed records.

Why streaming and bytes-level: a 16k-GPU job writes hundreds of MB per rank file. Each raw line is
checked with cheap `bytes in` tests first and decoded/regex-matched only when it can be a record,
so noise costs a few substring scans. Formats are the ones Megatron prints (training.py iteration
line, common_utils.report_memory, core/timers.py, core/utils.py straggler, training/utils [OOM]),
torch's ProcessGroupNCCL watchdog, and slurmstepd's `*** JOB ... CANCELLED AT ... ***` epilogue.

Robust to: `srun -l` prefixes (`12: `), torchrun prefixes (`[rank3]:`, `[default3]:`), logging
prefixes (`INFO:megatron.core.timers:`), carriage returns, missing optional fields, non-UTF-8 bytes
(decoded with errors="replace" and counted as garbage) and a truncated last line (no newline): that
line is only searched for failure signatures, never for metrics, and `ParsedLog.truncated` is set.

The twin (simulated workload) prints ordinary Megatron-format lines plus note lines that start with
SIMULATED_MARKER; any such line makes `ParsedLog.simulated` true.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Tuple, Union

SIMULATED_MARKER = "[SIMULATED]"
_SIM_B = SIMULATED_MARKER.encode()

__all__ = [
    "SIMULATED_MARKER", "IterationRecord", "MemoryRecord", "TimerBlock", "StragglerRecord",
    "StragglerRanksRecord", "OOMRecord", "NcclTimeoutRecord", "TracebackRecord", "ValidationError",
    "SlurmCancelRecord", "SimulatedMarker", "EventRecord", "ParsedLog", "parse_stream", "parse_file",
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
    global_batch_size: Optional[int] = None
    losses: Dict[str, float] = field(default_factory=dict)  # lm loss, mtp_1 loss, load_balancing_loss...
    skipped_samples: Optional[int] = None
    tflops_per_gpu: Optional[float] = None  # Megatron's own (needs --log-throughput)
    energy_j_per_gpu: Optional[float] = None
    power_w_per_gpu: Optional[float] = None
    learning_rate: Optional[float] = None
    loss_scale: Optional[float] = None
    grad_norm: Optional[float] = None
    num_zeros: Optional[float] = None
    params_norm: Optional[float] = None
    skipped_iterations: Optional[int] = None
    nan_iterations: Optional[int] = None
    timestamp: Optional[str] = None
    rank: Optional[int] = None  # source rank (srun/torchrun prefix or file name)


@dataclass(slots=True)
class MemoryRecord:
    """`[Rank r] (after k iterations) memory (MB) | ...` (DP-rank-0 GPUs only). Values in MiB."""

    rank: int
    after_iterations: Optional[int]
    allocated: float
    max_allocated: float
    reserved: float
    max_reserved: float
    total_device_used: Optional[float] = None


@dataclass(slots=True)
class TimerBlock:
    """One `... time across ranks (ms):` block. kind: minmax | max | all. Values: ms per iteration.

    timers maps name -> (min, max); min is None for kind "max". For kind "all", per_rank holds
    name -> {rank: ms} and timers holds the min/max over those ranks.
    """

    kind: str
    timers: Dict[str, Tuple[Optional[float], float]] = field(default_factory=dict)
    per_rank: Dict[str, Dict[int, float]] = field(default_factory=dict)
    after_iteration: Optional[int] = None  # last iteration line seen before the block, same stream
    rank: Optional[int] = None


@dataclass(slots=True)
class StragglerRecord:
    """`--log-straggler` line from rank 0: min/max of each metric with the rank holding it."""

    min_rtt_ms: Optional[float]
    min_rtt_rank: Optional[int]
    max_rtt_ms: Optional[float]
    max_rtt_rank: Optional[int]
    min_etpt_tf: Optional[float] = None
    min_etpt_rank: Optional[int] = None
    max_etpt_tf: Optional[float] = None
    max_etpt_rank: Optional[int] = None
    fields: Dict[str, Tuple[float, str, int]] = field(default_factory=dict)  # MnPwr -> (v, unit, rank)
    timestamp: Optional[str] = None
    after_iteration: Optional[int] = None
    rank: Optional[int] = None


@dataclass(slots=True)
class StragglerRanksRecord:
    """`^^^^ Bottom/Top k Ranks with lowest/highest Etpt(TF): v/r, ...`."""

    which: str  # bottom | top
    entries: List[Tuple[float, int]] = field(default_factory=list)  # (TFLOP/s, rank)
    rank: Optional[int] = None


@dataclass(slots=True)
class OOMRecord:
    """CUDA OOM (`kind="cuda"`), Megatron's `[OOM] rank N saved memory snapshot` (`"snapshot"`),
    or slurmstepd's cgroup oom-kill (`"host"`)."""

    kind: str
    line: str
    rank: Optional[int] = None
    tried_to_allocate: Optional[str] = None  # e.g. "2.00 GiB"
    snapshot_path: Optional[str] = None


@dataclass(slots=True)
class NcclTimeoutRecord:
    """torch ProcessGroupNCCL watchdog evidence.

    kind: caught (`Watchdog caught collective operation timeout: WorkNCCL(...)`), detected
    (`Exception ... detected by watchdog at work: N`), stuck (heartbeat monitor). process_group is
    the group description from the `[PG ID i PG GUID g(NAME) Rank r]` prefix when torch prints it.
    """

    kind: str
    line: str
    rank: Optional[int] = None  # source (global) rank
    op_type: Optional[str] = None
    seq_num: Optional[int] = None
    timeout_ms: Optional[int] = None
    ran_ms: Optional[int] = None
    pg_id: Optional[int] = None
    process_group: Optional[str] = None
    group_rank: Optional[int] = None
    last_enqueued: Optional[int] = None
    last_completed: Optional[int] = None


@dataclass(slots=True)
class TracebackRecord:
    """A Python exception line (with its traceback when one preceded it)."""

    exc_type: str
    message: str
    line: str
    last_frame: Optional[str] = None  # 'path:line in func'
    rank: Optional[int] = None


@dataclass(slots=True)
class ValidationError:
    """A configuration rejected by Megatron's argument/config validation (or argparse)."""

    exc_type: str  # AssertionError | ValueError | argparse
    message: str
    line: str
    last_frame: Optional[str] = None
    rank: Optional[int] = None


@dataclass(slots=True)
class SlurmCancelRecord:
    """slurmstepd/srun `*** JOB|STEP <id> [ON <node>] CANCELLED AT <t> [DUE TO <reason>] ***`."""

    entity: str  # JOB | STEP
    job_id: str
    node: Optional[str]
    time: str
    reason: str  # TIME LIMIT | PREEMPTION | NODE FAILURE | JOB REQUEUE | "" (scancel) | other
    line: str


@dataclass(slots=True)
class SimulatedMarker:
    text: str
    rank: Optional[int] = None


@dataclass(slots=True)
class EventRecord:
    """`[<event>] datetime: YYYY-mm-dd HH:MM:SS...` (init, build, train start, exit, done)."""

    name: str
    timestamp: str
    rank: Optional[int] = None


Record = Union[IterationRecord, MemoryRecord, TimerBlock, StragglerRecord, StragglerRanksRecord,
               OOMRecord, NcclTimeoutRecord, TracebackRecord, ValidationError, SlurmCancelRecord,
               SimulatedMarker, EventRecord]


@dataclass
class ParsedLog:
    """Everything one output file said, by record type, plus parse-health counters."""

    path: Optional[str] = None
    source_rank: Optional[int] = None
    iterations: List[IterationRecord] = field(default_factory=list)
    memory: List[MemoryRecord] = field(default_factory=list)
    timers: List[TimerBlock] = field(default_factory=list)
    stragglers: List[StragglerRecord] = field(default_factory=list)
    straggler_ranks: List[StragglerRanksRecord] = field(default_factory=list)
    ooms: List[OOMRecord] = field(default_factory=list)
    nccl: List[NcclTimeoutRecord] = field(default_factory=list)
    tracebacks: List[TracebackRecord] = field(default_factory=list)
    validation_errors: List[ValidationError] = field(default_factory=list)
    slurm_cancels: List[SlurmCancelRecord] = field(default_factory=list)
    simulated_markers: List[SimulatedMarker] = field(default_factory=list)
    events: List[EventRecord] = field(default_factory=list)
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
    IterationRecord: "iterations", MemoryRecord: "memory", TimerBlock: "timers",
    StragglerRecord: "stragglers", StragglerRanksRecord: "straggler_ranks", OOMRecord: "ooms",
    NcclTimeoutRecord: "nccl", TracebackRecord: "tracebacks", ValidationError: "validation_errors",
    SlurmCancelRecord: "slurm_cancels", SimulatedMarker: "simulated_markers", EventRecord: "events",
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
_SLURM = re.compile(
    r"\*\*\* (JOB|STEP) (\S+)(?: ON (\S+))? CANCELLED AT (\S+)(?: DUE TO ([^*]*?))?\s*\*\*\*")
_NCCL_CAUGHT = re.compile(
    r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+)[^)]*?Timeout\(ms\)=(\d+)\) ran for (\d+) milliseconds")
_NCCL_PG = re.compile(r"\[PG (?:ID )?(\d+)(?: PG GUID ([^\s(\]]+))?\s*(?:\(([^)]*)\))? Rank (\d+)\]")
_NCCL_DETECTED = re.compile(
    r"detected by watchdog at work(?: sequence id)?: (\d+),?(?: PG status:)? last enqueued "
    r"(?:NCCL )?work: (-?\d+), last completed (?:NCCL )?work: (-?\d+)")
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
    "arguments.py", "transformer_config.py", "model_parallel_config.py", "parallel_state.py",
    "num_microbatches_calculator.py", "yaml_arguments.py", "initialize.py", "config.py",
)
VALIDATION_WORDS = ("divisible", "must be", "should be", "not supported", "is not compatible",
                    "cannot be", "requires", "only supported", "must have", "not allowed")

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
_MEM_KEYS = {"allocated": "allocated", "max allocated": "max_allocated", "reserved": "reserved",
             "max reserved": "max_reserved", "total device memory used": "total_device_used"}


def _dec(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _is_validation(exc_type: str, message: str, last_frame: Optional[str]) -> bool:
    short = exc_type.rsplit(".", 1)[-1]
    if short not in ("AssertionError", "ValueError"):
        return False
    if "is not divisible" in message or "should be divisible" in message:
        return True
    in_config_code = bool(last_frame) and any(s in last_frame for s in VALIDATION_SOURCES)
    return in_config_code or any(w in message for w in VALIDATION_WORDS)


# --------------------------------------------------------------------------- parser
class _Parser:
    """Line-at-a-time state machine. Per-source state (timer block, traceback) is keyed by the
    rank prefix, so interleaved `srun -l` output from many ranks does not mix blocks."""

    def __init__(self, source_rank: Optional[int] = None) -> None:
        self.source_rank = source_rank
        self.lines = 0
        self.bytes = 0
        self.garbage = 0
        self.truncated = False
        self.last_iteration: Optional[int] = None
        self._timer: Dict[Optional[int], TimerBlock] = {}
        self._timer_name: Dict[Optional[int], str] = {}  # current name in an "all" block
        self._tb: Dict[Optional[int], List[str]] = {}  # open traceback frames per source

    # ---- entry points
    def feed(self, raw: bytes, complete: bool = True) -> List[Record]:
        self.lines += 1
        self.bytes += len(raw)
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw.isascii() or b"\x00" in raw:
            try:
                raw.decode("utf-8")
                if b"\x00" in raw:
                    raise UnicodeDecodeError("utf-8", raw, 0, 1, "NUL")
            except UnicodeDecodeError:
                self.garbage += 1
                raw = raw.replace(b"\x00", b"")
        if b"\r" in raw:  # progress bars: each \r-separated segment is its own line
            out: List[Record] = []
            for seg in raw.split(b"\r"):
                if seg:
                    out.extend(self._line(seg, complete))
            return out
        return self._line(raw, complete)

    def finish(self) -> List[Record]:
        out: List[Record] = []
        for src in list(self._timer):
            out.append(self._close_timer(src))
        for src in list(self._tb):
            self._tb.pop(src)  # a traceback with no exception line (killed): nothing to report
        return out

    # ---- one logical line
    def _line(self, s: bytes, complete: bool) -> List[Record]:
        src = self.source_rank
        if s[:1] == b"[" and (s.startswith(b"[rank") or s.startswith(b"[default")):
            m = _TORCHRUN_PREFIX.match(s)
            if m:
                src = int(m.group(1))
                s = s[m.end():]
        else:
            first = s.lstrip()[:1]
            if first.isdigit():
                m = _SRUN_PREFIX.match(s)
                if m:
                    src = int(m.group(1))
                    s = s[m.end():]
                    m = _TORCHRUN_PREFIX.match(s)
                    if m:
                        src = int(m.group(1))
                        s = s[m.end():]
        if s[:4] in (b"INFO", b"WARN", b"ERRO", b"DEBU", b"CRIT"):
            m = _LOGGING_PREFIX.match(s)
            if m:
                s = s[m.end():]

        out: List[Record] = []
        if src in self._timer:
            if complete and self._timer_row(src, s):
                return out
            out.append(self._close_timer(src))
        if src in self._tb:
            if s.startswith(b" ") or not s.strip():
                if s.lstrip().startswith(b'File "'):
                    self._tb[src].append(_dec(s))
                return out
            frames = self._tb.pop(src)
            out.extend(self._exception(s, src, frames))
            # fall through: the exception line may also be an OOM / NCCL signature
            out.extend(self._signatures(s, src, complete, exception_done=True))
            return out

        if complete:
            if b"iteration" in s and b"consumed samples:" in s:
                rec = self._iteration(s, src)
                if rec is not None:
                    out.append(rec)
                return out
            if b"memory (MB)" in s and b"[Rank " in s:
                rec = self._memory(s)
                if rec is not None:
                    out.append(rec)
                return out
            if b"across ranks (ms):" in s:
                for header, kind in _TIMER_HEADERS:
                    if header in s:
                        self._timer[src] = TimerBlock(kind=kind, after_iteration=self.last_iteration,
                                                      rank=src)
                        return out
            if b"/Rnk: " in s:
                rec = self._straggler(s, src)
                if rec is not None:
                    out.append(rec)
                return out
            if s.startswith(b"^^^^ "):
                rec = self._straggler_ranks(s, src)
                if rec is not None:
                    out.append(rec)
                return out
            if b"] datetime: " in s:
                m = _EVENT.search(_dec(s))
                if m:
                    out.append(EventRecord(m.group(1), m.group(2), rank=src))
                return out
        if s.startswith(_SIM_B):
            out.append(SimulatedMarker(_dec(s[len(_SIM_B):]).strip(), rank=src))
            return out
        out.extend(self._signatures(s, src, complete, exception_done=False))
        return out

    def _signatures(self, s: bytes, src: Optional[int], complete: bool,
                    exception_done: bool) -> List[Record]:
        out: List[Record] = []
        if b"*** " in s and b"CANCELLED" in s:
            t = _dec(s)
            m = _SLURM.search(t)
            if m:
                reason = (m.group(5) or "").strip()
                if reason.startswith("NODE FAILURE"):
                    reason = "NODE FAILURE"
                out.append(SlurmCancelRecord(m.group(1), m.group(2), m.group(3), m.group(4), reason,
                                             t.strip()))
            return out
        if b"oom-kill" in s or b"oom_kill" in s:
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
        if not exception_done and (b"Error" in s or b"Exception" in s or b"Interrupt" in s):
            if b": error: " in s:
                m = _ARGPARSE.match(_dec(s).strip())
                if m:
                    out.append(ValidationError("argparse", m.group(1), m.group(0), rank=src))
                    return out
            out.extend(self._exception(s, src, None))
        elif b": error: " in s and not exception_done:
            m = _ARGPARSE.match(_dec(s).strip())
            if m:
                out.append(ValidationError("argparse", m.group(1), m.group(0), rank=src))
        return out

    # ---- record builders
    def _iteration(self, s: bytes, src: Optional[int]) -> Optional[IterationRecord]:
        t = _dec(s)
        m = _ITER_HEAD.search(t)
        if m is None or "number of nan iterations" not in t:
            self.garbage += 1
            return None
        vals: Dict[str, object] = {}
        losses: Dict[str, float] = {}
        try:
            for part in t[m.end():].split("|"):
                key, sep, val = part.partition(":")
                if not sep:
                    continue
                key = key.strip()
                val = val.strip()
                spec = _ITER_KEYS.get(key)
                if spec is not None:
                    vals[spec[0]] = spec[1](val)
                else:
                    try:
                        losses[key] = float(val)
                    except ValueError:
                        pass  # non-numeric extras (e.g. RL packing info) are not metrics
            rec = IterationRecord(
                iteration=int(m.group(2)), train_iters=int(m.group(3)),
                consumed_samples=vals.pop("consumed_samples"), elapsed_ms=vals.pop("elapsed_ms"),
                losses=losses, timestamp=m.group(1), rank=src, **vals)
        except (KeyError, ValueError, TypeError):
            self.garbage += 1
            return None
        self.last_iteration = rec.iteration
        return rec

    def _memory(self, s: bytes) -> Optional[MemoryRecord]:
        t = _dec(s)
        m = _MEMORY.search(t)
        if m is None:
            self.garbage += 1
            return None
        vals: Dict[str, float] = {}
        for part in m.group(3).split("|"):
            key, sep, val = part.partition(":")
            name = _MEM_KEYS.get(key.strip())
            if sep and name:
                vals[name] = float(val)
        a = _AFTER_ITERS.search(m.group(2))
        try:
            return MemoryRecord(rank=int(m.group(1)), after_iterations=int(a.group(1)) if a else None,
                                **vals)
        except TypeError:
            self.garbage += 1
            return None

    def _timer_row(self, src: Optional[int], s: bytes) -> bool:
        """Add a row to the open block of `src`; False when `s` is not a row (block ends)."""
        blk = self._timer[src]
        if blk.kind == "all":
            st = s.strip()
            if s.startswith(b"     rank ") and b": " in s:
                r, _, v = st[5:].partition(b":")
                name = self._timer_name.get(src)
                if name is None:
                    return False
                try:
                    blk.per_rank[name][int(r)] = float(v)
                except ValueError:
                    return False
                return True
            if s.startswith(b"  ") and st.endswith(b":") and b" " not in st:
                name = _dec(st[:-1])
                self._timer_name[src] = name
                blk.per_rank[name] = {}
                return True
            return False
        if not s.startswith(b"    "):
            return False
        i = s.rfind(b": ")
        if i < 0:
            return False
        name = _dec(s[:i].rstrip(b".").strip())
        val = s[i + 2:].strip()
        try:
            if val[:1] == b"(":
                lo, _, hi = val[1:-1].partition(b",")
                blk.timers[name] = (float(lo), float(hi))
            else:
                blk.timers[name] = (None, float(val))
        except ValueError:
            return False
        return True

    def _close_timer(self, src: Optional[int]) -> TimerBlock:
        blk = self._timer.pop(src)
        self._timer_name.pop(src, None)
        for name, ranks in blk.per_rank.items():
            if ranks:
                blk.timers[name] = (min(ranks.values()), max(ranks.values()))
        return blk

    def _straggler(self, s: bytes, src: Optional[int]) -> Optional[StragglerRecord]:
        t = _dec(s)
        fields = {m.group(1): (float(m.group(2)), m.group(3), int(m.group(4)))
                  for m in _STRAG_FIELD.finditer(t)}
        if "MnRtt" not in fields and "MxRtt" not in fields:
            self.garbage += 1
            return None
        ts = _STRAG_TS.search(t)

        def get(k: str) -> Tuple[Optional[float], Optional[int]]:
            v = fields.get(k)
            return (v[0], v[2]) if v else (None, None)

        mn, mnr = get("MnRtt")
        mx, mxr = get("MxRtt")
        emn, emnr = get("MnEtpt")
        emx, emxr = get("MxEtpt")
        return StragglerRecord(mn, mnr, mx, mxr, emn, emnr, emx, emxr, fields,
                               ts.group(1) if ts else None, self.last_iteration, src)

    def _straggler_ranks(self, s: bytes, src: Optional[int]) -> Optional[StragglerRanksRecord]:
        t = _dec(s)
        m = _STRAG_RANKS.search(t)
        if m is None:
            return None
        tail = t.split(":", 1)[1] if ":" in t else ""
        entries = [(float(v), int(r)) for v, r in _STRAG_ENTRY.findall(tail)]
        return StragglerRanksRecord(m.group(1).lower(), entries, src)

    def _nccl(self, t: str, src: Optional[int]) -> Optional[NcclTimeoutRecord]:
        pg = _NCCL_PG.search(t)
        rec: Optional[NcclTimeoutRecord] = None
        m = _NCCL_CAUGHT.search(t)
        if m:
            rec = NcclTimeoutRecord("caught", t, src, op_type=m.group(2), seq_num=int(m.group(1)),
                                    timeout_ms=int(m.group(3)), ran_ms=int(m.group(4)))
        elif (m := _NCCL_DETECTED.search(t)) is not None:
            rec = NcclTimeoutRecord("detected", t, src, seq_num=int(m.group(1)),
                                    last_enqueued=int(m.group(2)), last_completed=int(m.group(3)))
        elif (m := _NCCL_STUCK.search(t)) is not None:
            rec = NcclTimeoutRecord("stuck", t, src, timeout_ms=int(m.group(1)) * 1000)
        if rec is not None and pg is not None:
            rec.pg_id = int(pg.group(1))
            rec.process_group = pg.group(3) or None
            rec.group_rank = int(pg.group(4))
        return rec

    def _exception(self, s: bytes, src: Optional[int], frames: Optional[List[str]]) -> List[Record]:
        t = _dec(s).strip()
        m = _EXC_LINE.match(t)
        if m is None:
            if frames is not None:  # a traceback that ended on an unexpected line
                return [TracebackRecord("", t, t, _last_frame(frames), src)]
            return []
        exc_type, message = m.group(1), (m.group(2) or "").strip()
        last = _last_frame(frames) if frames else None
        if frames is None and exc_type.rsplit(".", 1)[-1] not in ("AssertionError", "ValueError") \
                and "OutOfMemoryError" not in exc_type:
            # a bare `XError: ...` line with no traceback is too weak unless it is a known kind
            if not exc_type.endswith("Error") or ":" not in t:
                return []
        out: List[Record] = [TracebackRecord(exc_type, message, t, last, src)]
        if _is_validation(exc_type, message, last):
            out.append(ValidationError(exc_type.rsplit(".", 1)[-1], message, t, last, src))
        return out


def _last_frame(frames: Optional[List[str]]) -> Optional[str]:
    if not frames:
        return None
    m = _FRAME.match(frames[-1])
    if not m:
        return frames[-1].strip()
    return f"{m.group(1)}:{m.group(2)} in {m.group(3).strip()}"


# --------------------------------------------------------------------------- public API
def _lookahead(lines: Iterable[bytes]) -> Iterator[Tuple[bytes, bool]]:
    """(line, is_complete): only the last line may be incomplete (no trailing newline)."""
    prev: Optional[bytes] = None
    for line in lines:
        if isinstance(line, str):
            line = line.encode("utf-8", "replace")
        if prev is not None:
            yield prev, True
        prev = line
    if prev is not None:
        yield prev, prev.endswith(b"\n")


def _run(parser: _Parser, lines: Iterable[bytes]) -> Iterator[Record]:
    for line, complete in _lookahead(lines):
        if not complete:
            parser.truncated = True
        yield from parser.feed(line, complete)
    yield from parser.finish()


def parse_stream(src: Iterable[bytes], source_rank: Optional[int] = None) -> Iterator[Record]:
    """Yield records from a binary file object or an iterable of bytes lines (keep the newlines:
    a last line without one is treated as truncated)."""
    return _run(_Parser(source_rank), src)


def rank_from_path(path: Union[str, Path]) -> Optional[int]:
    """`rank-12.out` -> 12 (the job folder's naming, see DESIGN.md)."""
    m = _RANK_IN_PATH.search(Path(path).name)
    return int(m.group(1)) if m else None


def parse_file(path: Union[str, Path], source_rank: Optional[int] = None) -> ParsedLog:
    """Parse one output file into a ParsedLog. The rank defaults to the file name's `rank-<r>`."""
    if source_rank is None:
        source_rank = rank_from_path(path)
    parser = _Parser(source_rank)
    log = ParsedLog(path=str(path), source_rank=source_rank)
    buckets = {cls: getattr(log, name) for cls, name in _BUCKET.items()}
    with open(path, "rb", buffering=1 << 20) as f:
        for rec in _run(parser, f):
            buckets[type(rec)].append(rec)
    log.lines, log.bytes = parser.lines, parser.bytes
    log.garbage_lines, log.truncated = parser.garbage, parser.truncated
    return log


def parse_bytes(data: bytes, source_rank: Optional[int] = None) -> ParsedLog:
    """Parse an in-memory blob (e.g. a stderr tail) the same way as a file."""
    parser = _Parser(source_rank)
    log = ParsedLog(source_rank=source_rank)
    for rec in _run(parser, data.splitlines(keepends=True)):
        log.add(rec)
    log.lines, log.bytes = parser.lines, parser.bytes
    log.garbage_lines, log.truncated = parser.garbage, parser.truncated
    return log
