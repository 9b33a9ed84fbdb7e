"""One log line -> one record: the formats Megatron, torch and Slurm print, as regexes and builders.

orchestrator.evidence.parse finds the lines (a keyword scan over whole chunks) and strips rank / logging prefixes; the
functions here turn one such line into a record, or None. Formats: Megatron's training.py iteration line,
common_utils.report_memory, core/utils.py straggler lines, training/utils `[OOM]` snapshots; torch's
ProcessGroupNCCL watchdog and CUDA OOM text (with the device's total capacity it states); slurmstepd's
`*** JOB ... CANCELLED AT ... ***` epilogue.
"""

from __future__ import annotations

import re
from typing import Any

from orchestrator.evidence.records import (
    EventRecord,
    IterationRecord,
    MemoryRecord,
    NcclTimeoutRecord,
    OOMRecord,
    SlurmCancelRecord,
    StragglerRanksRecord,
    StragglerRecord,
    TracebackRecord,
    ValidationError,
    cached_name,
)

# Megatron's own field order, one regex over the bytes (literal-led: a fast search); group names are
# IterationRecord's fields.
_ITER_STRICT = re.compile(
    rb"iteration\s+(?P<iteration>\d+)/\s*(?P<train_iters>\d+) \| consumed samples:\s+(?P<consumed_samples>\d+) \|"
    rb"(?: skipped samples:\s+(?P<skipped_samples>\d+) \|)?"
    rb" elapsed time per iteration \(ms\): (?P<elapsed_ms>[^ |]+) \|"
    rb"(?: throughput per GPU \(TFLOP/s/GPU\): (?P<tflops_per_gpu>[^ |]+) \|)?"
    rb"(?: energy per GPU \(J/iter/GPU\): (?P<energy_j_per_gpu>[^ |]+) \|"
    rb" power per GPU \(W/GPU\): (?P<power_w_per_gpu>[^ |]+) \|)?"
    rb"(?: learning rate: (?P<learning_rate>[^ |]+) \|)?"
    rb" global batch size:\s+(?P<global_batch_size>\d+) \|"
    rb"(?P<losses>(?: [^|:]+: [^ |]+ \|)*?)"  # losses and MoE metrics: any `name: value`
    rb" loss scale: (?P<loss_scale>[^ |]+) \|"
    rb"(?: grad norm: (?P<grad_norm>[^ |]+) \|)?"
    rb"(?: num zeros: (?P<num_zeros>[^ |]+) \|)?"
    rb"(?: params norm: (?P<params_norm>[^ |]+) \|)?"
    rb" number of skipped iterations:\s+(?P<skipped_iterations>\d+) \|"
    rb" number of nan iterations:\s+(?P<nan_iterations>\d+) \|"
)
_ITER_GROUPS = (  # the named groups `iteration` reads, fetched by name (m.group(*names): no dict per line)
    "iteration",
    "train_iters",
    "consumed_samples",
    "skipped_samples",
    "elapsed_ms",
    "tflops_per_gpu",
    "energy_j_per_gpu",
    "power_w_per_gpu",
    "learning_rate",
    "global_batch_size",
    "losses",
    "loss_scale",
    "grad_norm",
    "num_zeros",
    "params_norm",
    "skipped_iterations",
    "nan_iterations",
)
_ITER_LOSS = re.compile(rb" ([^|:]+): ([^ |]+) \|")
_ITER_HEAD = re.compile(r"(?:\[([0-9-]+ [0-9:.]+)\] )?iteration\s+(\d+)/\s*(\d+) \|")
_ITER_FIELD = re.compile(r" ([^|:]+): ([^|]+?) (?=\|)")
_ITER_KEYS = {  # the generic path: Megatron's label -> (IterationRecord field, type)
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
_MEMORY = re.compile(r"\[Rank (\d+)\] (.*?)memory \(MB\)((?: \| [a-z ]+: [-0-9.e+naif]+)+)\s*$")
_AFTER_ITERS = re.compile(r"\(after (\d+) iterations\)")
_MEM_KEYS = {
    "allocated": "allocated",
    "max allocated": "max_allocated",
    "reserved": "reserved",
    "max reserved": "max_reserved",
    "total device memory used": "total_device_used",
}
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
# The device's total memory as torch's CUDA caching allocator states it in its OOM message: since torch 2.1
# "GPU 0 has a total capacity of 96.00 GiB of which ...", before "(GPU 0; 79.35 GiB total capacity; ...".
# Sizes are c10's format_size: "N bytes", or two decimals of KiB / MiB / GiB (binary units).
_CAPACITY = re.compile(r"GPU (\d+) has a total capacity of ([0-9.]+ (?:bytes|[KMGT]iB))")
_CAPACITY_OLD = re.compile(r"\(GPU (\d+); ([0-9.]+ (?:bytes|[KMGT]iB)) total capacity;")
_SIZE = re.compile(r"^([0-9.]+) ?(bytes|[KMGT]iB)$")
SIZE_UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_OOM_SNAPSHOT = re.compile(r"\[OOM\] rank (\d+) saved memory snapshot to (\S+)")
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))(?:: (.*))?$")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')
_EVENT = re.compile(r"\[([^\[\]]+)\] datetime: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)")
_ARGPARSE = re.compile(r"^\S+\.py: error: (.+)$")


def _dec(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _timestamp(s: bytes, end: int) -> str | None:
    """The `[YYYY-MM-DD HH:MM:SS.ffffff]` just before `iteration`, if any."""
    i = s.rfind(b"[", 0, end)
    j = s.find(b"]", i, end)
    return s[i + 1 : j].decode("ascii", "replace") if i >= 0 and j > i else None


def _int(v: bytes | None) -> int | None:
    return None if v is None else int(v)


def _float(v: bytes | None) -> float | None:
    return None if v is None else float(v)


# ------------------------------------------------------------------------------------------- metrics
def iteration(s: bytes, src: int | None) -> IterationRecord | None:
    """An iteration line; None if it only looked like one (a mangled line)."""
    m = _ITER_STRICT.search(s)
    if m is None:
        return _iteration_generic(s, src)
    (
        iteration,
        train_iters,
        consumed_samples,
        skipped_samples,
        elapsed_ms,
        tflops_per_gpu,
        energy_j_per_gpu,
        power_w_per_gpu,
        learning_rate,
        global_batch_size,
        raw_losses,
        loss_scale,
        grad_norm,
        num_zeros,
        params_norm,
        skipped_iterations,
        nan_iterations,
    ) = m.group(*_ITER_GROUPS)
    losses = {}
    for k, v in _ITER_LOSS.findall(raw_losses):
        try:
            losses[cached_name(k)] = float(v)
        except ValueError:
            continue
    # Positional, in IterationRecord's field order: keyword arguments cost three times as much on the parser's
    # hottest line (tests/evidence/test_parse.py checks every field of a line that has them all).
    return IterationRecord(
        int(iteration),
        int(train_iters),
        int(consumed_samples),
        float(elapsed_ms),
        int(global_batch_size),
        losses,
        None if skipped_samples is None else int(skipped_samples),
        None if tflops_per_gpu is None else float(tflops_per_gpu),
        None if energy_j_per_gpu is None else float(energy_j_per_gpu),
        None if power_w_per_gpu is None else float(power_w_per_gpu),
        None if learning_rate is None else float(learning_rate),
        float(loss_scale),
        None if grad_norm is None else float(grad_norm),
        None if num_zeros is None else float(num_zeros),
        None if params_norm is None else float(params_norm),
        int(skipped_iterations),
        int(nan_iterations),
        _timestamp(s, m.start()),
        src,
    )


def _iteration_generic(s: bytes, src: int | None) -> IterationRecord | None:
    """Any field order / unknown extra fields (e.g. RL packing info)."""
    t = _dec(s)
    m = _ITER_HEAD.search(t)
    if m is None or "number of nan iterations" not in t:
        return None
    vals: dict[str, Any] = {}  # IterationRecord's fields, typed by _ITER_KEYS
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
        return IterationRecord(
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
        return None


def memory(s: bytes) -> MemoryRecord | None:
    """`[Rank r] (after k iterations) memory (MB) | ...`; None if mangled."""
    t = _dec(s)
    m = _MEMORY.search(t)
    if m is None:
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
        return None


def straggler(s: bytes, src: int | None, after_iteration: int | None) -> StragglerRecord | None:
    """`--log-straggler`'s min/max line; None if it names neither MnRtt nor MxRtt."""
    t = _dec(s)
    fields = {m.group(1): (float(m.group(2)), m.group(3), int(m.group(4))) for m in _STRAG_FIELD.finditer(t)}
    if "MnRtt" not in fields and "MxRtt" not in fields:
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
        mn, mnr, mx, mxr, emn, emnr, emx, emxr, fields, ts.group(1) if ts else None, after_iteration, src
    )


def straggler_ranks(s: bytes, src: int | None) -> StragglerRanksRecord | None:
    t = _dec(s)
    m = _STRAG_RANKS.search(t)
    if m is None:
        return None
    tail = t.split(":", 1)[1] if ":" in t else ""
    entries = [(float(v), int(r)) for v, r in _STRAG_ENTRY.findall(tail)]
    return StragglerRanksRecord(m.group(1).lower(), entries, src)


def event(s: bytes, src: int | None) -> EventRecord | None:
    m = _EVENT.search(_dec(s))
    return EventRecord(m.group(1), m.group(2), rank=src) if m else None


# ----------------------------------------------------------------------------------------- failures
def slurm_cancel(s: bytes) -> SlurmCancelRecord | None:
    t = _dec(s)
    m = _SLURM.search(t)
    if m is None:
        return None
    reason = (m.group(5) or "").strip()
    if reason.startswith("NODE FAILURE"):
        reason = "NODE FAILURE"
    return SlurmCancelRecord(m.group(1), m.group(2), m.group(3), m.group(4), reason, t.strip())


def size_bytes(text: str) -> float | None:
    """c10's format_size text ("96.00 GiB", "512 bytes") -> bytes (binary units); None if it is not one."""
    m = _SIZE.match(text.strip())
    return float(m.group(1)) * SIZE_UNITS[m.group(2)] if m else None


def cuda_oom(s: bytes, src: int | None) -> OOMRecord | None:
    t = _dec(s).strip()
    if "CUDA out of memory" not in t:
        return None
    m = _TRIED.search(t)
    cap = _CAPACITY.search(t) or _CAPACITY_OLD.search(t)
    return OOMRecord(
        "cuda",
        t,
        rank=src,
        tried_to_allocate=m.group(1) if m else None,
        device=int(cap.group(1)) if cap else None,
        total_capacity=cap.group(2) if cap else None,
    )


def oom_snapshot(s: bytes) -> OOMRecord | None:
    t = _dec(s).strip()
    m = _OOM_SNAPSHOT.search(t)
    return OOMRecord("snapshot", t, rank=int(m.group(1)), snapshot_path=m.group(2)) if m else None


def nccl(t: str, src: int | None) -> NcclTimeoutRecord | None:
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


def argparse_error(s: bytes, src: int | None) -> ValidationError | None:
    """`pretrain_hybrid.py: error: unrecognized arguments: ...` (argparse's usage error)."""
    m = _ARGPARSE.match(_dec(s).strip())
    return ValidationError("argparse", m.group(1), m.group(0), rank=src) if m else None


def exception(s: bytes, src: int | None, frames: list[str] | None) -> TracebackRecord | None:
    """An exception line (`frames`: the traceback that preceded it, None when there was none)."""
    t = _dec(s).strip()
    m = _EXC_LINE.match(t)
    if m is None:
        return None  # not an exception line (a traceback cut short by a kill): nothing to claim
    exc_type, message = m.group(1), (m.group(2) or "").strip()
    if frames is None and (not exc_type.endswith("Error") or m.group(2) is None):
        return None  # a bare `Foo: ...` line without traceback is too weak unless it is an XError
    return TracebackRecord(exc_type, message, t, _last_frame(frames) if frames else None, src)


def _last_frame(frames: list[str]) -> str:
    m = _FRAME.match(frames[-1])
    if not m:
        return frames[-1].strip()
    return f"{m.group(1)}:{m.group(2)} in {m.group(3).strip()}"
