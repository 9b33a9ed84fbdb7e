"""Bounded parsing on a small scale: what a ParsedLog keeps (orchestrator.evidence.keep) gives the metrics the same
numbers as
keeping everything, holds the same number of records whatever the log's length, and the scanner's buffers
and allocations stay flat for long logs, one endless line and `\\r`-only progress output."""

from __future__ import annotations

import io
import tracemalloc

import pytest

import orchestrator.evidence.parse as parse
from orchestrator.evidence import metrics
from orchestrator.evidence.keep import Keep
from orchestrator.evidence.parse import parse_bytes, parse_file, parse_stream

WINDOW = (5, 10)
ALL = Keep(max_records=10**9)  # the old behaviour: every record


def iteration(it: int, ms: float, rank: int = 7) -> str:
    return (
        f"{rank}:  [2026-11-29 10:{it // 60 % 60:02d}:{it % 60:02d}.000000] iteration {it:8d}/ 100000 |"
        f" consumed samples: {it * 8:12d} | elapsed time per iteration (ms): {ms:.1f} | global batch size:     8 |"
        f" lm loss: 1.0E+00 | loss scale: 1.0 | grad norm: 0.5 | number of skipped iterations:   0 |"
        f" number of nan iterations:   0 |\n"
    )


def megatron_log(iterations: int, *, save_at: int | None = None) -> bytes:
    """Iteration lines, a (min, max) timer block after each, memory lines of two ranks, straggler lines."""
    out = []
    for it in range(1, iterations + 1):
        out.append(iteration(it, 100.0 + it % 7))
        out.append("7: INFO:megatron.core.timers:(min, max) time across ranks (ms):\n")
        out.append(f"7:     {'forward-backward '.ljust(48, '.')}: ({90 + it % 5}.00, {95 + it % 3}.00)\n")
        if it == save_at:
            out.append(f"7:     {'save-checkpoint '.ljust(48, '.')}: (1500.00, 1600.00)\n")
        for rank in (0, 4):
            out.append(
                f"{rank}: [Rank {rank}] (after {it} iterations) memory (MB) | allocated: 100.0 |"
                f" max allocated: {1000 + (it * 37 + rank) % 500}.0 | reserved: 1.0 | max reserved: {2000 + it}.0\n"
            )
        out.append(
            f"0: [2026-11-29 10:{it // 60 % 60:02d}:{it % 60:02d}] | MnRtt/Rnk: 90.0ms/{it % 3} |"
            f" MxRtt/Rnk: 110.0ms/{it % 4}\n"
        )
        out.append(f"{it % 8}: n0:1:1 [0] NCCL INFO Channel 00 : 1[1] -> 2[2] via P2P\n")
    return "".join(out).encode()


def test_the_window_gives_the_metrics_the_same_numbers_as_every_record():
    raw = megatron_log(400, save_at=200)
    kept = parse_bytes(raw, keep=Keep(window=WINDOW, timers=("save-checkpoint",)))
    full = parse_bytes(raw, keep=ALL)
    assert len(full.iterations) == 400 and len(full.timers) == 400 and kept.dropped > full.dropped
    assert [r.iteration for r in kept.iterations] == list(range(5, 17))  # 5: before, 6..15: window, 16: after
    assert sorted(b.after_iteration for b in kept.timers) == [*range(6, 16), 200]  # window + the checkpoint save
    assert [(m.rank, m.max_reserved) for m in kept.memory] == [(0, 2400.0), (4, 2400.0)]  # per-rank peaks
    args = dict(warmup_iters=WINDOW[0], measure_iters=WINDOW[1], seq_length=8, n_gpus=8)
    a, b = metrics.compute([kept], **args), metrics.compute([full], **args)
    for field in ("step_times_s", "partial", "timers_ms", "slowest_rank", "heaviest_rank", "peak_reserved_gb"):
        assert getattr(a, field) == getattr(b, field), field
    assert a.measure_iters == 10 and not a.partial


def test_a_job_that_stopped_in_its_window_is_still_partial():
    kept = parse_bytes(megatron_log(12), keep=Keep(window=WINDOW))
    measured, partial = metrics.window(kept.iterations, *WINDOW)
    assert [r.iteration for r in measured] == [6, 7, 8, 9, 10, 11, 12] and partial


def test_kept_records_do_not_grow_with_the_log():
    keep = Keep(window=WINDOW, timers=("save-checkpoint",))
    short, long = parse_bytes(megatron_log(50), keep=keep), parse_bytes(megatron_log(2000), keep=keep)
    for name in ("iterations", "timers", "memory", "stragglers"):
        assert len(getattr(short, name)) == len(getattr(long, name)), name
    assert long.dropped > short.dropped


def test_without_a_window_the_first_records_are_kept_and_the_rest_counted():
    log = parse_bytes(megatron_log(300), keep=Keep(max_records=100))
    assert [r.iteration for r in log.iterations] == list(range(1, 101)) and len(log.timers) == 100
    assert log.dropped >= 2 * 200


def test_a_requeued_run_appending_to_the_same_file_keeps_the_last_measurement():
    first = "".join(iteration(it, 500.0) for it in range(1, 9)).encode()  # killed at 8, then rerun to 20
    rerun = "".join(iteration(it, 100.0) for it in range(1, 21)).encode()
    log = parse_bytes(first + rerun, keep=Keep(window=WINDOW))
    measured, partial = metrics.window(log.iterations, *WINDOW)
    assert [r.elapsed_ms for r in measured] == [100.0] * 10 and not partial
    assert len(log.iterations) == 12  # before + 10 in the window + after, not one per line


def _buffers(monkeypatch, raw: bytes) -> tuple[list, list[int]]:
    """Records of `raw` read in 4 KB chunks with a 1 KB line bound, and the size of every buffer parsed."""
    monkeypatch.setattr(parse, "_CHUNK", 4096)
    monkeypatch.setattr(parse, "_LINE_MAX", 1024)
    sizes: list[int] = []
    real = parse._Parser.chunk

    def spy(self, buf, final):
        sizes.append(len(buf))
        return real(self, buf, final)

    monkeypatch.setattr(parse._Parser, "chunk", spy)
    return list(parse_stream(io.BytesIO(raw))), sizes


def test_an_endless_line_is_read_by_its_head_and_skipped(monkeypatch):
    raw = (
        iteration(1, 5.0).encode()
        + b"[rank3]: RuntimeError: cannot print a tensor "
        + b"0123456789" * 50_000  # 500 KB, no newline
        + b"\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    )
    recs, sizes = _buffers(monkeypatch, raw)
    assert max(sizes) <= 2 * 4096 + 1024  # the line is never gathered
    kinds = [type(r).__name__ for r in recs]
    assert kinds[0] == "IterationRecord" and "OOMRecord" in kinds
    head = next(r for r in recs if type(r).__name__ == "TracebackRecord")
    assert head.exc_type == "RuntimeError" and head.rank == 3 and len(head.line) <= 1024
    log = parse_bytes(raw)
    assert log.long_lines == 1 and log.ooms and log.lines == 3 and log.bytes == len(raw)


def test_carriage_return_progress_is_read_segment_by_segment(monkeypatch):
    bar = b"".join(b"\rLoading shards %5d/99999 [%-20s]" % (i, b"#" * (i % 20)) for i in range(3000))
    raw = bar + b"\rCUDA out of memory. Tried to allocate 1.00 GiB" + bar + b"\n" + iteration(1, 5.0).encode()
    recs, sizes = _buffers(monkeypatch, raw)
    assert max(sizes) <= 2 * 4096 + 1024
    assert [type(r).__name__ for r in recs] == ["OOMRecord", "IterationRecord"]


@pytest.mark.long
def test_parse_allocations_stay_flat_as_the_log_grows(monkeypatch, tmp_path):
    monkeypatch.setattr(parse, "_CHUNK", 64 << 10)
    keep = Keep(window=WINDOW, timers=("save-checkpoint",))
    peaks = []
    for n in (300, 3000):  # about 0.2 MB and 2.3 MB: many chunks each
        path = tmp_path / f"rank-7-{n}.out"
        path.write_bytes(megatron_log(n))
        tracemalloc.start()
        parse_file(path, keep=keep)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 1.3 * peaks[0], peaks  # 10x the log, not 10x the memory
