"""The failure classes: one table says what each class means, whether it is retried, and what implies it.

Why one table: the classifier (orchestrator.evidence.classify), the retry decision (orchestrator.sweep.retry, used by
the
sweep loop and the finalists), the config default (`policy.driver.retry_classes`), the policy's notion of a
deterministic failure and `JobResult.retryable` all read it, so adding a class or changing a retry
default is a change here and nowhere else. Stdlib only: it is imported on compute nodes.

Evidence, strongest first (orchestrator.evidence.classify applies it in this order):
- `epilogue`: the reason in slurmstepd's `*** JOB|STEP <id> ... CANCELLED AT <t> DUE TO <reason> ***` line;
- `sacct`: Slurm's job state (first word: "CANCELLED by 0" is CANCELLED);
- `log`: the ParsedLog record lists that imply the class (root causes before symptoms: FAILURE_CLASSES order);
- `exit_code`: a non-zero exit status implies it.
`slurm_first` says whether Slurm's word beats the logs: the job was stopped from outside (time limit,
preemption, node failure, host OOM kill). Otherwise it decides only when the logs name no cause: a plain
cancel is often the orchestrator killing a job that hangs after one rank OOMed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum

from orchestrator.core.states import AttemptState as S


class Failure(StrEnum):
    """The failure-class names (stored in the ledger as these strings); TABLE below says what each means."""

    INVALID_CONFIG = "INVALID_CONFIG"
    OOM = "OOM"
    NCCL_TIMEOUT = "NCCL_TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    CRASH = "CRASH"
    LOST = "LOST"
    NO_OUTPUT = "NO_OUTPUT"
    PROBE_FAILED = "PROBE_FAILED"


class Retry(Enum):
    """How often a class is resubmitted by default."""

    NEVER = "never"
    ONCE = "once"  # a second time limit means the layout is too slow for the window
    UP_TO_MAX = "up to policy.driver.max_attempts"
    ALWAYS = (
        "up to policy.driver.max_attempts, whatever policy.driver.retry_classes says"  # no verdict on the layout at all
    )


@dataclass(frozen=True)
class FailureClass:
    name: Failure
    deterministic: bool  # the layout itself does not run: it teaches the policy and is not retried
    retry: Retry
    meaning: str
    epilogue: tuple[str, ...] = ()  # slurmstepd's `DUE TO <reason>` ("": no reason, or one no class names)
    sacct: tuple[S, ...] = ()  # Slurm job states
    log: tuple[str, ...] = ()  # ParsedLog record lists
    exit_code: bool = False  # a non-zero exit status implies it
    slurm_first: bool = False  # Slurm's evidence beats the logs'


TABLE: tuple[FailureClass, ...] = (
    FailureClass(
        Failure.INVALID_CONFIG,
        True,
        Retry.NEVER,
        "Megatron rejected the configuration (argument validation, argparse, a layout check at run time)",
        log=("validation_errors", "tracebacks"),  # tracebacks: orchestrator.evidence.classify.config_errors picks them
    ),
    FailureClass(
        Failure.OOM,
        True,
        Retry.NEVER,
        "CUDA out of memory, or the host cgroup's OOM killer (retried only on request: --retry oom)",
        sacct=(S.OUT_OF_MEMORY,),
        log=("ooms",),
        slurm_first=True,
    ),
    FailureClass(
        Failure.NCCL_TIMEOUT,
        False,
        Retry.UP_TO_MAX,
        "torch's NCCL watchdog fired; `nccl_group` names EP/DP/PP/CP/TP when the log says",
        log=("nccl",),
    ),
    FailureClass(
        Failure.NODE_FAIL,
        False,
        Retry.UP_TO_MAX,
        "a node died or never booted (the retry keeps off that node)",
        epilogue=("NODE FAILURE",),
        sacct=(S.NODE_FAIL, S.BOOT_FAIL),
        slurm_first=True,
    ),
    FailureClass(
        Failure.PREEMPTED,
        False,
        Retry.UP_TO_MAX,
        "Slurm preempted or requeued the job",
        epilogue=("PREEMPTION", "JOB REQUEUE"),
        sacct=(S.PREEMPTED, S.REQUEUED),
        slurm_first=True,
    ),
    FailureClass(
        Failure.TIMEOUT,
        False,
        Retry.ONCE,
        "Slurm's time limit",
        epilogue=("TIME LIMIT",),
        sacct=(S.TIMEOUT, S.DEADLINE),
        slurm_first=True,
    ),
    FailureClass(
        Failure.CANCELLED,
        False,
        Retry.NEVER,
        "cancelled (scancel, the orchestrator) with no other cause in the logs",
        epilogue=("",),
        sacct=(S.CANCELLED,),
    ),
    FailureClass(
        Failure.CRASH,
        False,
        Retry.NEVER,
        "any other traceback, non-zero exit or FAILED state",
        sacct=(S.FAILED,),
        log=("tracebacks",),
        exit_code=True,
    ),
    FailureClass(
        Failure.LOST,
        False,
        Retry.ALWAYS,
        "the job vanished (no process, no exit status, no result) before its measurement window ended: killed "
        "with its orchestrator (kill -9 of the process group, a reboot); the folder's partial lines are no "
        "verdict, so it is measured again in a new attempt (set by orchestrator.evidence.collect for a job "
        "the launcher lost)",
    ),
    FailureClass(Failure.NO_OUTPUT, False, Retry.NEVER, "no parsable iteration line and no known signature"),
    FailureClass(
        Failure.PROBE_FAILED,
        False,  # no verdict on the layout: what failed is what only a probe runs (the fake process group, its mode)
        Retry.NEVER,  # the same probe fails the same way
        "a one-GPU rank probe crashed or printed nothing (a crash or no output of a probe, set by "
        "orchestrator.evidence.classify for a probe's attempt): the fake process group or the probe mode failed, "
        "not the layout, which is neither out of memory nor known to fit (orchestrator/plan/probe.py)",
    ),
)

BY_NAME: dict[str, FailureClass] = {fc.name: fc for fc in TABLE}
FAILURE_CLASSES: tuple[str, ...] = tuple(BY_NAME)  # the order the classifier tries log evidence in
DETERMINISTIC: tuple[str, ...] = tuple(fc.name for fc in TABLE if fc.deterministic)
DEFAULT_RETRY_CLASSES: tuple[str, ...] = tuple(fc.name for fc in TABLE if fc.retry is not Retry.NEVER)


def retried_by_default(name: str | None) -> bool:
    """Whether the default policy resubmits an attempt that failed with `name` (None = success: no)."""
    fc = BY_NAME.get(name or "")
    return fc is not None and fc.retry is not Retry.NEVER
