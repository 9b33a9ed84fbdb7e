"""Megatron's and torch's exact lines, as the twin prints them (orchestrator.evidence.parse reads them like a real
job's).

Pure formatting: numbers in, text out. The line numbers and paths in the tracebacks are where the real
entry script and Megatron raise (MEGATRON is where the container keeps the checkout).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from orchestrator.plan import probe

MEGATRON = "/opt/megatron-lm"  # the paths the tracebacks name: where the real entry script lives
MIB = 1024 * 1024


def out(line: str) -> None:
    print(line, flush=True)


def err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def stamp() -> str:
    return datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")


def event_line(name: str) -> str:
    """`[after megatron is initialized] datetime: 2026-11-29 12:00:00 ` (training.py's print_datetime)."""
    return f"[{name}] datetime: {stamp()[:-7]} "


def iteration_line(
    it: int,
    train_iters: int,
    consumed: int,
    elapsed_ms: float,
    tflops: float,
    lr: float,
    gbs: int,
    losses: Sequence[tuple[str, float]],
    grad_norm: float,
) -> str:
    """Megatron's training_log line (TR:3539-3656) with --log-throughput, bf16 (loss scale 1.0)."""
    s = f" [{stamp()}] iteration {it:8d}/{train_iters:8d} | consumed samples: {consumed:12d} |"
    s += f" elapsed time per iteration (ms): {elapsed_ms:.1f} | throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    s += f" learning rate: {lr:.6E} | global batch size: {gbs:5d} |"
    for k, v in losses:
        s += f" {k}: {v:.6E} |"
    s += f" loss scale: {1.0:.1f} | grad norm: {grad_norm:.3f} |"
    s += f" number of skipped iterations: {0:3d} | number of nan iterations: {0:3d} |"
    return s


def memory_line(rank: int, it: int, alloc: float, max_alloc: float, reserved: float, max_reserved: float) -> str:
    return (
        f"[Rank {rank}] (after {it} iterations) memory (MB) | allocated: {alloc:.2f} | max allocated: "
        f"{max_alloc:.2f} | reserved: {reserved:.2f} | max reserved: {max_reserved:.2f}"
    )


def timers_block(rows: Sequence[tuple[str, float, float]]) -> str:
    """core/timers.py minmax format, as logger.info prints it with Python's default formatter."""
    lines = ["INFO:megatron.core.timers:(min, max) time across ranks (ms):"]
    for name, lo, hi in rows:
        lines.append("    " + (name + " ").ljust(48, ".") + f": ({lo:.2f}, {hi:.2f})")
    return "\n".join(lines)


def format_size(nbytes: float) -> str:
    """c10's format_size: bytes, KiB, MiB or GiB with two decimals."""
    if nbytes <= 1024:
        return f"{int(nbytes)} bytes"
    for unit, scale in (("KiB", 1024), ("MiB", MIB), ("GiB", 1024**3)):
        if nbytes <= scale * 1024 or unit == "GiB":
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.2f}"


# ------------------------------------------------------------------------------------------ tracebacks
def _frames(*frames: tuple[str, int, str, str]) -> str:
    out = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        out.append(f'  File "{path}", line {line}, in {func}')
        out.append(f"    {code}")
    return "\n".join(out)


def assertion_traceback(entry: str, reason: str) -> str:
    head = _frames(
        (entry, 220, "<module>", "pretrain("),
        (f"{MEGATRON}/megatron/training/training.py", 668, "pretrain", "initialize_megatron("),
        (
            f"{MEGATRON}/megatron/training/initialize.py",
            92,
            "initialize_megatron",
            "validate_args(args, args_defaults)",
        ),
        (f"{MEGATRON}/megatron/training/arguments.py", 446, "validate_args", "assert cond, ("),
    )
    return f"{head}\nAssertionError: {reason}"


def oom_traceback(entry: str, want_gb: float, capacity_gb: float, rank: int) -> str:
    """torch's CUDACachingAllocator message, raised from the backward pass of the first iteration. It states the
    device's total memory (`capacity_gb`, decimal GB) in c10's binary units, as torch does."""
    total = capacity_gb * 1e9  # cudaMemGetInfo's total: what the message calls the total capacity
    in_use = total - 0.02 * 1e9
    allocated = min(in_use * 0.96, want_gb * 1e9)
    ask = max(64 * MIB, (want_gb - capacity_gb) * 1e9 + 256 * MIB)
    head = _frames(
        (entry, 220, "<module>", "pretrain("),
        (
            f"{MEGATRON}/megatron/training/training.py",
            752,
            "pretrain",
            "iteration, num_floating_point_operations_so_far = train(",
        ),
        (f"{MEGATRON}/megatron/training/training.py", 2310, "train", "train_step(forward_step_func,"),
        (
            f"{MEGATRON}/megatron/core/pipeline_parallel/schedules.py",
            469,
            "backward_step",
            "custom_backward(output_tensor[0], output_tensor_grad[0])",
        ),
        (
            "/usr/local/lib/python3.12/dist-packages/torch/autograd/graph.py",
            829,
            "_engine_run_backward",
            "return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass",
        ),
    )
    msg = (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {format_size(ask)}. GPU {rank % 8} "
        f"has a total capacity of {format_size(total)} of which {format_size(total - in_use)} is free. "
        f"Including non-PyTorch memory, this process has {format_size(in_use)} memory in use. Of the allocated "
        f"memory {format_size(allocated)} is allocated by PyTorch, and {format_size(in_use - allocated)} is "
        "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
        "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
    return f"{head}\n{msg}"


def nccl_watchdog_line(rank: int, group: str, seq: int, op: str = "ALLTOALL_BASE", timeout_ms: int = 600000) -> str:
    now = datetime.now()
    ts = now.strftime("%m%d %H:%M:%S.") + f"{now.microsecond:06d}000"
    pg = {
        "EXPERT_MODEL_PARALLEL_GROUP": 7,
        "DATA_PARALLEL_GROUP": 3,
        "PIPELINE_MODEL_PARALLEL_GROUP": 5,
        "CONTEXT_PARALLEL_GROUP": 4,
    }.get(group, 1)
    return (
        f"[rank{rank}]:[E{ts} ProcessGroupNCCL.cpp:632] [PG ID {pg} PG GUID {pg}({group}) Rank {rank}] "
        f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=4194304, "
        f"NumelOut=4194304, Timeout(ms)={timeout_ms}) ran for {timeout_ms + 13} milliseconds before timing out."
    )


def probe_shape_traceback(entry: str, backward: bool) -> str:
    """dev's failure on a --fake-process-group stage after the first (forward) or before the last (backward) when
    the pipeline exchanges shapes and no probe mode answers them (orchestrator/plan/probe.py): the receive buffer
    is allocated from a shape the fake backend never wrote (megatron/core/pipeline_parallel/p2p_communication.py,
    dev d48bd6be0a85)."""
    line, make = probe.DEV_WHERE["backward" if backward else "forward"]
    p2p = f"{MEGATRON}/megatron/core/pipeline_parallel/p2p_communication.py"
    recv = (
        (p2p, 476 + 16, "recv_backward", "_, output_tensor_grad, _ = self._communicate(")
        if backward
        else (p2p, 445 + 16, "recv_forward", "input_tensor, _, _ = self._communicate(")
    )
    head = _frames(
        (entry, 220, "<module>", "pretrain("),
        (
            f"{MEGATRON}/megatron/training/training.py",
            1812,
            "pretrain",
            "iteration, num_floating_point_operations_so_far = train(",
        ),
        (f"{MEGATRON}/megatron/training/training.py", 4400, "train", ") = train_step("),
        (f"{MEGATRON}/megatron/training/training.py", 2920, "train_step", "losses_reduced = forward_backward_func("),
        (
            f"{MEGATRON}/megatron/core/pipeline_parallel/schedules.py",
            2488,
            "forward_backward_pipelining_without_interleaving",
            "input_tensor = p2p_communicator.recv_forward(",
        ),
        recv,
        (
            p2p,
            395 if backward else 392,
            "_communicate",
            "tensor_recv_next = tensor_recv_next_func()" if backward else "tensor_recv_prev = tensor_recv_prev_func()",
        ),
        (p2p, line, make, "return torch.empty("),
    )
    return f"{head}\n{probe.DEV_ERROR}=[139934698196304, 139934698234576, 139934698188752]"


def crash_traceback(entry: str) -> str:
    head = _frames(
        (entry, 220, "<module>", "pretrain("),
        (
            f"{MEGATRON}/megatron/training/training.py",
            752,
            "pretrain",
            "iteration, num_floating_point_operations_so_far = train(",
        ),
        (
            f"{MEGATRON}/megatron/core/transformer/moe/token_dispatcher.py",
            1012,
            "token_permutation",
            "global_input_tokens = all_to_all(",
        ),
    )
    return (
        f"{head}\nRuntimeError: CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
        "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
    )


# ----------------------------------------------------------------------------------------- checkpoints
def saving_line(it: int, save: Path) -> str:
    return f"[{stamp()}] saving checkpoint at iteration {it:7d} to {save} in torch_dist format"


def saved_line(it: int, save: Path, tp: int, pp: int) -> str:
    """Rank 0's own coordinates in the brackets."""
    return (
        f"  [{stamp()}] successfully saved checkpoint from iteration {it:7d} to {save} "
        f"[ t 1/{tp}, gtp_remat 1/1, p 1/{pp} ]"
    )


def missing_tracker_lines(tracker: Path) -> list[str]:
    return [
        f"WARNING: could not find the metadata file {tracker}",
        "    will not load any checkpoints and will start from random",
    ]


EXIT_ON_MISSING = ">> '--exit-on-missing-checkpoint' set ... exiting. <<"


def loading_line(load: Path, it: int) -> str:
    return f" loading distributed checkpoint from {load} at iteration {it}"


def loaded_line(load: Path, it: int, tp: int, pp: int) -> str:
    return f"  successfully loaded checkpoint from {load} [ t 1/{tp}, gtp_remat 1/1, p 1/{pp} ] at iteration {it}"


def load_not_found_traceback(entry: str, missing: Path) -> str:
    """The load raises FileNotFoundError when the tracker names an iteration whose files are gone."""
    return (
        _frames(
            (entry, 220, "<module>", "pretrain("),
            (
                f"{MEGATRON}/megatron/training/training.py",
                2199,
                "setup_model_and_optimizer",
                "args.iteration, args.num_floating_point_operations_so_far = load_checkpoint(",
            ),
            (
                f"{MEGATRON}/megatron/training/checkpointing.py",
                1734,
                "_load_base_checkpoint",
                "return _load_global_dist_base_checkpoint(",
            ),
        )
        + f"\nFileNotFoundError: [Errno 2] No such file or directory: '{missing}'"
    )
