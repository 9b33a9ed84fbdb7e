"""orchestrator/evidence/classify.py: every failure class from real-format evidence, and the order of evidence."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core import failures
from orchestrator.core.result import FAILURE_CLASSES, JobResult
from orchestrator.evidence import classify as classify_mod
from orchestrator.evidence.classify import classify, config_errors, nccl_group_of, normalize_state
from orchestrator.evidence.parse import parse_bytes, parse_file
from orchestrator.evidence.records import ParsedLog

LOGS = Path(__file__).parent.parent / "fixtures" / "logs"


def logs(*names):
    return [parse_file(LOGS / n) for n in names]


def log1(name):
    return parse_file(LOGS / name)


@pytest.mark.parametrize(
    "name,cls,retryable,text",
    [
        ("slurm_timeout.log", "TIMEOUT", True, "DUE TO TIME LIMIT"),
        ("slurm_preempt.log", "PREEMPTED", True, "DUE TO PREEMPTION"),
        ("slurm_nodefail_new.log", "NODE_FAIL", True, "SEE SLURMCTLD LOG"),
        ("slurm_nodefail_old.log", "NODE_FAIL", True, "DUE TO NODE FAILURE ***"),
        ("slurm_cancel.log", "CANCELLED", False, "CANCELLED AT"),
        ("oom.log", "OOM", False, "torch.OutOfMemoryError: CUDA out of memory"),
        ("host_oom.log", "OOM", False, "oom-kill"),
        ("validation_world.log", "INVALID_CONFIG", False, "is not divisible by total_model_size"),
        ("validation_layers.log", "INVALID_CONFIG", False, "Number of layers should be divisible"),
        ("validation_argparse.log", "INVALID_CONFIG", False, "unrecognized arguments"),
        ("validation_runtime_schedule.log", "INVALID_CONFIG", False, "dependency bubbles"),
        ("crash.log", "CRASH", False, "RuntimeError: index file is corrupt"),
    ],
)
def test_class_from_log_evidence(name, cls, retryable, text):
    c = classify(logs(name), slurm_state="FAILED", exit_code=1)
    assert (c.failure_class, c.retryable) == (cls, retryable)
    assert text in c.detail


def test_nccl_timeout_expert_group_is_ep():
    c = classify(logs("nccl_ep.log"), exit_code=1)
    assert (c.failure_class, c.retryable, c.nccl_group, c.rank) == ("NCCL_TIMEOUT", True, "EP", 12)
    assert "OpType=ALLTOALL_BASE" in c.detail and "EXPERT_MODEL_PARALLEL_GROUP" in c.detail


def test_nccl_timeout_data_parallel_group_is_dp():
    c = classify(logs("nccl_dp.log"), slurm_state="FAILED", exit_code=134)
    assert (c.failure_class, c.nccl_group) == ("NCCL_TIMEOUT", "DP")
    assert "_REDUCE_SCATTER_BASE" in c.detail


def test_nccl_without_group_name_falls_back_to_optype_for_alltoall():
    line = (
        b"[rank3]:[E1129 12:30:01.1 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
        b"operation timeout: WorkNCCL(SeqNum=5, OpType=ALLTOALL_BASE, NumelIn=1, NumelOut=1, "
        b"Timeout(ms)=600000) ran for 600010 milliseconds before timing out.\n"
    )
    c = classify([parse_bytes(line)], exit_code=1)
    assert c.nccl_group == "EP" and "inferred from OpType" in c.detail
    c = classify([parse_bytes(line.replace(b"ALLTOALL_BASE", b"ALLREDUCE"))], exit_code=1)
    assert c.failure_class == "NCCL_TIMEOUT" and c.nccl_group is None


@pytest.mark.parametrize(
    "name,group",
    [
        ("EXPERT_MODEL_PARALLEL_GROUP", "EP"),
        ("EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", "EP"),
        ("EXPERT_DATA_PARALLEL_GROUP", "DP"),
        ("EXPERT_TENSOR_PARALLEL_GROUP", "TP"),
        ("DATA_PARALLEL_GROUP", "DP"),
        ("DATA_PARALLEL_GROUP_WITH_CP", "DP"),
        ("INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP", "DP"),
        ("PIPELINE_MODEL_PARALLEL_GROUP", "PP"),
        ("EMBEDDING_GROUP", "PP"),
        ("CONTEXT_PARALLEL_GROUP", "CP"),
        ("TENSOR_AND_CONTEXT_PARALLEL_GROUP", "CP"),
        ("TENSOR_MODEL_PARALLEL_GROUP", "TP"),
        ("default_pg", None),
        ("MODEL_PARALLEL_GROUP", None),
        (None, None),
    ],
)
def test_process_group_mapping(name, group):
    assert nccl_group_of(name) == group


@pytest.mark.parametrize(
    "state,cls",
    [
        ("TIMEOUT", "TIMEOUT"),
        ("PREEMPTED", "PREEMPTED"),
        ("NODE_FAIL", "NODE_FAIL"),
        ("OUT_OF_MEMORY", "OOM"),
        ("CANCELLED", "CANCELLED"),
        ("CANCELLED by 1000", "CANCELLED"),
        ("CANCELLED+", "CANCELLED"),
        ("REQUEUED", "PREEMPTED"),
        ("BOOT_FAIL", "NODE_FAIL"),
        ("FAILED", "CRASH"),
    ],
)
def test_class_from_sacct_state(state, cls):
    c = classify([], slurm_state=state, exit_code=None)
    assert c.failure_class == cls and state.split()[0].rstrip("+") in c.detail


def test_success_no_output_and_exit_code_crash():
    ok = classify(logs("megatron_full.log"), slurm_state="COMPLETED", exit_code=0)
    assert ok.failure_class is None and not ok.retryable
    assert classify(logs("megatron_full.log"), slurm_state="COMPLETED").failure_class is None
    none = classify([parse_bytes(b"just noise\n")], slurm_state="COMPLETED", exit_code=0)
    assert none.failure_class == "NO_OUTPUT"
    crash = classify(logs("megatron_full.log"), exit_code=139)
    assert crash.failure_class == "CRASH" and "exit code 139" in crash.detail


def test_a_cancelled_job_that_printed_iterations_is_cancelled():
    """scancel of a RUNNING job: sacct's ExitCode is "0:15" (status 0, signal 15). With iteration lines in its
    logs it read as a success (failure_class None) whenever the job ran long enough to print one (issue 10)."""
    for extra in ((), ("slurm_cancel.log",)):
        c = classify(logs("megatron_full.log", *extra), slurm_state="CANCELLED by 0", exit_code=0)
        assert c.failure_class == "CANCELLED" and not c.retryable, (extra, c)


def test_epilogue_beats_sacct_and_log_signatures():
    c = classify(logs("oom.log", "slurm_timeout.log"), slurm_state="NODE_FAIL", exit_code=1)
    assert c.failure_class == "TIMEOUT" and c.source == "slurm-line"


def test_sacct_state_beats_log_signatures():
    c = classify(logs("nccl_ep.log"), slurm_state="PREEMPTED", exit_code=1)
    assert c.failure_class == "PREEMPTED" and c.source == "sacct"


def test_log_signature_order_validation_then_oom_then_nccl_then_crash():
    """Root causes before symptoms: peers of a rank that died wait until the NCCL watchdog fires."""
    assert (
        classify(logs("crash.log", "nccl_dp.log", "oom.log", "validation_world.log"), exit_code=1).failure_class
        == "INVALID_CONFIG"
    )
    assert classify(logs("crash.log", "nccl_dp.log", "oom.log"), exit_code=1).failure_class == "OOM"
    assert classify(logs("crash.log", "nccl_dp.log"), exit_code=1).failure_class == "NCCL_TIMEOUT"
    assert classify(logs("crash.log"), exit_code=1).failure_class == "CRASH"


def test_plain_cancel_yields_to_the_oom_that_caused_it():
    assert classify(logs("oom.log"), slurm_state="CANCELLED by 0").failure_class == "OOM"
    assert classify(logs("oom.log", "slurm_cancel.log")).failure_class == "OOM"


def test_stderr_tail_is_read_too():
    tail = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "ValueError: num_moe_experts must be divisible by expert_model_parallel_size"
    )
    c = classify([], exit_code=1, stderr_tail=tail)
    assert c.failure_class == "INVALID_CONFIG" and "must be divisible" in c.detail


def test_config_errors_are_judged_here_from_tracebacks_and_argparse():
    (w,) = config_errors(log1("validation_world.log"))
    assert w.exc_type == "AssertionError" and "is not divisible by total_model_size" in w.message
    assert w.last_frame.endswith("arguments.py:431 in validate_args")
    layers = config_errors(log1("validation_layers.log"))
    assert [v.rank for v in layers] == [0, 1]
    (a,) = config_errors(log1("validation_argparse.log"))
    assert (a.exc_type, a.message) == ("argparse", "unrecognized arguments: --moe-frobnicate 3")
    (runtime,) = config_errors(log1("validation_runtime_schedule.log"))
    assert "dependency bubbles" in runtime.message
    crash = log1("crash.log")
    assert crash.tracebacks and not config_errors(crash)  # a data error is not the configuration's fault


def test_failure_table_owns_the_classes():
    """One table: the classes, their retry defaults and the evidence classify applies all come from it."""
    assert tuple(fc.name for fc in failures.TABLE) == FAILURE_CLASSES == failures.FAILURE_CLASSES
    assert len(set(FAILURE_CLASSES)) == len(FAILURE_CLASSES)
    assert set(failures.DETERMINISTIC) == {"OOM", "INVALID_CONFIG"}
    assert all(fc.retry is failures.Retry.NEVER for fc in failures.TABLE if fc.deterministic)
    assert set(failures.DEFAULT_RETRY_CLASSES) == {"NODE_FAIL", "PREEMPTED", "NCCL_TIMEOUT", "TIMEOUT", "LOST"}
    log_lists = set(vars(ParsedLog())) & {f for fc in failures.TABLE for f in fc.log}
    assert log_lists == {f for fc in failures.TABLE for f in fc.log}  # every cited record list exists


def epilogue(reason: str) -> ParsedLog:
    due = f" DUE TO {reason}" if reason else ""
    return parse_bytes(f"slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-11-29T11:00:00{due} ***\n".encode())


def test_classify_reads_its_evidence_from_the_table():
    for fc in failures.TABLE:
        for reason in fc.epilogue:  # slurmstepd's line alone: the table's class
            assert classify([epilogue(reason)]).failure_class == fc.name, reason
        for state in fc.sacct:  # a state alone, no log and no exit code: the table's class
            assert classify([], slurm_state=state).failure_class == fc.name, state
        if fc.exit_code:
            assert classify([], exit_code=3).failure_class == fc.name
    # Slurm's word beats the logs only where the table says so
    oom = log1("oom.log")
    for fc in failures.TABLE:
        for reason in fc.epilogue:
            got = classify([oom, epilogue(reason)], exit_code=1).failure_class
            assert got == (fc.name if fc.slurm_first else "OOM"), reason
    assert set(classify_mod.FROM_LOG) == {fc.name for fc in failures.TABLE if fc.log}
    # the log evidence is tried in the table's order: a log holding every kind yields the first class
    every = logs("crash.log", "nccl_dp.log", "oom.log", "validation_world.log")
    assert classify(every, exit_code=1).failure_class == next(fc.name for fc in failures.TABLE if fc.log)


@pytest.mark.parametrize("fc", failures.TABLE, ids=lambda fc: fc.name)
def test_retryable_follows_the_table(fc):
    retried = fc.retry is not failures.Retry.NEVER
    assert classify_mod.Classification(fc.name, "").retryable == retried
    assert JobResult(ok=False, simulated=True, failure_class=fc.name).retryable == retried
    assert not JobResult(ok=True, simulated=True).retryable


def test_apply_fills_job_result_and_normalize_state():
    res = classify(logs("nccl_ep.log"), exit_code=1).apply(JobResult(ok=True, simulated=False))
    assert (res.ok, res.failure_class, res.nccl_group, res.retryable) == (False, "NCCL_TIMEOUT", "EP", True)
    assert res.failure_detail.startswith("[E1129")
    assert normalize_state(" cancelled by 12 ") == "CANCELLED" and normalize_state(None) == ""


def test_failed_state_wins_over_exit_code_zero_with_iterations():
    """A wrapper that caught the task's exception exits 0; sacct/local state FAILED still means failed."""
    log = parse_bytes(
        b" [2026-11-29 12:13:53.801628] iteration        9/      15 | consumed samples:          576 |"
        b" elapsed time per iteration (ms): 26.9 | global batch size:    64 | lm loss: 9.24E+00 |"
        b" loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
        b"[rank0]:[E1129 12:13:53.801886000 ProcessGroupNCCL.cpp:632] [PG ID 7 PG GUID 7(EXPERT_MODEL_PARALLEL_GROUP)"
        b" Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1970, OpType=ALLTOALL_BASE,"
        b" NumelIn=4194304, NumelOut=4194304, Timeout(ms)=600000) ran for 600013 milliseconds before timing out.\n"
    )
    c = classify([log], slurm_state="FAILED", exit_code=0)
    assert (c.failure_class, c.nccl_group, c.retryable) == ("NCCL_TIMEOUT", "EP", True)
