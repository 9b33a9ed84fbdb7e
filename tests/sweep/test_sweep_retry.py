"""Retry rules: retryable classes up to max_attempts, TIMEOUT once, deterministic failures only on request.

One policy: orchestrator.core.failures' table gives `policy.driver.retry_classes` its default and says how often each
class is retried; retry_decision is the one decision (the sweep loop and the finalists)."""

from __future__ import annotations

import pytest

from orchestrator.config import compose
from orchestrator.core import failures
from orchestrator.core.schema import PolicyConfig
from orchestrator.sweep.retry import retry_decision

R = PolicyConfig().driver.retry_classes


def test_default_retry_classes_come_from_the_table():
    assert list(failures.DEFAULT_RETRY_CLASSES) == R
    assert compose([]).cfg.policy.driver.retry_classes == R  # conf/ does not override it with its own list


def test_retryable_classes_until_max_attempts():
    assert retry_decision("NODE_FAIL", ["NODE_FAIL"], max_attempts=3, retry_classes=R)[0]
    assert retry_decision("PREEMPTED", ["NODE_FAIL", "PREEMPTED"], max_attempts=3, retry_classes=R)[0]
    assert not retry_decision("NCCL_TIMEOUT", ["NCCL_TIMEOUT"] * 3, max_attempts=3, retry_classes=R)[0]


def test_timeout_is_retried_once():
    assert retry_decision("TIMEOUT", ["TIMEOUT"], max_attempts=3, retry_classes=R)[0]
    ok, why = retry_decision("TIMEOUT", ["TIMEOUT", "TIMEOUT"], max_attempts=3, retry_classes=R)
    assert not ok and "once" in why
    # a config that leaves TIMEOUT out is obeyed: no special case outside the table and the config
    assert not retry_decision("TIMEOUT", ["TIMEOUT"], max_attempts=3, retry_classes=["NODE_FAIL"])[0]


def test_deterministic_and_cancelled_are_not_retried_unless_asked():
    for fc in ("OOM", "INVALID_CONFIG", "CANCELLED", "CRASH"):
        assert not retry_decision(fc, [fc], max_attempts=3, retry_classes=R)[0]
    assert retry_decision("OOM", ["OOM"], max_attempts=3, retry_classes=R)[1] == "deterministic"
    assert retry_decision("OOM", ["OOM"], max_attempts=3, retry_classes=R, asked={"oom"})[0]
    assert not retry_decision("OOM", ["OOM", "OOM"], max_attempts=2, retry_classes=R, asked={"oom"})[0]


@pytest.mark.parametrize("fc", failures.TABLE, ids=lambda fc: fc.name)
def test_each_class_under_the_default_config(fc):
    """How many times in a row an attempt failing with this class is resubmitted (max_attempts = 5)."""
    history: list[str | None] = []
    retries = 0
    while True:
        history.append(fc.name)
        again, _why = retry_decision(fc.name, history, max_attempts=5)
        if not again:
            break
        retries += 1
    expected = {failures.Retry.NEVER: 0, failures.Retry.ONCE: 1, failures.Retry.UP_TO_MAX: 4, failures.Retry.ALWAYS: 4}[
        fc.retry
    ]
    assert retries == expected
    assert retries == {"TIMEOUT": 1, "OOM": 0, "INVALID_CONFIG": 0}.get(fc.name, retries)


def test_unknown_class_or_slurm_state_is_not_retried():
    assert retry_decision("VANISHED", ["VANISHED"], max_attempts=3) == (False, "not a retryable class")
    assert not retry_decision(None, [None], max_attempts=3)[0]


def test_lost_is_retried_even_when_a_stored_config_predates_the_class():
    """LOST (a job killed with its orchestrator) is no verdict on the layout: retried up to max_attempts
    whatever retry_classes a sweep stored before the class existed (issue 10 fault 5)."""
    old = ["NODE_FAIL", "PREEMPTED", "NCCL_TIMEOUT", "TIMEOUT"]
    assert retry_decision("LOST", ["LOST"], max_attempts=3, retry_classes=old)[0]
    assert not retry_decision("LOST", ["LOST"] * 3, max_attempts=3, retry_classes=old)[0]
