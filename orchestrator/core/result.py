"""The structured evidence one job yields: what the ledger stores and the policy decides on.

Stdlib-only: built on the compute node (or by the orchestrator from the job folder) and sent back
as JSON. Field names follow the guide's closing table of evidence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.core.failures import FAILURE_CLASSES, retried_by_default

SIMULATED_MARKER = "[SIMULATED]"  # a simulated job's note lines start with it (any such line: ParsedLog.simulated)

__all__ = ["FAILURE_CLASSES", "JobResult", "RankMemory"]  # the classes themselves: orchestrator.core.failures


@dataclass
class RankMemory:
    rank: int
    pp_stage: int | None
    allocated_mb: float | None  # max allocated
    reserved_mb: float | None  # max reserved
    source: str = "log"  # log | sidecar


@dataclass
class JobResult:
    """One attempt's outcome. `ok` with `partial` means fewer measured iterations than asked."""

    ok: bool
    simulated: bool
    failure_class: str | None = None  # one of FAILURE_CLASSES (orchestrator.core.failures), None = no failure
    failure_detail: str = ""  # the evidence line (first matching signature)
    nccl_group: str | None = None
    exit_code: int | None = None
    slurm_state: str | None = None
    # Windows
    warmup_iters: int = 0
    measure_iters_requested: int = 0
    measure_iters: int = 0  # actually measured
    partial: bool = False
    settled_iters: int | None = None  # leading iterations above the steady step (evidence/metrics.settled_iters)
    # Step time over the measurement window (seconds)
    step_times_s: list[float] = field(default_factory=list)
    step_p50_s: float | None = None
    step_p95_s: float | None = None
    step_p99_s: float | None = None
    step_mean_s: float | None = None
    step_max_s: float | None = None
    # Throughput
    tokens_per_s: float | None = None  # GBS x seq / step p50
    tokens_per_s_per_gpu: float | None = None
    tflops_per_gpu: float | None = None  # ours: model FLOPs (activated experts, V4 attention)
    mfu: float | None = None  # ours / hardware peak (precision named in mfu_peak)
    mfu_peak: str = ""  # e.g. "bf16 dense 989 TFLOP/s"
    megatron_tflops_per_gpu: float | None = None  # Megatron's own field, kept beside ours
    recompute_tflops_per_gpu: float | None = None
    # Memory: the heaviest rank
    heaviest_rank: int | None = None
    heaviest_pp_stage: int | None = None
    peak_allocated_gb: float | None = None
    peak_reserved_gb: float | None = None
    rank_memory: list[RankMemory] = field(default_factory=list)
    # What the GPU holds, as the job's own evidence states it (an OOM message, torch's device properties): decimal
    # GB, the unit of hardware.hbm_gb, which it overrides for the rest of the sweep (orchestrator.sweep.capacity)
    gpu_capacity_gb: float | None = None
    gpu_capacity_source: str = ""  # "OOM message" | "device properties" (orchestrator.evidence.metrics)
    # Slowest rank / stage (timers min/max, straggler lines)
    slowest_rank: int | None = None
    slowest_stage: int | None = None
    timers_ms: dict[str, list[float | None]] = field(default_factory=dict)  # name -> [min, max]; min None: max-only
    # MoE evidence (sidecar / router hook; orchestrator/evidence/metrics.py says how each is derived)
    token_drop_fraction: float | None = None  # None: not measured (token_drop_note says why) or no sidecar
    token_drop_note: str | None = None
    padding_fraction: float | None = None
    expert_load_p50: float | None = None  # tokens per expert, percentiles across experts
    expert_load_p95: float | None = None
    expert_load_p99: float | None = None
    hot_expert_ratio: float | None = None  # the hottest expert of one layer over that layer's mean
    hot_expert: str | None = None  # "layer L expert e"
    hot_rank_tokens_p50: float | None = None  # tokens the hottest EP rank receives per dispatch, over dispatches
    hot_rank_tokens_p95: float | None = None
    hot_rank_tokens_p99: float | None = None
    hot_rank_share_p50: float | None = None  # its share of the dispatch (1/EP when balanced)
    hot_rank_share_p95: float | None = None
    hot_rank_share_p99: float | None = None
    force_balanced_routing: bool = False
    # Training quality (for parity checks)
    lm_loss: list[float] = field(default_factory=list)  # per measured iteration
    grad_norm: list[float] = field(default_factory=list)
    # Long-run window (effective throughput)
    ckpt_save_s: float | None = None
    ckpt_restore_s: float | None = None
    tokens_per_s_after_restart: float | None = None  # steady throughput after restoring the checkpoint
    effective_fraction: float | None = None  # orchestrator.evidence.effective: advancing share of wall time
    q_effective: float | None = None  # tokens/s that advanced and were not rolled back
    # Provenance
    log_paths: list[str] = field(default_factory=list)
    sidecar_paths: list[str] = field(default_factory=list)
    # What the ranks ran with (orchestrator.job.node, from the sidecars): torch, CUDA, NCCL, Transformer Engine,
    # DeepEP, megatron_core, megatron_commit, container_image / container_digest; "simulated" on the twin
    versions: dict[str, str] = field(default_factory=dict)
    run_env: dict[str, str] = field(default_factory=dict)  # NCCL_* / NVTE_* / ... as the ranks saw them

    @property
    def retryable(self) -> bool:
        """Whether the default retry policy resubmits this failure (orchestrator.core.failures; the sweep's own
        decision, with the config and the attempt history, is orchestrator.sweep.retry.retry_decision)."""
        return retried_by_default(self.failure_class)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobResult:
        d = dict(d)
        d["rank_memory"] = [RankMemory(**r) for r in d.get("rank_memory", [])]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})
