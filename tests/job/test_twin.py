"""The twin workload: real Megatron flags in, Megatron-format (SIMULATED) evidence out."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core.result import SIMULATED_MARKER
from orchestrator.evidence.classify import config_errors
from orchestrator.evidence.parse import parse_bytes
from orchestrator.job.twin import truth
from orchestrator.job.twin.faults import NCCL_GROUPS
from orchestrator.plan.argv import megatron_argv
from orchestrator.runspec import build_spec

ROOT = Path(__file__).resolve().parents[2]


def truth_of(cfg, planned, **twin):
    """The simulated machine's surface for one planned layout (what the twin job itself evaluates)."""
    tw = dataclasses.replace(cfg.workload.twin, **twin)
    case = truth.Case(cfg.model, cfg.hardware, cfg.stage, tw, planned.layout, planned.prediction.layer_pattern)
    return truth.evaluate(case)


def write_spec(cfg, planned, tmp_path, **twin):
    cfg = dataclasses.replace(
        cfg, workload=dataclasses.replace(cfg.workload, twin=dataclasses.replace(cfg.workload.twin, **twin))
    )
    spec = build_spec(cfg, planned, sweep="t", attempt=1, job_dir=tmp_path / "job")
    spec.save(Path(spec.job_dir) / "job.json")
    return spec


def run_twin(spec, *, rank=None, single=True, argv=None, timeout=60, spec_env=True):
    n = spec.n_gpus
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "RANK", "WORLD_SIZE"))}
    env.update(PYTHONPATH=str(ROOT), WORLD_SIZE=str(n), RANK=str(n - 1 if rank is None else rank), LOCAL_RANK="0")
    if single:
        env["ORCH_SINGLE_PROCESS"] = "1"
    if spec_env:
        env.update(ORCH_JOB_DIR=spec.job_dir, ORCH_JOB_SPEC=str(Path(spec.job_dir) / "job.json"))
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.job.twin", *(spec.argv if argv is None else argv)],
        env=env,
        cwd=spec.job_dir,
        capture_output=True,
        timeout=timeout,
    )


def test_healthy_run_prints_megatron_lines_that_parse(smoke, tmp_path):
    cfg, cands = smoke
    planned = cands[0]
    spec = write_spec(cfg, planned, tmp_path)
    proc = run_twin(spec)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert proc.stdout.decode().splitlines()[0].startswith(SIMULATED_MARKER + " twin workload")
    out, err = parse_bytes(proc.stdout), parse_bytes(proc.stderr)
    assert out.simulated and out.garbage_lines == 0
    train_iters = cfg.stage.warmup_iters + cfg.stage.measure_iters
    assert [r.iteration for r in out.iterations] == list(range(1, train_iters + 1))
    it = out.iterations[-1]
    assert it.train_iters == train_iters and it.global_batch_size == cfg.stage.global_batch
    assert it.consumed_samples == train_iters * cfg.stage.global_batch
    assert "lm loss" in it.losses and it.tflops_per_gpu > 0
    assert any(k.endswith("load_balancing_loss") for k in it.losses)  # key follows the balancing type
    losses = [r.losses["lm loss"] for r in out.iterations]
    assert losses[-1] < losses[0]
    # The first iterations are slower (warm-up); the measured window is the truth's step, not the planner's.
    times = [r.elapsed_ms / 1000 for r in out.iterations]
    assert times[0] > 1.5 * statistics.median(times)
    measured = statistics.median(times[cfg.stage.warmup_iters :])
    surface = truth_of(cfg, planned)
    assert measured == pytest.approx(surface.step_s, rel=0.05)
    # Memory lines: one per TP x CP x PP position (DP-rank 0), after the first iteration.
    lay = planned.layout
    assert len(out.memory) == lay.tp * lay.cp * lay.pp and {m.after_iterations for m in out.memory} == {1}
    assert max(m.max_reserved for m in out.memory) * 2**20 / 1e9 == pytest.approx(max(surface.stage_gb), rel=0.01)
    # Timers go to stderr (logger.info), one minmax block per logged iteration.
    assert len(err.timers) == train_iters and "forward-backward" in err.timers[-1].timers
    lo, hi = err.timers[-1].timers["forward-backward"]
    assert lo <= hi
    # Sidecars: one per pipeline stage (the DP-rank-0, TP-0, CP-0 rank), simulated, routing evidence.
    sidecars = sorted(Path(spec.job_dir).glob("sidecar-rank-*.json"))
    assert len(sidecars) == lay.pp
    doc = json.loads(sidecars[-1].read_text())
    assert doc["simulated"] is True and len(doc["tokens_per_expert"]) == cfg.model.num_experts
    assert doc["dropped_tokens"] == 0 and doc["padded_tokens"] == 0  # dropless
    assert max(doc["tokens_per_expert"]) > 1.2 * statistics.mean(doc["tokens_per_expert"])  # routing skew


def test_noise_is_deterministic_per_seed(smoke, tmp_path):
    cfg, cands = smoke

    def elapsed(seed, sub):
        spec = write_spec(cfg, cands[0], tmp_path / sub, seed=seed)
        proc = run_twin(spec)
        assert proc.returncode == 0
        return [r.elapsed_ms for r in parse_bytes(proc.stdout).iterations]

    a, b, c = elapsed(1, "a"), elapsed(1, "b"), elapsed(2, "c")
    assert a == b and a != c


def test_oom_follows_the_truth_memory_not_the_planner(smoke, tmp_path):
    """On a layout whose truth peak is below the planner's prediction: HBM between the two runs (the planner
    would call it over capacity), HBM just under the truth's peak is torch's OOM."""
    cfg, cands = smoke
    planned, peak = next(
        (c, max(truth_of(cfg, c).stage_gb))
        for c in cands
        if max(truth_of(cfg, c).stage_gb) < 0.97 * c.prediction.memory_gb
    )

    def on_hbm(hbm, sub):
        cfg2 = dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, hbm_gb=hbm))
        return run_twin(write_spec(cfg2, planned, tmp_path / sub))

    proc = on_hbm(peak * 0.99, "under")
    err = proc.stderr.decode()
    assert proc.returncode == 1
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate " in err
    assert "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF" in err
    assert parse_bytes(proc.stderr).ooms and not parse_bytes(proc.stdout).iterations
    between = (peak + planned.prediction.memory_gb) / 2
    proc = on_hbm(between, "between")
    assert proc.returncode == 0, proc.stderr.decode()[-1000:]
    assert parse_bytes(proc.stdout).iterations


def test_a_gpu_smaller_than_its_hardware_group_ooms_and_says_what_it_holds(smoke, tmp_path):
    """TwinConfig.gpu_capacity_gb: the GPU holds less than hardware.hbm_gb (141 under h200). A layout whose truth
    peak fits HBM but not the GPU dies of torch's OOM, whose message states the GPU's capacity (binary GiB, as
    torch); one that fits leaves sidecars recording the device's total memory (get_device_properties)."""
    from orchestrator.core.paths import JobPaths
    from orchestrator.evidence.metrics import CAPACITY_FROM_DEVICE, CAPACITY_FROM_OOM, gpu_capacity, load_sidecars

    cfg, cands = smoke
    planned = cands[0]
    peak = max(truth_of(cfg, planned).stage_gb)
    assert peak < cfg.hardware.hbm_gb
    small = peak * 0.9
    proc = run_twin(write_spec(cfg, planned, tmp_path / "small", gpu_capacity_gb=small))
    assert proc.returncode == 1
    log = parse_bytes(proc.stderr)
    assert log.ooms[0].total_capacity == f"{small * 1e9 / 2**30:.2f} GiB"
    gb, source = gpu_capacity([log])
    assert gb == pytest.approx(small, abs=0.006) and source == CAPACITY_FROM_OOM  # two decimals of GiB
    spec = write_spec(cfg, planned, tmp_path / "fits", gpu_capacity_gb=peak * 1.1)
    proc = run_twin(spec)
    assert proc.returncode == 0, proc.stderr.decode()[-1000:]
    sidecars, _ = load_sidecars(JobPaths(spec.job_dir).sidecars())
    assert sidecars and gpu_capacity([], sidecars) == (round(peak * 1.1 * 1e9) / 1e9, CAPACITY_FROM_DEVICE)


def test_forced_oom(smoke, tmp_path):
    cfg, cands = smoke
    proc = run_twin(write_spec(cfg, cands[0], tmp_path, force_oom=True))
    assert proc.returncode == 1 and parse_bytes(proc.stderr).ooms[0].kind == "cuda"


def test_illegal_layout_is_a_megatron_assertion(smoke, tmp_path):
    cfg, cands = smoke
    spec = write_spec(cfg, cands[0], tmp_path)
    argv = megatron_argv(
        cfg.model,
        cfg.stage,
        dataclasses.replace(cands[0].layout, ep=3),
        layer_pattern=cands[0].prediction.layer_pattern,
        train_iters=5,
    )
    proc = run_twin(spec, argv=argv)
    assert proc.returncode == 1
    errors = config_errors(parse_bytes(proc.stderr))
    assert errors and errors[0].exc_type == "AssertionError"
    # The first violated rule (expert grid: 32 % (ETP x EP x PP) != 0), worded as Megatron words it.
    assert errors[0].message.startswith("world size (32) is not divisible by expert_tensor_model_pipeline")


def test_injected_nccl_timeout_names_the_group(smoke, tmp_path):
    cfg, cands = smoke
    proc = run_twin(write_spec(cfg, cands[0], tmp_path, nccl_timeout_rate=1.0))
    assert proc.returncode != 0
    nccl = parse_bytes(proc.stderr).nccl
    assert nccl and nccl[0].kind == "caught" and nccl[0].process_group in NCCL_GROUPS.values()
    done = parse_bytes(proc.stdout).iterations
    assert cfg.stage.warmup_iters <= len(done) < cfg.stage.warmup_iters + cfg.stage.measure_iters


def test_injected_crash_is_a_traceback(smoke, tmp_path):
    cfg, cands = smoke
    proc = run_twin(write_spec(cfg, cands[0], tmp_path, crash_rate=1.0))
    assert proc.returncode != 0
    assert any(t.exc_type == "RuntimeError" for t in parse_bytes(proc.stderr).tracebacks)


def test_one_rank_of_a_multi_rank_job(smoke, tmp_path):
    """Rank 0 (not last): no iteration lines; memory line for itself (DP-rank 0); its own sidecar."""
    cfg, cands = smoke
    spec = write_spec(cfg, cands[0], tmp_path)
    proc = run_twin(spec, rank=0, single=False)
    assert proc.returncode == 0
    out = parse_bytes(proc.stdout)
    assert out.simulated and not out.iterations and [m.rank for m in out.memory] == [0]
    assert [p.name for p in Path(spec.job_dir).glob("sidecar-*.json")] == ["sidecar-rank-0.json"]


def test_runs_from_flags_alone(smoke, tmp_path):
    """Without ORCH_JOB_SPEC the twin reads the model from the flags and uses default hardware."""
    cfg, cands = smoke
    spec = write_spec(cfg, cands[0], tmp_path)
    proc = run_twin(spec, spec_env=False)
    assert proc.returncode == 0, proc.stderr.decode()[-1000:]
    assert len(parse_bytes(proc.stdout).iterations) == cfg.stage.warmup_iters + cfg.stage.measure_iters


def test_sigterm_exits_non_zero(smoke, tmp_path):
    cfg, cands = smoke
    spec = write_spec(cfg, cands[0], tmp_path, time_scale=10.0, max_sleep_s=5.0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(
        PYTHONPATH=str(ROOT),
        WORLD_SIZE=str(spec.n_gpus),
        RANK=str(spec.n_gpus - 1),
        ORCH_SINGLE_PROCESS="1",
        ORCH_JOB_SPEC=str(Path(spec.job_dir) / "job.json"),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.job.twin", *spec.argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    first = proc.stdout.readline().decode()
    assert first.startswith(SIMULATED_MARKER)  # the event: the twin prints it once its handlers are in place
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert b"SIGTERM" in err


def test_capacity_factor_drops_tokens(smoke, tmp_path):
    """Dropless routes everything; a capacity factor of 1.0 with skewed routing drops tokens."""
    cfg, cands = smoke
    spec = write_spec(cfg, cands[0], tmp_path)
    lay = dataclasses.replace(cands[0].layout, capacity_factor=1.0)
    argv = megatron_argv(
        cfg.model,
        cfg.stage,
        lay,
        layer_pattern=cands[0].prediction.layer_pattern,
        train_iters=cfg.stage.warmup_iters + cfg.stage.measure_iters,
    )
    proc = run_twin(spec, argv=argv)
    assert proc.returncode == 0, proc.stderr.decode()[-1000:]
    doc = json.loads(sorted(Path(spec.job_dir).glob("sidecar-rank-*.json"))[0].read_text())
    assert doc["capacity_factor"] == 1.0
    assert 0 < doc["dropped_tokens"] < 0.5 * doc["routed_tokens"]
    assert sum(doc["tokens_per_expert"]) == doc["routed_tokens"] - doc["dropped_tokens"]


def test_moe_layers_per_pipeline_stage():
    from orchestrator.job.twin.sidecars import moe_layers_on_stage

    pattern = "HEHECE|HECE|HECEHE|CE/WE"  # PP2 x VPP2: rank 0 runs segments 0 and 2, rank 1 runs 1, 3 and MTP
    assert [moe_layers_on_stage(pattern, 2, s) for s in (0, 1)] == [6, 4]
    assert moe_layers_on_stage("HEHECEHECEHECEHECE/WE", 1, 0) == 10
