"""The GPU's capacity as the evidence states it: torch's OOM message (both of its formats) and a sidecar's
device properties, read exactly (binary GiB -> decimal GB) into the JobResult and the ledger's attempt row."""

from __future__ import annotations

import json

import pytest

from orchestrator.core.paths import JobPaths
from orchestrator.evidence import metrics
from orchestrator.evidence.collect import collect
from orchestrator.evidence.loglines import size_bytes
from orchestrator.evidence.parse import parse_bytes
from orchestrator.job.twin import text

GIB96_GB = 96 * 2**30 / 1e9  # 103.079215104

# torch >= 2.1 (c10/cuda/CUDACachingAllocator.cpp) and the earlier wording, as jobs print them
NEW = (
    b"[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity "
    b"of 96.00 GiB of which 20.00 MiB is free. Including non-PyTorch memory, this process has 95.98 GiB memory in "
    b"use. Of the allocated memory 93.10 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but "
    b"unallocated.\n"
)
OLD = (
    b"RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 79.35 GiB total capacity; 77.12 GiB "
    b"already allocated; 19.38 MiB free; 78.80 GiB reserved in total by PyTorch)\n"
)


def test_size_text_is_read_in_binary_units():
    assert size_bytes("96.00 GiB") == 96 * 2**30
    assert size_bytes("20.00 MiB") == 20 * 2**20
    assert size_bytes("1.50 KiB") == 1.5 * 1024
    assert size_bytes("512 bytes") == 512
    assert size_bytes("96 GB") is None and size_bytes("lots") is None


@pytest.mark.parametrize(("line", "device", "stated"), [(NEW, 3, "96.00 GiB"), (OLD, 0, "79.35 GiB")])
def test_both_oom_formats_state_the_device_and_its_capacity(line, device, stated):
    (oom,) = parse_bytes(line).ooms
    assert (oom.kind, oom.device, oom.total_capacity) == ("cuda", device, stated)
    assert metrics.gpu_capacity([parse_bytes(line)]) == (size_bytes(stated) / 1e9, metrics.CAPACITY_FROM_OOM)


def test_an_oom_without_a_capacity_and_no_oom_state_nothing():
    assert metrics.gpu_capacity([parse_bytes(b"torch.OutOfMemoryError: CUDA out of memory.\n")]) == (None, "")
    assert metrics.gpu_capacity([parse_bytes(b"nothing here\n")], [{"rank": 0}]) == (None, "")


def test_the_smallest_statement_wins_across_ranks_and_sidecars():
    logs = [parse_bytes(NEW), parse_bytes(OLD)]
    assert metrics.gpu_capacity(logs) == (size_bytes("79.35 GiB") / 1e9, metrics.CAPACITY_FROM_OOM)
    sidecar = {"rank": 0, "gpu_total_memory_bytes": 80_000_000_000}
    assert metrics.gpu_capacity(logs, [sidecar]) == (80.0, metrics.CAPACITY_FROM_DEVICE)  # 79.35 GiB = 85.2 GB
    small = {"rank": 1, "gpu_total_memory_bytes": 50_000_000_000}
    assert metrics.gpu_capacity(logs, [sidecar, small]) == (50.0, metrics.CAPACITY_FROM_DEVICE)
    assert metrics.gpu_capacity([], [{"rank": 0, "gpu_total_memory_bytes": True}]) == (None, "")


def test_the_twins_oom_message_states_its_capacity_exactly():
    """The twin prints torch's text: its capacity (decimal GB) comes back at the message's precision."""
    line = text.oom_traceback("/opt/megatron-lm/pretrain_hybrid.py", 120.0, GIB96_GB, 5).encode() + b"\n"
    gb, source = metrics.gpu_capacity([parse_bytes(line)])
    assert "GPU 5 has a total capacity of 96.00 GiB" in line.decode()
    assert gb == pytest.approx(GIB96_GB, abs=1e-9) and source == metrics.CAPACITY_FROM_OOM


def test_collect_puts_an_ooms_capacity_on_the_result(tmp_path):
    paths = JobPaths(tmp_path)
    (tmp_path / JobPaths.RANK_ERR.format(rank=3)).write_bytes(NEW)
    res = collect(tmp_path, exit_code=1)
    assert res.failure_class == "OOM"
    assert res.gpu_capacity_gb == pytest.approx(GIB96_GB, abs=1e-9)
    assert res.gpu_capacity_source == metrics.CAPACITY_FROM_OOM
    saved = json.loads(paths.result.read_text())
    assert saved["gpu_capacity_gb"] == res.gpu_capacity_gb
