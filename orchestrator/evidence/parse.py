"""Streaming parser for Megatron-LM / torch / Slurm job output -> typed records (orchestrator.evidence.records).

Why streaming and bytes-level: a long job writes hundreds of MB per rank file, mostly noise and timer
rows. The file is read in 8 MB chunks (cut before the last iteration line, so no timer block is
split); a dozen keywords are found with `bytes.find` over the whole chunk (C speed), and only lines
holding one are decoded and turned into a record (orchestrator.evidence.loglines). Timer rows are kept as bytes and
converted to floats when first read (`TimerBlock.timers`). Formats: see orchestrator.evidence.loglines; timer blocks are
core/timers.py's. Memory stays flat whatever the log's size: a line is read up to `_LINE_MAX` bytes (a
longer one's head only, for failure signatures; a progress bar's `\r` segments are lines of their own),
and a ParsedLog keeps what orchestrator.evidence.keep's policy says.

Robust to: `srun -l` prefixes (`12: `), torchrun prefixes (`[rank3]:`, `[default3]:`), logging
prefixes (`INFO:megatron.core.timers:`), carriage returns, missing optional fields, non-UTF-8 bytes
(decoded with errors="replace" and counted as garbage) and a truncated last line (no newline): that
line is only searched for failure signatures, never for metrics, and `ParsedLog.truncated` is set.

The parser reports what the log says, not what it means (is a traceback a configuration error?
orchestrator.evidence.classify
says). The twin's note lines start with SIMULATED_MARKER; any such line makes `ParsedLog.simulated` true.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from orchestrator.core.paths import JobPaths
from orchestrator.core.states import AttemptState
from orchestrator.evidence import loglines
from orchestrator.evidence.keep import Keep, Retainer
from orchestrator.evidence.records import (
    SIMULATED_MARKER,
    IterationRecord,
    OOMRecord,
    ParsedLog,
    Record,
    SimulatedMarker,
    TimerBlock,
)

__all__ = ["parse_bytes", "parse_file", "parse_stream", "rank_from_path"]

_SIM_B = SIMULATED_MARKER.encode()
_CANCELLED = AttemptState.CANCELLED.encode()  # slurmstepd's `*** JOB <id> ... CANCELLED AT <t> ***` epilogue
_SRUN_PREFIX = re.compile(rb"\s*(\d+): ")
_TORCHRUN_PREFIX = re.compile(rb"\[(?:rank|default)(\d+)\]:")
_LOGGING_PREFIX = re.compile(rb"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]+:")
_TIMER_HEADERS = (  # core/timers.py block headers -> TimerBlock.kind
    (b"(min, max) time across ranks (ms):", "minmax"),
    (b"max time across ranks (ms):", "max"),
    (b"times across ranks (ms):", "all"),
)

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
    _CANCELLED,
    b"atchdog",
    b"Traceback",
    b"rror",  # rror: XError lines and argparse `: error:`
)
_TRACEBACK_KEYWORDS = (b'File "', b"Exception")  # only while a traceback can be open
_CHUNK = 8 << 20  # bytes per read: records of one chunk are held at once, so it bounds memory
_BLOCK_MAX = 1 << 20  # a (min, max) block is a few KB; only a huge per-rank "all" block can be split
_LINE_MAX = 64 << 10  # a Megatron line is under 4 KB; only the head of a longer line is read
_FRAMES = 8  # traceback frames kept per open traceback (the record names the last one)
_ROW_RES = 1024  # cached timer-row patterns (one per rank prefix)
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
        self.long_lines = 0
        self._skipping = False  # inside a line longer than _LINE_MAX: its head was read, skip to its end
        self.last_iteration: int | None = None
        self._tb: dict[int | None, list[str]] = {}  # open traceback frames per source
        self._iteration_lines: set = set()
        self._row_re: dict[bytes, re.Pattern[bytes]] = {}

    # ---- chunks
    def chunk(self, buf: bytes, final: bool) -> tuple[list[Record], bytes]:
        """Parse the complete part of `buf`; return (records, unparsed rest to prepend next time)."""
        out: list[Record] = []
        if self._skipping:  # the rest of an overlong line, up to its end
            end = min(i for i in (buf.find(b"\n"), buf.find(b"\r"), len(buf)) if i >= 0)
            self.bytes += end
            buf, self._skipping = buf[end:], end == len(buf)
            if not buf:
                return out, b""
        if not final:
            cut = self._safe_cut(buf)
            if cut == 0 and len(buf) > _LINE_MAX and b"\n" not in buf:
                if b"\r" not in buf:  # one line longer than the bound: read its head, skip the rest
                    self.bytes += len(buf)
                    self._skipping = True
                    self._signatures_only(buf, out)
                    return out, b""
                buf = buf.replace(b"\r", b"\n")  # progress output without newlines: \r ends its lines
                cut = buf.rfind(b"\n") + 1
            work, rest = buf[:cut], buf[cut:]
        else:
            work, rest = buf, b""
        tail = b""
        if final and work and not work.endswith(b"\n"):
            i = work.rfind(b"\n") + 1
            work, tail = work[:i], work[i:]
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
                if le - ls > _LINE_MAX:
                    self._signatures_only(work[ls:le], out)
                    continue
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
            self._count_garbage(tail[:_LINE_MAX])
            self._signatures_only(tail, out)
        if final:
            self._tb.clear()  # a traceback with no exception line (killed): nothing to report
        return out, rest

    def _signatures_only(self, line: bytes, out: list[Record]) -> None:
        """An incomplete or overlong line (its head): each `\r` segment is searched for failure signatures."""
        if len(line) > _LINE_MAX:
            self.long_lines += 1
            line = line[:_LINE_MAX]
        for seg in line.replace(b"\x00", b"").split(b"\r"):
            if seg:
                seg_src, seg_s, _ = self._prefix(seg)
                out.extend(self._line(seg_s, seg_src, complete=False))

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
                    self._tb[src] = [*self._tb[src][1 - _FRAMES :], _dec(s)]
                return out
            exc = loglines.exception(s, src, self._tb.pop(src))
            if exc is not None:  # the exception line may also be an OOM / NCCL signature
                return [*out, exc, *self._signatures(s, src, exception_done=True)]
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
            rec = self._garbage_if_none(loglines.memory(s))
        elif b"MnRtt/Rnk: " in s:
            rec = self._garbage_if_none(loglines.straggler(s, src, self.last_iteration))
        elif s.startswith(b"^^^^ "):
            rec = loglines.straggler_ranks(s, src)
        elif b"] datetime: " in s:
            rec = loglines.event(s, src)
        else:
            return None
        return [rec] if rec is not None else []

    def _signatures(self, s: bytes, src: int | None, exception_done: bool) -> list[Record]:
        """Failure evidence in one line (after an exception line: only what may share it)."""
        rec: Record | None
        if b"*** " in s and _CANCELLED in s:
            rec = loglines.slurm_cancel(s)
            return [rec] if rec is not None else []
        if b"oom-kill" in s or b"oom_kill" in s or b"xceeded job memory limit" in s:
            return [OOMRecord("host", _dec(s).strip(), rank=src)]
        out: list[Record] = []
        if b"out of memory" in s:
            if (rec := loglines.cuda_oom(s, src)) is not None:
                out.append(rec)
        elif b"[OOM] rank" in s:
            rec = loglines.oom_snapshot(s)
            return [rec] if rec is not None else []
        if b"atchdog" in s and (rec := loglines.nccl(_dec(s).strip(), src)) is not None:
            out.append(rec)
        if b"Traceback (most recent call last)" in s:
            self._tb[src] = []
            return out
        if exception_done:
            return out
        if b": error: " in s and (rec := loglines.argparse_error(s, src)) is not None:
            out.append(rec)
            return out
        if (b"Error" in s or b"Exception" in s or b"Interrupt" in s) and (
            rec := loglines.exception(s, src, None)
        ) is not None:
            out.append(rec)
        return out

    # ---- records that change the parser's state
    def _iteration(self, s: bytes, src: int | None) -> IterationRecord | None:
        rec = loglines.iteration(s, src)
        if rec is None:
            self.garbage += 1
            return None
        self.last_iteration = rec.iteration
        return rec

    def _garbage_if_none(self, rec: Record | None) -> Record | None:
        """A line that looked like a metric but did not parse counts as garbage."""
        if rec is None:
            self.garbage += 1
        return rec

    def _timer_block(self, work: bytes, pos: int, kind: str, src: int | None, pre: bytes) -> TimerBlock:
        """Rows follow the header (`pos` = its newline). Fast path: one regex over the run of
        consecutive rows with the header's own prefix; if another rank's line interrupts the run,
        walk on line by line, taking only this source's rows, until this source prints a non-row."""
        blk = TimerBlock(kind=kind, after_iteration=self.last_iteration, rank=src)
        if kind != "all":
            run = self._row_re.get(pre)
            if run is None:
                if len(self._row_re) >= _ROW_RES:
                    self._row_re.clear()
                run = self._row_re[pre] = re.compile(rb"(?:\n" + re.escape(pre) + rb"    [^\n]*)*")
            m = run.match(work, pos)
            assert m is not None  # a `(?:...)*` pattern matches, if only the empty string
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


def _dec(b: bytes) -> str:
    return b.decode("utf-8", "replace")


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
    for line in src:  # type: ignore[union-attr]  # without read() it is the iterable of lines
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
    """`rank-12.out` -> 12 (the job folder's naming: orchestrator.core.paths.JobPaths)."""
    return JobPaths.rank_of(path)


def _collect(parser: _Parser, src: Iterable[bytes], log: ParsedLog, keep: Keep | None) -> ParsedLog:
    log = Retainer(log, keep or Keep()).fill(_run(parser, src))
    log.lines, log.bytes = parser.lines, parser.bytes
    log.garbage_lines, log.truncated, log.long_lines = parser.garbage, parser.truncated, parser.long_lines
    return log


def parse_file(path: str | Path, source_rank: int | None = None, keep: Keep | None = None) -> ParsedLog:
    """Parse one output file into a ParsedLog holding what `keep` says (default: no window, the first
    records of each kind). The rank defaults to the file name's `rank-<r>`."""
    if source_rank is None:
        source_rank = rank_from_path(path)
    with open(path, "rb", buffering=0) as f:
        return _collect(_Parser(source_rank), f, ParsedLog(path=str(path), source_rank=source_rank), keep)


def parse_bytes(data: bytes, source_rank: int | None = None, keep: Keep | None = None) -> ParsedLog:
    """Parse an in-memory blob (e.g. a stderr tail) the same way as a file."""
    return _collect(_Parser(source_rank), [data] if data else [], ParsedLog(source_rank=source_rank), keep)
