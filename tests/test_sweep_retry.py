"""Retry rules: retryable classes up to max_attempts, TIMEOUT once, deterministic failures only on request."""

from __future__ import annotations

from orchestrator.sweep.retry import retry_decision

R = ["NODE_FAIL", "PREEMPTED", "NCCL_TIMEOUT"]


def test_retryable_classes_until_max_attempts():
    assert retry_decision("NODE_FAIL", ["NODE_FAIL"], max_attempts=3, retry_classes=R)[0]
    assert retry_decision("PREEMPTED", ["NODE_FAIL", "PREEMPTED"], max_attempts=3, retry_classes=R)[0]
    assert not retry_decision("NCCL_TIMEOUT", ["NCCL_TIMEOUT"] * 3, max_attempts=3, retry_classes=R)[0]


def test_timeout_is_retried_once():
    assert retry_decision("TIMEOUT", ["TIMEOUT"], max_attempts=3, retry_classes=R)[0]
    ok, why = retry_decision("TIMEOUT", ["TIMEOUT", "TIMEOUT"], max_attempts=3, retry_classes=R)
    assert not ok and "once" in why


def test_deterministic_and_cancelled_are_not_retried_unless_asked():
    for fc in ("OOM", "INVALID_CONFIG", "CANCELLED", "CRASH"):
        assert not retry_decision(fc, [fc], max_attempts=3, retry_classes=R)[0]
    assert retry_decision("OOM", ["OOM"], max_attempts=3, retry_classes=R, asked={"oom"})[0]
    assert not retry_decision("OOM", ["OOM", "OOM"], max_attempts=2, retry_classes=R, asked={"oom"})[0]
