"""The job the twin pretends to be: Megatron's flags and the job spec -> TwinJob; who speaks for which rank.

Flags come first (what Megatron would see), then ORCH_JOB_SPEC for hardware, twin knobs and the key;
without a spec the model comes from the flags and the hardware is the default.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

from orchestrator.core.schema import HardwareConfig, ModelConfig, StageConfig, TwinConfig
from orchestrator.job.twin import truth
from orchestrator.job.twin.text import MEGATRON
from orchestrator.plan import argv as plan_argv
from orchestrator.plan import pipeline, ranks
from orchestrator.plan import probe as plan_probe
from orchestrator.plan.layout import Layout


@dataclass
class TwinJob:
    """Everything the twin knows about the job it pretends to be."""

    flags: dict[str, object]
    layout: Layout
    model: ModelConfig
    stage: StageConfig
    hw: HardwareConfig
    twin: TwinConfig
    rank: int
    world: int
    single_process: bool
    job_dir: Path | None
    key: str
    attempt: int
    train_iters: int
    log_interval: int
    warmup_iters: int = 0  # the attempt's warm-up (JobSpec.window): iterations after it are its measured window
    model_flops: float = 0.0  # per step; 0 = take the truth's
    entry: str = f"{MEGATRON}/pretrain_hybrid.py"
    argv: tuple[str, ...] = ()  # the flags as given (Megatron's argv-phase assertions read them)
    pattern: str = ""  # --hybrid-layer-pattern: which blocks each pipeline segment runs
    probe: bool = False  # --fake-process-group: this process is rank RANK of WORLD_SIZE alone on one GPU
    probe_mode: str | None = None  # the probe mode the job asked for (orchestrator/plan/probe.py MODE_ENV)

    def case(self) -> truth.Case:
        """The job as the simulated machine sees it (stage.gpus is the world size)."""
        return truth.Case(self.model, self.hw, self.stage, self.twin, self.layout, self.pattern)

    def surface(self) -> truth.Surface:
        """The truth of this job; a rank probe sees only its own rank's (truth.rank_probe)."""
        s = truth.evaluate(self.case())
        return truth.rank_probe(s, coords(self, self.rank)["pp"]) if self.probe else s


def flag(flags: dict[str, object], name: str, default=None):
    """A parsed flag by argparse dest (`moe_router_topk`); absent or None -> default."""
    value = flags.get(name)
    return default if value is None else value


def _from_flags(cls, base, flags: dict[str, object]):
    """Override dataclass fields whose Megatron flag is present (`--num-experts` -> num_experts)."""
    updates = {}
    for f in fields(cls):
        v = flag(flags, f.name)
        cur = getattr(base, f.name)
        if v is None or isinstance(cur, (list, dict)) or (cur is not None and not isinstance(cur, (int, float, str))):
            continue
        try:
            updates[f.name] = type(cur)(v) if cur is not None and not isinstance(cur, bool) else v
        except (TypeError, ValueError):
            continue
    return replace(base, **updates)


def _model_from_flags(flags: dict[str, object]) -> ModelConfig:
    """Without a spec: the model from the flags. --num-layers is the pattern's symbol count (2 per block),
    so the block count comes from the hybrid pattern; --moe-n-hash-layers is a layer number there, so the
    hash-routed MoE blocks are the MoE symbols up to it."""
    model = _from_flags(ModelConfig, ModelConfig(), flags)
    pattern = flag(flags, "hybrid_layer_pattern")
    if pattern:
        hashed = pipeline.moe_layers_through(str(pattern), int(flag(flags, "moe_n_hash_layers", 0) or 0))
        model = replace(model, num_layers=sum(pipeline.count_blocks(str(pattern))), moe_n_hash_layers=hashed)
    return model


def load_job(argv: Sequence[str], environ=os.environ) -> TwinJob:
    """Flags first (what Megatron would see), then ORCH_JOB_SPEC for hardware, twin knobs and the key."""
    flags = plan_argv.parse_flags(list(argv))
    layout = plan_argv.layout_from_argv(list(argv))
    spec = None
    spec_path = environ.get("ORCH_JOB_SPEC")
    if spec_path and Path(spec_path).exists():
        from orchestrator.core.spec import JobSpec

        spec = JobSpec.load(spec_path)
    model = spec.model if spec else _model_from_flags(flags)
    stage = spec.stage if spec else StageConfig()
    hw = spec.hardware if spec else HardwareConfig()
    twin = spec.workload.twin if spec else TwinConfig()
    world = int(environ.get("WORLD_SIZE") or (spec.n_gpus if spec else stage.gpus))
    gbs = flag(flags, "global_batch_size")
    seq = flag(flags, "seq_length")
    stage = replace(
        stage,
        gpus=world,
        global_batch=int(gbs) if gbs else stage.global_batch,
        seq_length=int(seq) if seq else stage.seq_length,
    )
    warmup, measure = spec.window if spec else (stage.warmup_iters, stage.measure_iters)
    rank = int(environ.get("RANK", world - 1))
    key = spec.candidate_key if spec else hashlib.sha256(" ".join(argv).encode()).hexdigest()[:16]
    job_dir = environ.get("ORCH_JOB_DIR") or (spec.job_dir if spec else None)
    return TwinJob(
        flags=flags,
        layout=layout,
        model=model,
        stage=stage,
        hw=hw,
        twin=twin,
        rank=rank,
        world=world,
        single_process=environ.get("ORCH_SINGLE_PROCESS") == "1",
        job_dir=Path(job_dir) if job_dir else None,
        key=key,
        attempt=spec.attempt if spec else 0,
        train_iters=int(flag(flags, "train_iters") or warmup + measure),
        log_interval=max(1, int(flag(flags, "log_interval") or 1)),
        warmup_iters=warmup,
        model_flops=spec.model_flops_per_step if spec else 0.0,
        argv=tuple(argv),
        pattern=str(flag(flags, "hybrid_layer_pattern", "") or ""),
        probe=bool(flag(flags, "fake_process_group", False)),
        probe_mode=environ.get(plan_probe.MODE_ENV) or None,
    )


# ------------------------------------------------------------------------------------------- randomness
def seeded(seed: int, key: str, attempt: int, *salt) -> random.Random:
    blob = json.dumps([seed, key, attempt, *salt])
    return random.Random(int(hashlib.sha256(blob.encode()).hexdigest()[:16], 16))


def rng_for(job: TwinJob, *salt) -> random.Random:
    return seeded(job.twin.seed, job.key, job.attempt, *salt)


def steps_rng(seed: int, key: str, attempt: int, start: int = 0) -> random.Random:
    """The step-time draws of one attempt, the same on every rank (a run restored at `start` draws anew).
    By (seed, key, attempt) so an in-process evaluation (tests/bench) draws what the job prints."""
    return seeded(seed, key, attempt, "job", "steps", *((start,) if start else ()))


def job_rng(job: TwinJob, *salt) -> random.Random:
    """Same for every rank of an attempt: faults and step times must agree across ranks."""
    return rng_for(job, "job", *salt)


# ------------------------------------------------------------------------------------- rank topology
def coords(job: TwinJob, rank: int) -> dict[str, int]:
    """The dense-grid coordinates of a rank (tp, cp, dp, pp) in Megatron's rank order."""
    return ranks.coords(job.layout, job.world, rank)


def dp0_ranks(job: TwinJob) -> list[int]:
    """Ranks with DP-rank 0: one per TP x CP x PP position (they print Megatron's memory lines)."""
    return [r for r in range(job.world) if coords(job, r)["dp"] == 0]


def reported_ranks(job: TwinJob) -> list[int]:
    """The ranks this process speaks for: itself (a rank probe always), or every DP-rank-0 rank in
    single-process mode."""
    return dp0_ranks(job) if job.single_process and not job.probe else [job.rank]


def speaks_rank0(job: TwinJob) -> bool:
    """Rank 0's lines (checkpoint messages) come from rank 0, or from the one process of a local job."""
    return job.rank == 0 or job.single_process


def is_last_rank(job: TwinJob) -> bool:
    """The last global rank prints Megatron's iteration lines and the timers (log level 0 and 1)."""
    return job.rank == job.world - 1
