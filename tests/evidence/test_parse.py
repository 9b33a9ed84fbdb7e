"""orchestrator/evidence/parse.py against real-format log excerpts (tests/fixtures/logs)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import orchestrator.evidence.parse as parse
from orchestrator.evidence.parse import parse_bytes, parse_file, parse_stream, rank_from_path
from orchestrator.evidence.records import (
    SIMULATED_MARKER,
    IterationRecord,
    MemoryRecord,
    NcclTimeoutRecord,
    SlurmCancelRecord,
    TimerBlock,
)

LOGS = Path(__file__).parent.parent / "fixtures" / "logs"


def log(name: str):
    return parse_file(LOGS / name)


def test_iteration_line_with_every_optional_field():
    it = log("megatron_full.log").iterations
    assert [r.iteration for r in it] == [1, 2, 3]
    r = it[0]
    assert (r.train_iters, r.consumed_samples, r.skipped_samples) == (10, 512, 0)
    assert r.elapsed_ms == 45123.4 and r.tflops_per_gpu == 112.5
    assert (r.energy_j_per_gpu, r.power_w_per_gpu) == (30123.4, 667.6)
    assert r.learning_rate == pytest.approx(1e-5) and r.global_batch_size == 512
    assert r.losses == {
        "lm loss": pytest.approx(11.73438),
        "mtp_1 loss": pytest.approx(11.80012),
        "load_balancing_loss": 1.02,
    }
    assert (r.loss_scale, r.grad_norm, r.num_zeros, r.params_norm) == (1.0, 12.345, 0, 1234.567)
    assert (r.skipped_iterations, r.nan_iterations) == (0, 0)
    assert r.timestamp == "2026-11-29 10:01:59.123456"


def test_iteration_line_without_optional_fields():
    a, b = log("megatron_minimal.log").iterations
    assert (a.iteration, a.elapsed_ms, a.global_batch_size, a.losses) == (1, 2000.0, 64, {"lm loss": 10.5})
    for name in (
        "skipped_samples",
        "tflops_per_gpu",
        "energy_j_per_gpu",
        "power_w_per_gpu",
        "learning_rate",
        "grad_norm",
        "num_zeros",
        "params_norm",
    ):
        assert getattr(a, name) is None, name
    assert (b.skipped_iterations, b.nan_iterations) == (1, 1)


def test_generic_path_reads_unknown_field_order():
    line = (
        b" [2026-11-29 10:00:00.000000] iteration        7/      10 | consumed samples:          7 |"
        b" packed seqs: many | elapsed time per iteration (ms): 12.5 | global batch size:     1 |"
        b" lm loss: 2.000000E+00 | loss scale: 1.0 | number of skipped iterations:   0 |"
        b" number of nan iterations:   0 |\n"
    )
    (r,) = parse_bytes(line).iterations
    assert (r.iteration, r.elapsed_ms, r.losses) == (7, 12.5, {"lm loss": 2.0})


def test_memory_lines():
    with open(LOGS / "megatron_full.log", "rb") as fh:  # every line's record, as the stream yields them
        full = [r for r in parse_stream(fh) if isinstance(r, MemoryRecord)]
    assert [(m.rank, m.after_iterations) for m in full] == [(63, 1), (63, 2)]
    assert full[1].max_allocated == 76543.21 and full[1].max_reserved == 80000.0
    assert full[1].total_device_used == 81012.5
    (peak,) = log("megatron_full.log").memory  # a ParsedLog keeps one record per rank: its peaks
    assert (peak.rank, peak.after_iterations) == (63, 2)
    assert peak.max_allocated == max(m.max_allocated for m in full) and peak.max_reserved == 80000.0
    (minimal,) = log("megatron_minimal.log").memory
    assert minimal.total_device_used is None and minimal.allocated == 1200.5


def test_timer_blocks_minmax_max_and_all():
    full = log("megatron_full.log").timers
    assert [b.kind for b in full] == ["minmax"] * 3
    assert full[0].timers["forward-backward"] == (44012.31, 44980.77)
    assert full[0].timers["embedding-grads-all-reduce"] == (0.03, 0.71)
    assert [b.after_iteration for b in full] == [1, 2, 3]
    mx, alls = log("megatron_minimal.log").timers
    assert mx.kind == "max" and mx.timers == {"forward-backward": (None, 1900.0), "optimizer": (None, 50.25)}
    assert alls.kind == "all"
    assert alls.per_rank["forward-backward"] == {0: 900.0, 1: 950.5, 2: 990.25}
    assert alls.timers["forward-backward"] == (900.0, 990.25)


def test_straggler_and_bottom_top_lines():
    p = log("megatron_full.log")
    (s,) = p.stragglers
    assert (s.min_rtt_ms, s.min_rtt_rank, s.max_rtt_ms, s.max_rtt_rank) == (44100.12, 5, 45120.88, 61)
    assert (s.min_etpt_tf, s.min_etpt_rank, s.max_etpt_tf, s.max_etpt_rank) == (108.4, 61, 114.9, 5)
    assert s.fields["MxPwr"] == (700.0, "W", 61) and s.fields["MnClk"] == (1755.0, "MHz", 61)
    assert [(r.which, r.entries) for r in p.straggler_ranks] == [
        ("bottom", [(108.4, 61), (109.1, 60)]),
        ("top", [(114.1, 4), (114.9, 5)]),
    ]


def test_event_markers():
    names = [e.name for e in log("megatron_full.log").events]
    assert names[0] == "after megatron is initialized"
    assert names[-1] == "exiting program at iteration 3"


def test_cuda_oom_traceback_and_snapshot_under_srun_prefix():
    p = log("oom.log")
    cuda, snap = p.ooms
    assert (cuda.kind, cuda.rank, cuda.tried_to_allocate) == ("cuda", 3, "3.50 GiB")
    assert cuda.line.startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert (snap.kind, snap.rank, snap.snapshot_path) == ("snapshot", 3, "/scratch/snap/snapshot_oom_rank_3.pickle")
    (tb,) = p.tracebacks
    assert tb.exc_type == "torch.OutOfMemoryError" and tb.rank == 3
    assert tb.last_frame == "/opt/megatron-lm/megatron/core/transformer/moe/experts.py:245 in forward"
    assert p.iterations[0].rank == 7


def test_nccl_watchdog_expert_group():
    caught, *detected = log("nccl_ep.log").nccl
    assert isinstance(caught, NcclTimeoutRecord)
    assert (caught.kind, caught.rank, caught.op_type, caught.seq_num) == ("caught", 12, "ALLTOALL_BASE", 2231)
    assert (caught.timeout_ms, caught.ran_ms) == (600000, 600013)
    assert {d.kind for d in detected} == {"detected"}
    assert {(d.process_group, d.pg_id, d.group_rank, d.seq_num) for d in detected} == {
        ("EXPERT_MODEL_PARALLEL_GROUP", 9, 4, 2231)
    }
    assert detected[-1].last_enqueued == 2233 and detected[-1].last_completed == 2230


def test_nccl_watchdog_data_parallel_group_and_terminate_line():
    recs = log("nccl_dp.log").nccl
    assert [r.kind for r in recs] == ["caught", "detected", "caught"]
    assert recs[0].op_type == "_REDUCE_SCATTER_BASE" and recs[0].process_group is None
    assert recs[2].process_group == "DATA_PARALLEL_GROUP" and recs[2].seq_num == 88


def test_nccl_heartbeat_stuck():
    (r,) = log("nccl_stuck.log").nccl
    assert (r.kind, r.timeout_ms, r.rank, r.process_group) == ("stuck", 480000, 5, "default_pg")


def test_tracebacks_and_argparse_errors_are_facts_not_verdicts():
    """The parser reports the exception and where it was raised; whether that is a configuration error is
    orchestrator.evidence.classify's call (tests/evidence/test_classify.py)."""
    p = log("validation_world.log")
    (w,) = p.tracebacks
    assert w.exc_type == "AssertionError" and "is not divisible by total_model_size" in w.message
    assert w.last_frame.endswith("arguments.py:431 in validate_args")
    assert not p.validation_errors
    layers = log("validation_layers.log").tracebacks
    assert [v.rank for v in layers] == [0, 1]
    assert layers[0].message == "Number of layers should be divisible by the pipeline-model-parallel size"
    (a,) = log("validation_argparse.log").validation_errors
    assert (a.exc_type, a.message) == ("argparse", "unrecognized arguments: --moe-frobnicate 3")
    (tb,) = log("crash.log").tracebacks
    assert (tb.exc_type, tb.message) == ("RuntimeError", "index file is corrupt: /data/idx/train_text_document.idx")


@pytest.mark.parametrize(
    "name,entity,job,node,reason",
    [
        ("slurm_timeout.log", "JOB", "4242", "n3", "TIME LIMIT"),
        ("slurm_preempt.log", "STEP", "4243.0", "n1", "PREEMPTION"),
        ("slurm_nodefail_new.log", "JOB", "4244", "n2", "NODE FAILURE"),
        ("slurm_nodefail_old.log", "JOB", "4245", None, "NODE FAILURE"),
        ("slurm_cancel.log", "JOB", "4246", "n1", ""),
    ],
)
def test_slurm_cancel_lines(name, entity, job, node, reason):
    (c,) = log(name).slurm_cancels
    assert isinstance(c, SlurmCancelRecord)
    assert (c.entity, c.job_id, c.node, c.reason) == (entity, job, node, reason)
    assert c.time.startswith("2026-11-29T")


def test_host_oom_kill():
    (o,) = log("host_oom.log").ooms
    assert o.kind == "host" and "oom-kill" in o.line


def test_simulated_marker():
    p = log("simulated.log")
    assert SIMULATED_MARKER == "[SIMULATED]"
    assert p.simulated and p.simulated_markers[0].text.startswith("twin workload")
    assert not log("megatron_full.log").simulated


def test_interleaved_srun_ranks_and_timer_rows():
    p = log("interleaved_srun.log")
    assert [r.rank for r in p.iterations] == [7, 7]
    assert sorted(m.rank for m in p.memory) == [0, 2, 4, 6]
    b1, b2 = p.timers
    assert b1.rank == 7 and b1.timers == {
        "forward-backward": (4800.0, 4990.0),
        "all-grads-sync": (20.0, 60.0),
        "optimizer": (10.0, 12.0),
    }
    assert b2.timers == {"forward-backward": (4700.0, 4790.0), "optimizer": (9.0, 11.0)}
    assert p.garbage_lines == 0


def test_truncated_last_line_gives_no_bogus_record():
    p = log("truncated.log")
    assert p.truncated and [r.iteration for r in p.iterations] == [1]
    # a failure signature on an unterminated last line still counts
    recs = list(
        parse_stream(
            [b"noise\n", b"slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2026-11-29T12:00:00 DUE TO TIME LIMIT ***"]
        )
    )
    assert [type(r) for r in recs] == [SlurmCancelRecord]


def test_garbage_and_non_utf8_bytes():
    p = log("garbage.log")
    assert p.garbage_lines == 3  # invalid UTF-8, a NUL, a mangled iteration line
    assert [r.iteration for r in p.iterations] == [2]
    assert not p.truncated


def test_carriage_returns_split_progress_bars():
    data = (
        b"Loading 10%\r [2026-11-29 10:00:00.000000] iteration        1/       2 |"
        b" consumed samples:            8 | elapsed time per iteration (ms): 5.0 |"
        b" global batch size:     8 | lm loss: 1.000000E+00 | loss scale: 1.0 |"
        b" number of skipped iterations:   0 | number of nan iterations:   0 |\r\n"
    )
    assert [r.elapsed_ms for r in parse_bytes(data).iterations] == [5.0]


def test_stream_and_file_agree(tmp_path):
    raw = (LOGS / "interleaved_srun.log").read_bytes()
    from_lines = list(parse_stream(raw.splitlines(keepends=True)))
    from_fileobj = list(parse_stream(io.BytesIO(raw)))
    assert from_lines == from_fileobj
    p = parse_file(LOGS / "interleaved_srun.log")
    assert sum(isinstance(r, IterationRecord) for r in from_lines) == len(p.iterations)
    assert [r for r in from_lines if isinstance(r, TimerBlock)] == p.timers


@pytest.mark.parametrize("chunk", [97, 700, 1500, 4096])
def test_small_chunks_give_the_same_records(monkeypatch, chunk):
    """Chunk boundaries (cut before the last iteration line) must not split timer blocks."""
    raw = b"".join(
        (LOGS / n).read_bytes()
        for n in ("megatron_full.log", "interleaved_srun.log", "oom.log", "megatron_minimal.log")
    )
    whole = list(parse_stream(io.BytesIO(raw)))
    monkeypatch.setattr(parse, "_CHUNK", chunk)
    assert list(parse_stream(io.BytesIO(raw))) == whole


def test_rank_from_path():
    assert rank_from_path("/x/attempt-0/rank-12.out") == 12
    assert rank_from_path("/x/log.txt") is None
    assert parse_file(LOGS / "megatron_full.log").source_rank is None


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=80),
            st.sampled_from([(LOGS / "megatron_full.log").read_bytes()[:n] for n in (200, 900, 1500, 2600)]),
            st.sampled_from(
                [
                    b"\r",
                    b"\n",
                    b"\x00",
                    b"    x ....: (1, 2)\n",
                    b"Traceback (most recent call last)\n",
                    b'  File "a.py", line 1, in f\n',
                    b"ValueError: must be divisible\n",
                ]
            ),
        ),
        max_size=12,
    )
)
def test_arbitrary_bytes_never_raise(chunks):
    p = parse_bytes(b"".join(chunks))
    assert p.lines >= 0 and p.garbage_lines >= 0
    for r in p.iterations:  # anything that parsed as an iteration is internally consistent
        assert r.elapsed_ms >= 0 or r.elapsed_ms != r.elapsed_ms


def test_marker_prefixing_a_record_keeps_both():
    data = (
        b"[SIMULATED]  [2026-11-29 10:00:00.000000] iteration        1/       2 | consumed samples:"
        b"            8 | elapsed time per iteration (ms): 5.0 | global batch size:     8 |"
        b" lm loss: 1.000000E+00 | loss scale: 1.0 | number of skipped iterations:   0 |"
        b" number of nan iterations:   0 |\n"
        b"3: [SIMULATED] INFO:megatron.core.timers:(min, max) time across ranks (ms):\n"
        b"3:     forward-backward ...............................: (1.00, 2.00)\n"
    )
    p = parse_bytes(data)
    assert p.simulated and len(p.simulated_markers) == 2
    assert [r.elapsed_ms for r in p.iterations] == [5.0]
    assert p.timers[0].timers == {"forward-backward": (1.0, 2.0)}


def test_heavily_interleaved_timer_rows_stay_with_their_rank():
    """Other ranks' lines between every row (srun -l): each block still gets all its rows."""
    lines, names = [], ["forward-backward", "all-grads-sync", "optimizer"]
    for it in range(1, 41):
        lines.append(
            f"15:  [2026-11-29 10:00:00.000000] iteration {it:8d}/      40 | consumed samples:"
            f" {it * 8:12d} | elapsed time per iteration (ms): 100.0 | global batch size:     8 |"
            f" lm loss: 1.0E+00 | loss scale: 1.0 | number of skipped iterations:   0 |"
            f" number of nan iterations:   0 |"
        )
        lines.append("15: INFO:megatron.core.timers:(min, max) time across ranks (ms):")
        for j, n in enumerate(names):
            lines.append(f"15:     {(n + ' ').ljust(48, '.')}: ({it}.00, {it + j}.50)")
            lines.append(f"{(it + j) % 15}: n0:1:1 [{j}] NCCL INFO Channel 00 : 5[5] -> 6[6] via P2P")
            lines.append(f" 5:     {(n + ' ').ljust(48, '.')}: (0.00, 0.00)")  # another rank's look-alike row
    p = parse_bytes(("\n".join(lines) + "\n").encode())
    assert len(p.timers) == 40 and all(b.rank == 15 for b in p.timers)
    assert [b.after_iteration for b in p.timers] == list(range(1, 41))
    for it, b in enumerate(p.timers, start=1):
        assert b.timers == {n: (float(it), it + j + 0.5) for j, n in enumerate(names)}


def test_long_noise_after_the_last_timer_block_is_read_in_bounded_chunks(monkeypatch):
    raw = (
        (LOGS / "megatron_full.log").read_bytes()
        + b"noise line\n" * 3000
        + b"slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2026-11-29T12:00:00 DUE TO TIME LIMIT ***\n"
    )
    whole = list(parse_stream(io.BytesIO(raw)))
    monkeypatch.setattr(parse, "_CHUNK", 256)
    monkeypatch.setattr(parse, "_BLOCK_MAX", 512)
    sizes = []
    real_chunk = parse._Parser.chunk

    def spy(self, buf, final):
        sizes.append(len(buf))
        return real_chunk(self, buf, final)

    monkeypatch.setattr(parse._Parser, "chunk", spy)
    assert list(parse_stream(io.BytesIO(raw))) == whole
    assert max(sizes) < 2048  # the buffer does not grow with the noise after the last block
