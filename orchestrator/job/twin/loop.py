"""The twin's run: start like Megatron, fail like it would, else train, log, checkpoint and leave sidecars.

Signals: SIGTERM / SIGUSR1 / SIGINT stop the run (exit 128 + signal, as a killed process would report);
SIGUSR2 (Slurm's time-limit warning, sent to every process of the step) is ignored: submitit's wrapper
owns it.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from collections.abc import Sequence

from orchestrator.job.twin import curves, faults, legal, text, truth
from orchestrator.job.twin.checkpoints import Checkpointing, LoadFailed, load_checkpoint, save_checkpoint
from orchestrator.job.twin.job import TwinJob, coords, flag, is_last_rank, job_rng, load_job, reported_ranks, steps_rng
from orchestrator.job.twin.sidecars import write_sidecars
from orchestrator.plan import probe

LB_LOSS_KEYS = {  # --moe-router-load-balancing-type -> the loss name Megatron logs
    "aux_loss": "load_balancing_loss",
    "seq_aux_loss": "seq_load_balancing_loss",
    "global_aux_loss": "global_load_balancing_loss",
}
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
IGNORED_SIGNALS = (signal.SIGUSR2,)  # Slurm's --signal warning: submitit's wrapper owns it, never the workload


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum, frame):
    for sig in STOP_SIGNALS:  # Slurm signals every process and the task forwards: act on the first only
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def main(argv: Sequence[str] | None = None) -> int:
    from orchestrator.core.result import SIMULATED_MARKER

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        for sig in STOP_SIGNALS:
            signal.signal(sig, _on_signal)
        for sig in IGNORED_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        # after the handlers: once this first line is out, a stop signal ends the run as 128 + signal (a caller
        # may signal as soon as it reads it, whatever the load)
        text.out(f"{SIMULATED_MARKER} twin workload: numbers are simulated")
        job = load_job(argv)
        return run(job)
    except Interrupted as exc:
        text.err(f"[twin] received signal {signal.Signals(exc.signum).name}; exiting without finishing training")
        return 128 + exc.signum


def run(job: TwinJob) -> int:
    if job.probe:  # as the job wrapper says it (orchestrator/job/megatron_run.py)
        text.out(probe.mode_line(job.probe_mode, "simulated"))
    text.out(text.event_line("after megatron is initialized"))
    illegal = legal.check(job)
    if illegal is not None:
        text.err(faults.assertion(job, illegal))
        return 1
    refused = faults.probe_crash(job)
    if refused is not None:  # dev builds the model, then its first pipeline receive fails
        text.out(text.event_line("before the start of training step"))
        text.err(refused)
        return 1
    surface = job.surface()
    dying = faults.oom_ranks(job, surface)
    if dying is not None:  # the whole job dies; ranks of an over-HBM stage print torch's OOM
        if dying:
            text.err(faults.oom(job, surface, dying[0]))
        return 1
    text.out(text.event_line("before the start of training step"))
    return train(job, surface)


def train(job: TwinJob, surface: truth.Surface) -> int:
    t = job.twin
    ck = Checkpointing.of(job)
    start = 0
    if ck.load_dir:
        try:
            start = load_checkpoint(job, surface, ck)
        except LoadFailed as exc:
            return exc.code
        if ck.finetune:  # Megatron: the weights only, training restarts at iteration 0 (checkpointing.py:2309)
            start = 0
    times = truth.step_times(surface, max(0, job.train_iters - start), steps_rng(t.seed, job.key, job.attempt, start))
    injected = faults.Injected.draw(job, start)
    last = is_last_rank(job)
    flops = job.model_flops or surface.flops_per_step
    lr = float(flag(job.flags, "lr", 1e-4) or 1e-4)
    lb_key = LB_LOSS_KEYS.get(str(flag(job.flags, "moe_router_load_balancing_type", "aux_loss")))
    mtp = int(flag(job.flags, "mtp_num_layers", job.model.mtp_num_layers) or 0)
    timer_rng = job_rng(job, "timers")
    window: list[float] = []
    measured = 0
    for it in range(start + 1, job.train_iters + 1):
        step = times[it - start - 1]
        time.sleep(min(step * t.time_scale, t.max_sleep_s))
        if it == injected.nccl_at:
            for line in faults.nccl_timeout(job, injected.group, it):
                text.err(line)
            return 1
        if it == injected.crash_at:
            text.err(faults.crash(job))
            return 1
        window.append(step)
        if it > job.warmup_iters:
            measured += 1
        if it % job.log_interval and it != start + 1:
            continue
        avg = sum(window) / len(window)
        window = []
        if last:
            loss, gn = curves.curve(job, it)
            losses = [("lm loss", loss)]
            if lb_key:
                losses.append((lb_key, 1.0 + 0.5 * t.routing_skew**2 * (1 + math.exp(-it / 30.0))))
            losses += [(f"mtp_{i + 1} loss", loss + 0.3) for i in range(mtp)]
            tflops = flops / (avg * 1e12 * job.world)
            text.out(
                text.iteration_line(
                    it,
                    job.train_iters,
                    it * job.stage.global_batch,
                    avg * 1000.0,
                    tflops,
                    lr,
                    job.stage.global_batch,
                    losses,
                    gn,
                )
            )
        if it == start + 1:
            for r in reported_ranks(job):
                if coords(job, r)["dp"] == 0:
                    pp = coords(job, r)["pp"]
                    text.out(text.memory_line(r, it, *truth.rank_memory(surface, pp, f"{job.key}-{r}")))
        if last:
            text.err(text.timers_block(truth.timer_rows(surface, avg, timer_rng)))
        exiting = ck.exit_interval and it % ck.exit_interval == 0
        if ck.save_dir and ((ck.save_interval and it % ck.save_interval == 0) or exiting):
            save_checkpoint(job, surface, ck, it)
        if exiting:
            write_sidecars(job, surface, measured)
            text.out(text.event_line(f"exiting program at iteration {it}"))
            return 0
    write_sidecars(job, surface, measured)
    text.out(text.event_line("after training is done"))
    return 0
