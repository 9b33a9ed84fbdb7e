"""How a twin job fails, the way the real one would: Megatron's assertion for an illegal layout, torch's
CUDA OOM when a stage's truth memory exceeds the GPU's capacity (truth.capacity_gb: TwinConfig.gpu_capacity_gb, else
HBM; or TwinConfig.force_oom), and the injected faults (an NCCL
watchdog timeout at TwinConfig.nccl_timeout_rate, a CUDA crash at crash_rate) at a seeded iteration after
the warm-up, the same on every rank of the attempt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from orchestrator.job.twin import text, truth
from orchestrator.job.twin.job import TwinJob, coords, job_rng, reported_ranks
from orchestrator.job.twin.legal import Illegal
from orchestrator.job.twin.truth import Surface
from orchestrator.plan import probe
from orchestrator.plan.layout import groups

NCCL_GROUPS = {  # Megatron's process-group descriptions, as torch's watchdog prints them
    "ep": "EXPERT_MODEL_PARALLEL_GROUP",
    "dp": "DATA_PARALLEL_GROUP",
    "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
    "cp": "CONTEXT_PARALLEL_GROUP",
}


# ------------------------------------------------------------------------------------------- assertion
def megatron_message(job: TwinJob, rule: Illegal) -> str:
    """The assertion text Megatron prints for the first violated rule (with the numbers), else the
    rule's own one-line reason and id."""
    lay, m, st = job.layout, job.model, job.stage
    g = groups(lay, job.world, st.global_batch)
    known = {
        "mcore.experts_div_ep": f"number of experts ({m.num_experts}) must be divisible by expert model "
        f"parallel size ({lay.ep})",
        "mcore.dense_grid": f"world size ({job.world}) is not divisible by total_model_size "
        f"({lay.tp * lay.pp * lay.cp})",
        "mcore.expert_grid": f"world size ({job.world}) is not divisible by expert_tensor_model_pipeline_parallel "
        f"size ({lay.etp * lay.ep * lay.pp})",
        "mcore.gbs_div_mbs_dp": f"global batch size ({st.global_batch}) is not divisible by micro batch size "
        f"({lay.mbs}) times data parallel size ({g.d_a})",
        "mcore.seq_div_2cp": f"seq-length ({st.seq_length}) should be divisible by 2 * context-parallel-size "
        f"({lay.cp})",
        "mcore.heads_div_tp": f"num_attention_heads ({m.num_attention_heads}) must be a multiple of "
        f"tensor_model_parallel_size ({lay.tp}).",
    }
    return known.get(rule.rule_id, f"{rule.reason} [{rule.rule_id}]")


def assertion(job: TwinJob, rule: Illegal) -> str:
    """What validate_args prints when Megatron refuses the layout."""
    return text.assertion_traceback(job.entry, megatron_message(job, rule))


# ------------------------------------------------------------------------------------------------- OOM
def oom_ranks(job: TwinJob, surface: Surface) -> list[int] | None:
    """None when every stage fits and no OOM is forced. Else the whole job dies in its first iteration and
    this is the list of ranks this process speaks for that print torch's OOM: those on an over-HBM stage
    (every rank when forced); it may be empty."""
    cap = truth.capacity_gb(job.hw, job.twin)
    over = [s for s in range(job.layout.pp) if surface.memory_gb(s) > cap]
    if not over and not job.twin.force_oom:
        return None
    return [r for r in reported_ranks(job) if job.twin.force_oom or coords(job, r)["pp"] in over]


def oom(job: TwinJob, surface: Surface, rank: int) -> str:
    """torch's OOM text for `rank`, asking for at least 1% more than the GPU holds, whose capacity it states."""
    want = surface.memory_gb(coords(job, rank)["pp"])
    cap = truth.capacity_gb(job.hw, job.twin)
    return text.oom_traceback(job.entry, max(want, cap * 1.01), cap, rank)


# --------------------------------------------------------------------------------------- injected faults
@dataclass(frozen=True)
class Injected:
    """The iterations an injected fault strikes at (None: never) and the group an NCCL timeout names."""

    nccl_at: int | None
    crash_at: int | None
    group: str

    @classmethod
    def draw(cls, job: TwinJob, start: int) -> Injected:
        """Seeded per attempt, so every rank agrees; strikes after the warm-up and after `start` (a restore)."""
        t = job.twin
        rng = job_rng(job, "faults")
        lo = min(job.train_iters, max(start + 1, job.warmup_iters + 1))
        nccl_at = rng.randint(lo, job.train_iters) if rng.random() < t.nccl_timeout_rate else None
        if job.probe:  # a fake process group runs no collective: nothing to time out
            nccl_at = None
        crash_at = rng.randint(lo, job.train_iters) if rng.random() < t.crash_rate else None
        return cls(nccl_at, crash_at, _nccl_group(job, rng))


def _nccl_group(job: TwinJob, rng: random.Random) -> str:
    lay = job.layout
    choices = [("ep", lay.ep > 1, 4), ("dp", True, 2), ("pp", lay.pp > 1, 1), ("cp", lay.cp > 1, 1)]
    pool = [name for name, ok, weight in choices if ok for _ in range(weight)]
    return NCCL_GROUPS[rng.choice(pool)]


def nccl_timeout(job: TwinJob, group: str, it: int) -> list[str]:
    """The watchdog line of every rank this process speaks for."""
    return [text.nccl_watchdog_line(r, group, seq=1000 + it * 97) for r in reported_ranks(job)]


def probe_crash(job: TwinJob) -> str | None:
    """dev's failure of a rank probe its job gave no probe mode where dev exchanges pipeline shapes
    (orchestrator/plan/probe.refusal): the traceback this rank prints, or None when the probe runs. Stage 0 fails
    on the gradient it receives back, every later stage on the activation it receives."""
    if probe.refusal(job.argv, job.probe_mode) is None:
        return None
    return text.probe_shape_traceback(job.entry, backward=coords(job, job.rank)["pp"] == 0)


def crash(job: TwinJob) -> str:
    return text.crash_traceback(job.entry)
