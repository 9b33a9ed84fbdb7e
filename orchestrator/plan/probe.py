"""The rank-probe contract: what a one-GPU rank probe (Megatron's --fake-process-group) needs from the job to run
as dev runs it, and what dev does without it. The one owner of that vocabulary: runspec turns the mode on for a
probe (`MODE_ENV`), the job wrapper installs it (orchestrator/job/probe_mode.py), the twin and every stand-in
refuse what dev refuses (`refusal`), and the schedule probes only what a probe can run (`unprobeable`).

Why a mode at all: under torch's `fake` backend no collective moves data. Two of dev's run-time paths then
compute on what no real rank sees (Megatron-LM dev d48bd6be0a85, the project's TESTED_COMMIT):
- Pipeline p2p: any packing scheduler makes TransformerConfig set `variable_seq_lengths`
  (megatron/core/transformer/transformer_config.py:3672-3688; `--use-varlen-dataset` picks `dp_balanced` when none
  is named, megatron/training/arguments.py:1766-1777), so every stage after the first first receives the tensor's
  shape into `torch.empty((3,), int64)` (megatron/core/pipeline_parallel/p2p_communication.py:205-216, called at
  :322-325), which the fake backend never writes: a shape of zeros or garbage, then `torch.empty` of it (:331).
- The alltoall token dispatcher's count exchange (megatron/core/transformer/moe/token_dispatcher.py:571-611) gathers
  copies of the rank's own routing, so its local experts receive EP copies of its own counts, not the layout's
  balanced k x T_group / E per expert.
The mode makes both what a rank of the real job would see: static shapes (the packed buffer's), finite receive
buffers, balanced expert counts. Stdlib only (the twin and the node both read it).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.plan.layout import Layout

MODE = "static-balanced/1"  # the mode orchestrator/job/probe_mode.py installs (bumped when what it changes does)
OFF = "none"  # no mode: the probe runs dev as it is (and crashes where dev crashes)
MODE_ENV = "ORCH_PROBE_MODE"  # set for a probe's job by runspec; read by the job wrapper and every stand-in
SKEW_ENV = "ORCH_PROBE_SKEW"  # the hot-rank factor a probe's local experts receive over balanced (1: balanced)
MODES = (MODE, OFF)

FAKE_FLAG = "--fake-process-group"  # dev megatron/training/arguments.py:4312
# The flags that make dev exchange pipeline shapes at run time (the packing schedulers; --use-varlen-dataset
# picks one when none is named): transformer_config.py:3672-3688, arguments.py:1766-1777.
SHAPE_EXCHANGE_FLAGS = ("--sequence-packing-scheduler", "--use-varlen-dataset", "--dynamic-context-parallel")

# What dev raises when a stage after the first allocates its receive buffer from the unwritten shape (the shape
# holds whatever the allocator left there, so the sizes differ run to run; zeros instead give an empty tensor that
# fails later): torch's message, raised in _communicate's create_tensor_recv_prev (p2p_communication.py:331;
# create_tensor_recv_next, :339, for the gradient a stage receives from the next).
DEV_ERROR = "RuntimeError: Storage size calculation overflowed with sizes"
DEV_WHERE = {"forward": (331, "create_tensor_recv_prev"), "backward": (339, "create_tensor_recv_next")}
DEV_CRASH = f"{DEV_ERROR}=[...] (megatron/core/pipeline_parallel/p2p_communication.py:331)"


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, tok in enumerate(argv):
        if tok == flag:
            return argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else ""
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
    return None


def is_probe(argv: Sequence[str]) -> bool:
    return FAKE_FLAG in argv


def exchanges_shapes(argv: Sequence[str]) -> bool:
    """Dev exchanges pipeline shapes at run time for this argv: PP > 1 and a packing scheduler is on."""
    pp = flag_value(argv, "--pipeline-model-parallel-size")
    return (
        pp is not None
        and pp.isdigit()
        and int(pp) > 1
        and any(flag_value(argv, f) is not None for f in SHAPE_EXCHANGE_FLAGS)
    )


def refusal(argv: Sequence[str], mode: str | None) -> str | None:
    """dev's run-time failure for a probe argv run with `mode` (None or OFF: no mode), or None when it runs."""
    if not is_probe(argv) or mode == MODE:
        return None
    if exchanges_shapes(argv):
        return DEV_CRASH
    return None


def unprobeable(layout: Layout) -> str | None:
    """Why no rank probe can run this layout as its N-GPU job does (None: one can).

    TP > 1: a rank other than TP rank 0 reads its packed batch's sizes (cu_seqlens, total tokens) from TP rank 0's
    broadcast (megatron/core/datasets/data_schedule.py:711-736 at dev d48bd6be0a85), which the fake backend never
    writes, and the last stage is probed on the last rank (TP rank TP-1), the one that prints Megatron's
    iteration lines. Such a layout is measured at scale instead."""
    if layout.tp > 1:
        return "TP>1: the probed last rank reads its batch sizes from TP rank 0's broadcast, never written"
    return None


def provenance(versions: dict[str, str] | None) -> tuple[str, str, str]:
    """What a probe's figures depend on beyond its layout: (torch, Megatron, probe mode) from its result's
    versions (the sidecars'): torch's fake backend and the mode decide what a probe computes, and Megatron's code
    what the mode changes. A probe is evidence only beside probes of the same provenance."""
    v = versions or {}
    megatron = v.get("megatron_commit") or v.get("megatron_core") or "?"
    return (str(v.get("torch") or "?"), str(megatron), str(v.get("probe_mode") or OFF))


def provenance_text(key: tuple[str, str, str]) -> str:
    torch, megatron, mode = key
    return f"torch {torch}, Megatron {megatron[:12]}, probe mode {mode}"


def mode_line(mode: str | None, detail: str = "") -> str:
    """The line a probe's job prints first: which mode it runs with (the job folder's own record of it)."""
    return f"[orchestrator] probe mode: {mode or OFF}" + (f" ({detail})" if detail else "")


def mode_env(mode: str, skew: float = 1.0) -> dict[str, str]:
    """The environment a probe's job gets for `mode` (OFF: none)."""
    if mode == OFF:
        return {}
    env = {MODE_ENV: mode}
    if skew != 1.0:
        env[SKEW_ENV] = repr(float(skew))
    return env
