"""Megatron's checkpoint flags, as the twin honours them: --save / --save-interval / --exit-interval write
the tracker and an `iter_NNNNNNN/` folder (a marker standing for the shards, simulated); --load resumes
numbering from the tracker's iteration. Save / load time = the rank's weights + optimizer state at
TwinConfig.ckpt_gb_s, printed as Megatron's `save-checkpoint` / `load-checkpoint` timers (log level 0).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.paths import CheckpointPaths, atomic_write
from orchestrator.job.twin import text, truth
from orchestrator.job.twin.job import TwinJob, flag, is_last_rank, job_rng, speaks_rank0


@dataclass
class Checkpointing:
    """Megatron's checkpoint flags, as the twin reads them."""

    save_dir: Path | None
    load_dir: Path | None
    save_interval: int
    exit_interval: int
    exit_on_missing: bool
    finetune: bool  # --finetune: load the weights of any layout's checkpoint, start at iteration 0

    @classmethod
    def of(cls, job: TwinJob) -> Checkpointing:
        f = job.flags

        def path(name):
            v = flag(f, name)
            return Path(str(v)) if v not in (None, True) else None

        return cls(
            save_dir=path("save"),
            load_dir=path("load"),
            save_interval=int(flag(f, "save_interval", 0) or 0),
            exit_interval=int(flag(f, "exit_interval", 0) or 0),
            exit_on_missing=bool(flag(f, "exit_on_missing_checkpoint", False)),
            finetune=bool(flag(f, "finetune", False)),
        )


class LoadFailed(Exception):
    """Nothing was loaded; `code` is the process exit status Megatron ends with."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def checkpoint_ms(job: TwinJob, surface: truth.Surface, what: str, factor: float = 1.0) -> tuple[float, float]:
    """(min, max) ms across ranks to write (or read, factor > 1) each rank's share at ckpt_gb_s."""
    rng = job_rng(job, "ckpt", what)
    times = [
        gb / max(job.twin.ckpt_gb_s, 1e-9) * factor * math.exp(rng.gauss(0.0, job.twin.noise_sigma)) * 1000.0
        for gb in surface.checkpoint_gb
    ]
    return min(times), max(times)


def save_checkpoint(job: TwinJob, surface: truth.Surface, ck: Checkpointing, it: int) -> None:
    """Megatron's save_checkpoint_and_time: the lines rank 0 prints, the `save-checkpoint` timer (log level 0)
    on the last rank, the tracker file and a marker standing for the checkpoint's shards."""
    lo, hi = checkpoint_ms(job, surface, f"save-{it}")
    time.sleep(min(hi / 1000.0 * job.twin.time_scale, 0.05))
    save = ck.save_dir
    assert save is not None
    if speaks_rank0(job):
        text.out(text.saving_line(it, save))
        paths = CheckpointPaths(save)
        marker = {
            "simulated": True,
            "iteration": it,
            "key": job.key,
            "layout": job.layout.short(),
            "consumed_samples": it * job.stage.global_batch,
            "save_ms": [lo, hi],
        }
        atomic_write(paths.twin_marker(it), json.dumps(marker))
        atomic_write(paths.tracker, str(it))
        text.out(text.saved_line(it, save, job.layout.tp, job.layout.pp))
    if is_last_rank(job):
        text.err(text.timers_block([("save-checkpoint", lo, hi)]))


def load_checkpoint(job: TwinJob, surface: truth.Surface, ck: Checkpointing) -> int:
    """The iteration to resume from (0: none found, start from random), after the lines Megatron prints.

    No tracker file: Megatron warns and starts from random; with --exit-on-missing-checkpoint it exits
    (sys.exit(), status 0: LoadFailed(0)). A tracker naming an iteration whose files are gone: the load
    raises FileNotFoundError (LoadFailed(1))."""
    load = ck.load_dir
    assert load is not None
    paths = CheckpointPaths(load)
    if not paths.tracker.is_file():
        if speaks_rank0(job):
            for line in text.missing_tracker_lines(paths.tracker):
                text.out(line)
        if ck.exit_on_missing:
            text.out(text.EXIT_ON_MISSING)
            raise LoadFailed(0)
        return 0
    it = int(paths.tracker.read_text().strip())
    marker = paths.twin_marker(it)
    if speaks_rank0(job):
        text.out(text.loading_line(load, it))
    if not marker.is_file():
        text.err(text.load_not_found_traceback(job.entry, marker.parent))
        raise LoadFailed(1)
    lo, hi = checkpoint_ms(job, surface, f"load-{it}", factor=1.2)  # read + reshard is a little slower
    time.sleep(min(hi / 1000.0 * job.twin.time_scale, 0.05))
    if speaks_rank0(job):
        text.out(text.loaded_line(load, it, job.layout.tp, job.layout.pp))
    if is_last_rank(job):
        text.err(text.timers_block([("load-checkpoint", lo, hi)]))
    return it
