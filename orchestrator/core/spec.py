"""JobSpec: everything a compute node needs to run and judge one attempt, as one JSON file.

Why a file and not only the pickled submitit argument: the workload itself (the twin, or an
instrumented Megatron) reads it through ORCH_JOB_SPEC, and `collect` re-reads it after the job is gone
(killed, requeued, or run by an older orchestrator). Stdlib only: it is loaded on compute nodes.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core.knobs import Layout
from orchestrator.core.paths import atomic_write
from orchestrator.core.schema import EffectiveConfig, HardwareConfig, ModelConfig, StageConfig, WorkloadConfig
from orchestrator.core.states import AttemptRole, Fidelity

# Which probed rank a one-GPU task of a rank probe runs (0-based into JobSpec.probe_ranks): set per task by a
# launcher that runs a probe's ranks as separate tasks (Slurm array tasks: orchestrator.launch LaunchTask.alone)
ALONE_INDEX_ENV = "ORCH_ALONE_INDEX"


@dataclass
class JobSpec:
    """One attempt of one candidate. `argv` is the candidate's Megatron flags only (no command).

    The attempt's own window (`warmup_iters`, `measure_iters`), its fidelity and its role are fields of their
    own: `stage` is the stage's config as given, never rewritten to carry a screen's or a finalist's window."""

    sweep: str
    candidate_key: str
    attempt: int
    layout: dict[str, Any]  # Layout.to_dict()
    model: ModelConfig
    stage: StageConfig
    hardware: HardwareConfig
    workload: WorkloadConfig
    env: dict[str, str] = field(default_factory=dict)  # cluster.env + workload.env
    argv: list[str] = field(default_factory=list)
    job_dir: str = ""
    master_port: int = 29500  # base: the job's port is master_port + job id % master_port_span (orchestrator.job.entry)
    master_port_span: int = 2000
    n_gpus: int = 1  # N, the job's world size
    gpus_per_node: int = 8
    model_flops_per_step: float = 0.0  # ours: activated experts, V4 attention, recompute excluded
    recompute_flops_per_step: float = 0.0
    predicted: dict[str, Any] = field(default_factory=dict)  # Prediction as a dict
    effective: EffectiveConfig = field(default_factory=EffectiveConfig)  # Q_effective inputs (collect)
    role: AttemptRole = AttemptRole.MEASURE  # what the job is for (states.AttemptRole)
    fidelity: Fidelity = Fidelity.FULL  # the rung a measure attempt runs at (states.Fidelity)
    # the window this attempt runs: iterations 1..warmup_iters warm up, the next measure_iters are measured
    # (absolute iteration numbers: a restored run's warm-up counts the iterations before its checkpoint).
    # None only in a job.json written before the window was the spec's own: the stage's window then.
    warmup_iters: int | None = None
    measure_iters: int | None = None
    # a one-GPU rank probe (fidelity probe): the ranks of the N-GPU job it runs, each alone on one GPU with
    # Megatron's --fake-process-group (orchestrator.plan.ranks.probe_ranks); empty for every other job
    probe_ranks: list[int] = field(default_factory=list)
    # What the ledger knew of this attempt as it launched (the sweep driver sets them, `Driver._launch`), so a
    # ledger lost under a running sweep can be rebuilt from the job folders (`ledger ingest`,
    # orchestrator/evidence/ingest.py): the attempt's launch token (its ledger `attempt.launch_token`; the job's
    # own start and exit markers name it too), its candidate's round and decision, and the sweep's stored config
    # snapshot (passwords masked, as in the ledger), and the key of the candidate the attempt is a row of (its
    # own `candidate_key`, but for a parity reference shared by several finalists: an attempt of the first of
    # them, sweep/finalists). Empty in a spec written by `run-one` or before they existed.
    launch_token: str = ""
    owner_key: str = ""
    round: int | None = None
    decision: dict[str, Any] | None = None
    sweep_config: str = ""

    @property
    def launch_gpus(self) -> int:
        """GPUs the launch holds (orchestrator.core.cost.launch_gpus): N, or one per probed rank."""
        from orchestrator.core.cost import launch_gpus

        return launch_gpus(self.n_gpus, len(self.probe_ranks))

    @property
    def knobs(self) -> Layout:
        """The layout the job runs, decoded from job.json's `layout` once, here (the job side's one boundary)."""
        return Layout.from_dict(self.layout)

    @property
    def window(self) -> tuple[int, int]:
        """(warm-up, measured iterations) of this attempt: what the job, the twin and `collect` read."""
        w = self.stage.warmup_iters if self.warmup_iters is None else self.warmup_iters
        n = self.stage.measure_iters if self.measure_iters is None else self.measure_iters
        return int(w), int(n)

    @property
    def command(self) -> list[str]:
        """The full command line: workload.command + candidate flags + workload.extra_args."""
        return list(self.workload.command) + list(self.argv) + list(self.workload.extra_args)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> JobSpec:
        return _build(cls, data)

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically: a reader never sees half a spec (every rank may save at once).
        The job folder's spec file is `orchestrator.core.paths.JobPaths(folder).spec`."""
        return atomic_write(path, json.dumps(self.to_dict(), indent=2, sort_keys=True))

    @classmethod
    def load(cls, path: str | os.PathLike) -> JobSpec:
        return cls.from_dict(json.loads(Path(path).read_text()))


def _build(cls: type[Any], data: Any) -> Any:
    """Rebuild a (nested) dataclass from asdict() output; unknown keys are ignored so an older
    spec still loads after a field was added."""
    if not dataclasses.is_dataclass(cls) or not isinstance(data, dict):
        return data
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        kwargs[f.name] = _coerce(hints.get(f.name), data[f.name])
    return cls(**kwargs)


def _coerce(tp: Any, value: Any) -> Any:
    if value is None or tp is None:
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    origin = typing.get_origin(tp)
    if origin is typing.Union:  # Optional[X]
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _coerce(inner[0], value) if len(inner) == 1 else value
    return value
