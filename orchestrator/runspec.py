"""Planned candidate -> JobSpec (what a compute node runs) -> LaunchTask (`launch_task`, the one assembly), and
its Slurm time limit.

Why separate from the launcher: the spec is the contract between the orchestrator and the job
(`orchestrator/core/spec.py`); building it needs the planner's argv and FLOP models, the launcher only needs
the result. Pure apart from reading the config: no submitit, no files (the caller saves the spec).

Besides the measurement job: a parity job (warm-up 0, `parity.steps` measured, same seed) and the
long-run pair (`long_run_save_spec`, `long_run_restore_spec`): a job that saves a checkpoint at iteration X
and exits (Megatron's --save / --save-interval / --exit-interval), then one that restores it (--load) and
trains on. Both keep the same --train-iters, so the learning-rate schedule of the restored run is the one
saved. Every one of them is an attempt with its role (states.AttemptRole) and its own window in the spec.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Sequence
from pathlib import Path

from orchestrator.core.decision import Decision
from orchestrator.core.errors import UserError
from orchestrator.core.paths import JobPaths
from orchestrator.core.schema import ClusterConfig, RootConfig
from orchestrator.core.spec import JobSpec
from orchestrator.core.states import AttemptRole, Fidelity
from orchestrator.job.entry import command_problem, entry_script, run_task
from orchestrator.job.node import CONTAINER_ENV
from orchestrator.launch import LaunchTask
from orchestrator.plan import argv as plan_argv
from orchestrator.plan import flops as plan_flops
from orchestrator.plan import probe as plan_probe
from orchestrator.plan.layout import Layout
from orchestrator.plan.planner import Planned

TIME_SAFETY = 2.0  # the measured step may be this much slower than predicted before Slurm cuts a good run
# Megatron's default when the argv has no --distributed-timeout-minutes
# (megatron/training/config/common_config.py:80 at dev d48bd6be0a85; :77 in megatron-core 0.19.2).
DEFAULT_DISTRIBUTED_TIMEOUT_MIN = 10


def attempt_dir(
    cfg: RootConfig, sweep: str, candidate_key: str, attempt: int, *, number: int | None = None, layout=None
) -> Path:
    """`<cluster.folder>/<sweep>/c<number>-<layout label>-<key>/attempt-<n>/` (the key alone without a number;
    orchestrator.core.paths.JobPaths names the folder and its files)."""
    label = layout.short() if layout is not None else ""
    return JobPaths.of_attempt(cfg.cluster.folder, sweep, candidate_key, attempt, number=number, label=label).folder


def check_workload(cfg: RootConfig) -> None:
    """UserError when workload.command cannot start (orchestrator.job.entry.command_problem), before anything is
    written. A real in-process workload on cluster=local runs on this host: preflight-lite
    (orchestrator.job.preflight.lite) refuses it when the Megatron checkout or a module it needs is missing.
    Jobs that run in a container (cluster.slurm.container.image) find the command in the image, and a real
    in-process workload's entry script lives in the Megatron checkout of the compute nodes, which the
    sweep's preflight job checks there (orchestrator/preflight.py): only an empty command is refused."""
    command = list(cfg.workload.command)
    real = cfg.workload.in_process and not cfg.workload.simulated
    if command and real and cfg.cluster.kind == "local":  # the job runs here: preflight-lite, before any job
        from orchestrator.job import preflight

        missing = preflight.lite(entry_script(command))
        if missing:
            raise UserError(
                f"workload={cfg.workload.name} cannot run on this host (cluster=local): {'; '.join(missing)}. Fix: "
                "clone Megatron-LM's dev branch (git clone -b dev https://github.com/NVIDIA/Megatron-LM) and point "
                "workload.command=[python,<checkout>/pretrain_hybrid.py] at it, in a Python with torch and "
                "Transformer Engine; or run on Slurm (cluster=slurm), where preflight checks the nodes"
            )
        return
    if command and (cfg.cluster.slurm.container.image or real):
        return
    problem = command_problem(command, in_process=cfg.workload.in_process)
    if problem is not None:
        raise UserError(problem)


def build_spec(
    cfg: RootConfig,
    planned: Planned,
    *,
    sweep: str,
    attempt: int,
    job_dir: Path | str | None = None,
    window: tuple[int, int] | None = None,
    train_iters: int | None = None,
    extra_argv: Sequence[str] = (),
    role: AttemptRole = AttemptRole.MEASURE,
    fidelity: Fidelity = Fidelity.FULL,
    probe_ranks: Sequence[int] = (),
) -> JobSpec:
    """The JobSpec for one attempt: Megatron flags for warmup + measure iterations, env, FLOPs.

    `window` = (warmup, measure), the stage's by default, goes into the spec's own fields (absolute iteration
    numbers: a restored run's warm-up counts the iterations before the checkpoint), with the attempt's
    `fidelity` and `role`; the stage stays the stage. `train_iters` overrides warmup + measure; `extra_argv`
    is appended to the candidate's flags (argparse: a later flag wins). `probe_ranks` makes it a one-GPU rank
    probe: the flags get `--fake-process-group` (plan_argv.probe_argv) and each listed rank of the N-GPU job
    runs alone on one GPU (orchestrator.job.entry sets its RANK, WORLD_SIZE = N)."""
    stage = cfg.stage
    if stage is None:
        raise ValueError("build_spec needs a stage")
    warmup, measure = (stage.warmup_iters, stage.measure_iters) if window is None else (int(window[0]), int(window[1]))
    layout = planned.layout
    pred = planned.prediction
    train_iters = int(train_iters) if train_iters is not None else warmup + measure
    argv = plan_argv.megatron_argv(
        cfg.model,
        stage,
        layout,
        layer_pattern=pred.layer_pattern,
        train_iters=train_iters,
        mock_data=cfg.workload.mock_data,
        recipe=cfg.workload.recipe,
        extra=[str(a) for a in extra_argv],
    )
    if probe_ranks:
        argv = plan_argv.probe_argv(argv)
    fl = plan_flops.step_flops(cfg.model, stage, layout)
    env = {**{k: str(v) for k, v in cfg.cluster.env.items()}, **{k: str(v) for k, v in cfg.workload.env.items()}}
    env.update(plan_argv.megatron_env(layout))  # what this layout's Megatron asserts (NVTE_CPU_OFFLOAD_V1)
    if probe_ranks:  # the run-time mode a probe needs to run as dev runs its rank (orchestrator/plan/probe.py)
        env.update(plan_probe.mode_env(cfg.workload.probe_mode, cfg.workload.probe_skew))
    if cfg.cluster.slurm.container.image:  # the task records the image it ran in (orchestrator.job.node)
        env[CONTAINER_ENV] = str(cfg.cluster.slurm.container.image)
    folder = Path(job_dir) if job_dir is not None else attempt_dir(cfg, sweep, planned.key, attempt)
    return JobSpec(
        sweep=sweep,
        candidate_key=planned.key,
        attempt=attempt,
        layout=layout.to_dict(),
        model=cfg.model,
        stage=stage,
        hardware=cfg.hardware,
        workload=cfg.workload,
        env=env,
        argv=[str(a) for a in argv],
        job_dir=str(folder),
        master_port=cfg.cluster.master_port,
        master_port_span=cfg.cluster.master_port_span,
        n_gpus=stage.gpus,
        gpus_per_node=stage.gpus_per_node,
        model_flops_per_step=float(fl.model_flops),
        recompute_flops_per_step=float(fl.recompute_flops),
        predicted=_prediction_dict(pred),
        effective=cfg.effective,
        role=AttemptRole(role),
        fidelity=Fidelity(fidelity),
        warmup_iters=warmup,
        measure_iters=measure,
        probe_ranks=[int(r) for r in probe_ranks],
    )


def launch_task(cfg: RootConfig, spec: JobSpec, *, exclude: str = "") -> LaunchTask:
    """The one JobSpec -> LaunchTask assembly (the sweep's attempts of every role, `run-one`, the preflight's
    time limits): `run_task(spec)` on N GPUs in spec.job_dir, or a rank probe's ranks as that many separate
    one-GPU tasks (`LaunchTask.alone`: on Slurm array tasks of the round's one array of one-GPU tasks, packed on
    shared nodes), named for the sweep, candidate, attempt and role, with the Slurm time limit of its own
    window. `exclude`: nodes to keep off (a NODE_FAIL retry)."""
    role = "" if spec.role == AttemptRole.MEASURE else f":{spec.role}"
    return LaunchTask(
        fn=run_task,
        args=(spec,),
        n_gpus=1 if spec.probe_ranks else spec.launch_gpus,
        alone=max(1, len(spec.probe_ranks)),
        gpus_per_node=spec.gpus_per_node,
        name=f"{spec.sweep}:{spec.candidate_key[:8]}:{spec.attempt}{role}",
        folder=str(spec.job_dir),
        time_min=time_limit_min(spec, cfg.cluster),
        exclude=exclude,
    )


def parity_spec(
    cfg: RootConfig,
    planned: Planned,
    *,
    sweep: str,
    attempt: int,
    job_dir: Path | str,
    role: AttemptRole = AttemptRole.PARITY,
) -> JobSpec:
    """A correctness-gate run (the candidate's, or with role PARITY_REFERENCE its reference layout's): no
    warm-up, `parity.steps` measured iterations, the sweep's seed and data."""
    return build_spec(
        cfg,
        planned,
        sweep=sweep,
        attempt=attempt,
        job_dir=job_dir,
        window=(0, int(cfg.parity.steps)),
        role=role,
    )


def checkpoint_save_flags(ckpt_dir: Path | str, at: int) -> list[str]:
    """Save at iteration `at`, then exit 0 (Megatron saves at an exit interval when --save is set)."""
    return ["--save", str(ckpt_dir), "--save-interval", str(at), "--exit-interval", str(at)]


def checkpoint_load_flags(ckpt_dir: Path | str) -> list[str]:
    """Restore; a missing checkpoint must stop the job, not silently train from random weights."""
    return ["--load", str(ckpt_dir), "--exit-on-missing-checkpoint"]


def warm_start_flags(decision: Decision, job_dir: Path | str, train_iters: int) -> list[str]:
    """A measurement's warm-start flags (stage.warm_start, orchestrator/schedule/steps/warm_start.py warm): the
    seed's launch saves its weights once, after its last iteration, without optimizer or RNG state (the window
    is timed before the save); a warm-started launch loads them as a fine-tune (iteration 0, no optimizer
    state, the learning-rate schedule from its start), and a missing seed stops it, never training from
    random weights whose routing has not settled."""
    if decision.warm_from:
        load = ["--load", str(decision.warm_from), "--finetune", "--no-load-optim", "--no-load-rng"]
        return [*load, "--exit-on-missing-checkpoint"]
    if decision.seed_save:
        seed = JobPaths(job_dir).seed_checkpoint
        return ["--save", str(seed), "--save-interval", str(train_iters), "--no-save-optim", "--no-save-rng"]
    return []


def long_run_windows(cfg: RootConfig) -> tuple[tuple[int, int], tuple[int, int], int]:
    """(save job's window, restore job's window, --train-iters) of one long-run window
    (cfg.effective.long_run_save_at = X, long_run_after_iters = A): job 1 trains X iterations, saves and exits;
    job 2 loads and trains A more. Job 1 measures X - w1 iterations after w1 = min(stage warm-up, X // 2); job 2
    measures A - w2 after the restore plus w2 = min(stage warm-up, A // 2) warm-up iterations (it restarts
    cold). Both keep --train-iters X + A, so the learning-rate schedule of the restored run is the one saved."""
    if cfg.stage is None:
        raise ValueError("long-run specs need a stage")
    x, a = int(cfg.effective.long_run_save_at), int(cfg.effective.long_run_after_iters)
    if x < 2 or a < 2:
        raise ValueError(f"long-run window needs save_at >= 2 and after_iters >= 2 (got {x}, {a})")
    w1 = min(cfg.stage.warmup_iters, x // 2)
    w2 = min(cfg.stage.warmup_iters, a // 2)
    return (w1, x - w1), (x + w2, a - w2), x + a


def long_run_save_spec(
    cfg: RootConfig, planned: Planned, *, sweep: str, attempt: int, job_dir: Path | str, ckpt_dir: Path | str
) -> JobSpec:
    """The long-run window's first job: train to X, save to `ckpt_dir` and exit (see long_run_windows)."""
    window, _, train = long_run_windows(cfg)
    return build_spec(
        cfg,
        planned,
        sweep=sweep,
        attempt=attempt,
        job_dir=job_dir,
        window=window,
        train_iters=train,
        extra_argv=checkpoint_save_flags(ckpt_dir, int(cfg.effective.long_run_save_at)),
        role=AttemptRole.LONG_RUN_SAVE,
    )


def long_run_restore_spec(
    cfg: RootConfig, planned: Planned, *, sweep: str, attempt: int, job_dir: Path | str, ckpt_dir: Path | str
) -> JobSpec:
    """The long-run window's second job: load the save job's checkpoint from `ckpt_dir` and train on."""
    _, window, train = long_run_windows(cfg)
    return build_spec(
        cfg,
        planned,
        sweep=sweep,
        attempt=attempt,
        job_dir=job_dir,
        window=window,
        train_iters=train,
        extra_argv=checkpoint_load_flags(ckpt_dir),
        role=AttemptRole.LONG_RUN_RESTORE,
    )


def long_run_specs(
    cfg: RootConfig,
    planned: Planned,
    *,
    sweep: str,
    attempt: int,
    ckpt_dir: Path | str,
    folder: Path | str | None = None,
) -> tuple[JobSpec, JobSpec]:
    """(save job, restore job) of one long-run window in `<folder>/save` and `<folder>/restore`, folder
    defaulting to `<cluster.folder>/<sweep>/<key>/long-run-<attempt>/` (the sweep launches each as an attempt
    of its own, orchestrator/sweep/finalists.py)."""
    base = (
        Path(folder)
        if folder is not None
        else attempt_dir(cfg, sweep, planned.key, attempt).parent / f"long-run-{attempt}"
    )
    return (
        long_run_save_spec(cfg, planned, sweep=sweep, attempt=attempt, job_dir=base / "save", ckpt_dir=ckpt_dir),
        long_run_restore_spec(cfg, planned, sweep=sweep, attempt=attempt, job_dir=base / "restore", ckpt_dir=ckpt_dir),
    )


def _prediction_dict(pred) -> dict:
    d = dataclasses.asdict(pred)
    d["memory_by_stage"] = list(d.get("memory_by_stage") or ())
    return d


def distributed_timeout_min(argv: Sequence[str]) -> int:
    """The collective timeout the job runs with: the last --distributed-timeout-minutes (argparse: the last
    wins), else Megatron's default."""
    value = DEFAULT_DISTRIBUTED_TIMEOUT_MIN
    for flag, nxt in zip(argv, [*argv[1:], ""]):
        if flag == "--distributed-timeout-minutes" and str(nxt).isdigit():
            value = int(nxt)
    return value


def time_limit_min(spec: JobSpec, cluster: ClusterConfig, *, safety: float = TIME_SAFETY) -> int:
    """Slurm --time: (warmup + measure) x predicted step time x safety + time_margin_min (start-up,
    checkpoint-free init, teardown), never below min_time_min.

    A real workload's limit also leaves room for one whole --distributed-timeout-minutes after start-up: a
    collective that hangs must end in torch's watchdog error (evidence: which group, which op) before Slurm's
    TIMEOUT hides it. A simulated one opens no process group."""
    iters = sum(spec.window)
    step_s = float(spec.predicted.get("step_time_s") or 0.0)
    minutes = iters * step_s * safety / 60.0 + cluster.time_margin_min
    hang = 0 if spec.workload.simulated else distributed_timeout_min(spec.command) + cluster.time_margin_min
    return max(int(cluster.min_time_min), math.ceil(minutes), hang)


def layout_flags(cfg, stage, layout: Layout, layer_pattern: str, train=None) -> list[str]:
    """A layout's Megatron flags as a job of this stage would get them; also the report's flags block
    for a measured candidate (its layout and layer pattern from the ledger, cfg the sweep's stored config).
    train (a TrainConfig): the same layout on that training run instead (`best --flags --train`): its data,
    length, checkpoints and its own extra_args in place of the measurement's (workload.extra_args)."""
    return list(
        plan_argv.megatron_argv(
            cfg.model,
            stage,
            layout,
            layer_pattern=layer_pattern,
            train_iters=stage.warmup_iters + stage.measure_iters,
            mock_data=cfg.workload.mock_data,
            recipe=cfg.workload.recipe,
            extra=cfg.workload.extra_args if train is None else train.extra_args,
            train=train,
        )
    )


def format_argv(tokens: list[str]) -> str:
    """One flag (with its values) per line, shell-quoted, joined by trailing backslashes."""
    lines: list[list[str]] = []
    for tok in tokens:
        if tok.startswith("--") or not lines:
            lines.append([tok])
        else:
            lines[-1].append(tok)
    text = [" ".join(shlex.quote(t) for t in line) for line in lines]
    return " \\\n".join(text)
