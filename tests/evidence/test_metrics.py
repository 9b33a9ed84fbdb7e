"""orchestrator/evidence/metrics.py: windows, percentiles, throughput arithmetic, heaviest/slowest rank, MoE
evidence."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.evidence.metrics import (
    compute,
    heaviest,
    load_sidecars,
    moe_evidence,
    percentile,
    rank_memory,
    settled_iters,
    summarize,
    window,
)
from orchestrator.evidence.parse import parse_bytes, parse_file
from orchestrator.evidence.records import IterationRecord

LOGS = Path(__file__).parent.parent / "fixtures" / "logs"


def it(i: int, ms: float, **kw) -> IterationRecord:
    return IterationRecord(iteration=i, train_iters=100, consumed_samples=i * 8, elapsed_ms=ms, **kw)


def synthetic_log(step_ms, gbs=512, tflops=None):
    """A last-rank log in Megatron's format with one iteration line per entry of step_ms."""
    lines = []
    for i, ms in enumerate(step_ms, start=1):
        tp = f" throughput per GPU (TFLOP/s/GPU): {tflops[i - 1]:.1f} |" if tflops else ""
        lines.append(
            f" [2026-11-29 10:00:{i % 60:02d}.000000] iteration {i:8d}/{100:8d} | consumed samples:"
            f" {i * gbs:12d} | elapsed time per iteration (ms): {ms:.1f} |{tp} global batch size:"
            f" {gbs:5d} | lm loss: {10 - i * 0.1:.6E} | loss scale: 1.0 | grad norm: {i:.3f} |"
            f" number of skipped iterations:   0 | number of nan iterations:   0 |"
        )
    return parse_bytes(("\n".join(lines) + "\n").encode())


def test_window_excludes_warmup_and_takes_measure_iters():
    recs = [it(i, 100.0 * i) for i in range(1, 11)]
    measured, partial = window(recs, warmup_iters=2, measure_iters=3)
    assert [r.iteration for r in measured] == [3, 4, 5] and not partial


def test_window_partial_uses_only_completed_iterations():
    recs = [it(i, 100.0) for i in range(1, 5)]
    measured, partial = window(recs, warmup_iters=2, measure_iters=5)
    assert [r.iteration for r in measured] == [3, 4] and partial
    measured, partial = window(recs[:2], warmup_iters=2, measure_iters=5)
    assert measured == [] and partial


def test_window_deduplicates_iterations_seen_twice():
    recs = [it(3, 1.0), it(3, 2.0), it(4, 3.0)]
    measured, _ = window(recs, warmup_iters=2, measure_iters=2)
    assert [r.elapsed_ms for r in measured] == [2.0, 3.0]


def test_percentiles_linear_interpolation():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 20], 95) == pytest.approx(19.5)
    assert percentile([7], 99) == 7 and percentile([], 50) is None
    s = summarize([4.0, 1.0, 3.0, 2.0])
    assert (s.p50, s.mean, s.max) == (2.5, 2.5, 4.0)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=50),
    st.sampled_from([50, 95, 99]),
)
def test_percentile_matches_numpy_linear(xs, q):
    assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q, method="linear")), rel=1e-9, abs=1e-9)


def test_tokens_per_s_tflops_and_mfu_arithmetic():
    # steps 1..2 warmup; measured: 4.0, 5.0, 6.0 s -> p50 = 5.0 s
    log = synthetic_log([9000, 9000, 4000, 5000, 6000, 7000], gbs=512, tflops=[1, 2, 300, 310, 320, 9])
    res = compute(
        [log],
        warmup_iters=2,
        measure_iters=3,
        seq_length=4096,
        n_gpus=64,
        model_flops_per_step=3.2e16,
        recompute_flops_per_step=6.4e15,
        peak_tflops=989.0,
        peak_label="bf16 dense 989 TFLOP/s",
    )
    assert res.step_times_s == [4.0, 5.0, 6.0] and res.measure_iters == 3 and not res.partial
    assert res.step_p50_s == 5.0 and res.step_mean_s == 5.0 and res.step_max_s == 6.0
    assert res.step_p95_s == pytest.approx(5.9)
    assert res.tokens_per_s == pytest.approx(512 * 4096 / 5.0)
    assert res.tokens_per_s_per_gpu == pytest.approx(512 * 4096 / 5.0 / 64)
    assert res.tflops_per_gpu == pytest.approx(3.2e16 / (5.0 * 64 * 1e12))  # 100 TFLOP/s
    assert res.mfu == pytest.approx(100.0 / 989.0) and res.mfu_peak == "bf16 dense 989 TFLOP/s"
    assert res.recompute_tflops_per_gpu == pytest.approx(20.0)
    assert res.megatron_tflops_per_gpu == 310.0  # Megatron's own, median over the window
    assert res.lm_loss == pytest.approx([9.7, 9.6, 9.5]) and res.grad_norm == [3.0, 4.0, 5.0]
    assert res.ok and res.warmup_iters == 2 and res.measure_iters_requested == 3


def test_partial_run_is_flagged_and_never_extrapolated():
    log = synthetic_log([9000, 1000, 2000])
    res = compute([log], warmup_iters=1, measure_iters=10, seq_length=8, n_gpus=1)
    assert res.partial and res.measure_iters == 2 and res.step_times_s == [1.0, 2.0]
    assert res.tokens_per_s == pytest.approx(512 * 8 / 1.5)


def test_nothing_measured_leaves_metrics_empty():
    res = compute([synthetic_log([1000])], warmup_iters=5, measure_iters=5, seq_length=8, n_gpus=1)
    assert not res.ok and res.partial and res.step_p50_s is None and res.tokens_per_s is None


def test_heaviest_rank_from_memory_lines_and_sidecars():
    log = parse_file(LOGS / "interleaved_srun.log")
    pp = {0: 0, 2: 1, 4: 2, 6: 3, 5: 2}
    ranks = rank_memory([log], [], pp)
    assert [r.rank for r in ranks] == [0, 2, 4, 6]
    top = heaviest(ranks)
    assert (top.rank, top.pp_stage, top.allocated_mb, top.source) == (2, 1, 52000.0, "log")
    # a sidecar sees a GPU the log never printed (DP-rank != 0) and lowers rank 2's peak
    sidecars = [
        {"rank": 5, "peak_allocated_mb": 61440.0, "peak_reserved_mb": 65536.0},
        {"rank": 2, "peak_allocated_mb": 50000.0, "peak_reserved_mb": 53000.0, "pp_stage": 7},
    ]
    res = compute([log], sidecars, warmup_iters=0, measure_iters=2, seq_length=8, n_gpus=8, pp_of_rank=pp.get)
    assert (res.heaviest_rank, res.heaviest_pp_stage) == (5, 2)
    # Megatron's MB are MiB; results are decimal GB like the planner's predictions
    assert res.peak_allocated_gb == pytest.approx(61440 * 2**20 / 1e9) and res.peak_reserved_gb == pytest.approx(
        65536 * 2**20 / 1e9
    )
    by_rank = {r.rank: r for r in res.rank_memory}
    assert by_rank[2].allocated_mb == 50000.0 and by_rank[2].pp_stage == 7 and by_rank[2].source == "sidecar"


def test_heaviest_tie_breaks_on_reserved():
    log = parse_bytes(
        b"[Rank 1] (after 1 iterations) memory (MB) | allocated: 1.00 | max allocated: 10.00 |"
        b" reserved: 1.00 | max reserved: 11.00\n"
        b"[Rank 3] (after 1 iterations) memory (MB) | allocated: 1.00 | max allocated: 10.00 |"
        b" reserved: 1.00 | max reserved: 12.00\n"
    )
    assert heaviest(rank_memory([log], [])).rank == 3


def test_slowest_rank_from_straggler_lines_and_timers_summary():
    log = parse_file(LOGS / "megatron_full.log")
    res = compute([log], warmup_iters=1, measure_iters=2, seq_length=4096, n_gpus=64, pp_of_rank=lambda r: r // 16)
    assert (res.slowest_rank, res.slowest_stage) == (61, 3)
    # timer blocks after iterations 2 and 3 are in the window: medians of min and max
    assert res.timers_ms["forward-backward"] == [pytest.approx(40000.5), pytest.approx(40600.0)]
    assert res.timers_ms["optimizer"] == [pytest.approx(78.5), pytest.approx(89.0)]
    assert res.megatron_tflops_per_gpu == pytest.approx((124.2 + 125.3) / 2)


def test_slowest_rank_from_per_rank_timers():
    log = parse_file(LOGS / "megatron_minimal.log")
    res = compute([log], warmup_iters=1, measure_iters=1, seq_length=8, n_gpus=3)
    assert res.slowest_rank == 2


def test_moe_evidence_from_sidecars():
    sidecars = [
        {
            "rank": 0,
            "tokens_per_expert": [100, 100, 400, 0],
            "routed_tokens": 600,
            "dropped_tokens": 60,
            "padded_tokens": 20,
        },
        {
            "rank": 1,
            "tokens_per_expert": [100, 100, 0, 0],
            "routed_tokens": 200,
            "dropped_tokens": 20,
            "padded_tokens": 0,
        },
    ]
    ev = moe_evidence(sidecars)
    assert ev["token_drop_fraction"] == pytest.approx(80 / 800)
    assert ev["padding_fraction"] == pytest.approx(20 / (800 - 80 + 20))
    load = [200, 200, 400, 0]
    assert ev["expert_load_p50"] == pytest.approx(np.percentile(load, 50))
    assert ev["expert_load_p99"] == pytest.approx(np.percentile(load, 99))
    assert ev["hot_expert_ratio"] == pytest.approx(400 / 200)
    assert ev["hot_expert"] is None and ev["hot_rank_tokens_p50"] is None  # no per-dispatch evidence (the twin)
    assert moe_evidence([])["token_drop_fraction"] is None


def test_hot_rank_per_dispatch_and_hot_expert_per_layer():
    """Two EP groups' writers (ranks 0 and 64), two MoE layers each: percentiles run over every sampled dispatch
    of every layer and group, not over a window-long sum; the hot expert is the worst layer's."""
    ep_load = {
        0: [
            {"layer": "2", "hot_rank_tokens": [900, 1100], "hot_rank_share": [0.03, 0.05], "hot_expert": 7,
             "hot_expert_ratio": 1.8},
            {"layer": "4", "hot_rank_tokens": [1000, 2000], "hot_rank_share": [0.04, 0.09], "hot_expert": 301,
             "hot_expert_ratio": 3.5},
        ],
        64: [
            {"layer": "2", "hot_rank_tokens": [950, 1050], "hot_rank_share": [0.035, None], "hot_expert": 9,
             "hot_expert_ratio": 2.0},
        ],
    }  # fmt: skip
    sidecars = [
        {"rank": r, "ep_load": layers, "routed_tokens": 10, "dropped_tokens": 0} for r, layers in ep_load.items()
    ]
    sidecars.append({"rank": 5, "routed_tokens": 10, "dropped_tokens": 0})  # not an EP writer
    ev = moe_evidence(sidecars)
    tokens = [900, 1100, 1000, 2000, 950, 1050]
    shares = [0.03, 0.05, 0.04, 0.09, 0.035]
    for q in (50, 95, 99):
        assert ev[f"hot_rank_tokens_p{q}"] == pytest.approx(np.percentile(tokens, q))
        assert ev[f"hot_rank_share_p{q}"] == pytest.approx(np.percentile(shares, q))
    assert ev["hot_expert"] == "layer 4 expert 301" and ev["hot_expert_ratio"] == 3.5
    assert ev["token_drop_fraction"] == 0.0 and ev["token_drop_note"] is None


def test_dispatcher_drops_are_not_measured_not_zero():
    why = "not measured: --moe-expert-rank-capacity-factor 1.5 with the hybridep dispatcher drops tokens ..."
    sidecars = [
        {"rank": 0, "routed_tokens": 600, "dropped_tokens": None, "token_drop_unmeasured": why},
        {"rank": 1, "routed_tokens": 600, "dropped_tokens": None, "token_drop_unmeasured": why},
    ]
    ev = moe_evidence(sidecars)
    assert ev["token_drop_fraction"] is None and ev["token_drop_note"] == why


def test_sidecars_from_disk_and_simulated_flag(tmp_path):
    good = tmp_path / "sidecar-rank-0.json"
    good.write_text(
        json.dumps(
            {
                "rank": 0,
                "simulated": True,
                "peak_allocated_mb": 1024.0,
                "force_balanced_routing": True,
                "lm_loss": [[2, 9.0], [3, 8.5]],
            }
        )
    )
    (tmp_path / "sidecar-rank-1.json").write_text('{"rank": 1, "peak_')  # killed mid-write
    sidecars, paths = load_sidecars(sorted(tmp_path.glob("sidecar-rank-*.json")))
    assert paths == [str(good)]
    log = parse_bytes(
        b" [2026-11-29 10:00:00.000000] iteration        2/       3 | consumed samples:"
        b"            2 | elapsed time per iteration (ms): 10.0 | global batch size:     1 |"
        b" loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
    )
    res = compute([log], sidecars, warmup_iters=1, measure_iters=2, seq_length=8, n_gpus=1, sidecar_paths=paths)
    assert res.simulated and res.force_balanced_routing and res.sidecar_paths == paths
    assert res.lm_loss == [9.0, 8.5]  # no lm loss on the log line: the sidecar's own record
    assert res.peak_allocated_gb == pytest.approx(1.073741824)  # 1024 MiB = 1.07 decimal GB
    assert compute(
        [parse_file(LOGS / "simulated.log")], warmup_iters=0, measure_iters=1, seq_length=8, n_gpus=1
    ).simulated


def test_straggler_lines_from_rank0_file_are_placed_by_timestamp():
    """Rank 0 prints straggler lines, the last rank prints iteration lines: window by clock."""
    last = synthetic_log([9000, 9000, 5000, 5000])  # iterations 1..4 at 10:00:01 .. 10:00:04
    rank0 = parse_bytes(
        b"INFO:megatron.core.utils:[2026-11-29 10:00:01] | MnRtt/Rnk: 1.00ms/0 | MxRtt/Rnk: 9.00ms/7\n"
        b"INFO:megatron.core.utils:[2026-11-29 10:00:02] | MnRtt/Rnk: 1.00ms/0 | MxRtt/Rnk: 9.00ms/7\n"
        b"INFO:megatron.core.utils:[2026-11-29 10:00:03] | MnRtt/Rnk: 1.00ms/0 | MxRtt/Rnk: 5.00ms/3\n"
        b"INFO:megatron.core.utils:[2026-11-29 10:00:04] | MnRtt/Rnk: 1.00ms/0 | MxRtt/Rnk: 5.00ms/3\n"
    )
    assert all(s.after_iteration is None for s in rank0.stragglers)
    res = compute([rank0, last], warmup_iters=2, measure_iters=2, seq_length=8, n_gpus=8)
    assert res.slowest_rank == 3  # rank 7 was slowest only during warmup


def test_settled_iters_counts_the_leading_iterations_above_the_steady_step():
    """A launch's start-up transient (compile, allocator, NCCL set-up: the twin's 1 + 2 exp(-i)) ends where an
    iteration and the median of it and the next four are back at the steady step; one straggler moves nothing."""
    steady = 2.0
    times = [steady * (1 + 2 * math.exp(-i)) for i in range(60)]  # iteration i + 1
    assert settled_iters(list(enumerate(times, 1)), steady, 0.0) == 5  # iteration 6: 1.3% over, under the 2% floor
    assert settled_iters(list(enumerate(times, 1)), steady, 0.02) == 4  # noisier: 2.5 sigma = 5% (iteration 5: 3.7%)
    straggled = [t * (3.0 if i in (30, 45) else 1.0) for i, t in enumerate(times)]
    assert settled_iters(list(enumerate(straggled, 1)), steady, 0.0) == 5
    assert settled_iters(list(enumerate([steady] * 20, 1)), steady, 0.0) == 0  # nothing to wait out
    assert settled_iters(list(enumerate([1.5 * steady] * 20, 1)), steady, 0.0) is None  # never settled
    # the same iteration printed twice (a requeued run appends): the last counts; iterations from 51 on only
    # (a log kept from its window): counted from iteration 1, as Megatron numbers them
    again = [(1, 9.0), (1, steady), *((i, steady) for i in range(2, 10))]
    assert settled_iters(again, steady, 0.0) == 0
    assert settled_iters([(i, steady) for i in range(51, 60)], steady, 0.0) == 50


def test_compute_reads_the_warm_up_for_settled_iters():
    """compute() fills settled_iters from every iteration line it is given, the warm-up's too (collect keeps
    them: orchestrator.evidence.keep, Keep.warmup); the window's p50 is the steady step."""
    ms = [3000.0, 1700.0, 1250.0, 1100.0] + [1000.0] * 56
    res = compute([synthetic_log(ms)], warmup_iters=10, measure_iters=50, seq_length=4096, n_gpus=8)
    assert res.step_p50_s == pytest.approx(1.0) and res.settled_iters == 4
