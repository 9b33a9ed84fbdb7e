"""Effective throughput (guide: Q = tokens that advanced and were not rolled back / wall time)."""

import math

import pytest

from orchestrator.core.schema import EffectiveConfig
from orchestrator.evidence.effective import effective_throughput, q_from_fraction


def test_guide_example_ranks_the_slower_layout_first():
    a = q_from_fraction(1.0e6, 0.90)
    b = q_from_fraction(1.1e6, 0.80)
    assert a == pytest.approx(0.90e6)
    assert b == pytest.approx(0.88e6)
    assert a > b  # higher steady throughput loses once downtime is counted


def test_default_rate_is_llama3_unexpected_interruptions():
    rate = EffectiveConfig().interruption_rate_per_gpu_hour
    assert rate * 54 * 24 * 16384 == pytest.approx(419)


def test_no_failures_and_free_saves_give_steady_throughput():
    e = effective_throughput(
        1e6,
        n_gpus=1024,
        save_s=0,
        restore_s=0,
        checkpoint_interval_s=600,
        interruption_rate_per_gpu_hour=0,
        restart_overhead_s=0,
    )
    assert e.q_effective == pytest.approx(1e6)


def test_more_gpus_and_slower_saves_cost_throughput():
    kw = dict(restore_s=120, checkpoint_interval_s=1800, interruption_rate_per_gpu_hour=2e-5, restart_overhead_s=600)
    small = effective_throughput(1e6, n_gpus=1024, save_s=30, **kw)
    big = effective_throughput(1e6, n_gpus=16384, save_s=30, **kw)
    slow_save = effective_throughput(1e6, n_gpus=16384, save_s=300, **kw)
    assert small.q_effective > big.q_effective > slow_save.q_effective
    assert big.interruptions_per_day == pytest.approx(2e-5 * 16384 * 24)
    assert 0 < slow_save.effective_fraction < 1 and not math.isnan(slow_save.q_effective)


def test_bad_fraction_is_refused():
    with pytest.raises(ValueError, match="effective fraction"):
        q_from_fraction(1e6, 1.5)
