"""Each measured run of a sweep as TensorBoard event files: the layout as hyperparameters (the HParams
dashboard compares layouts), step p50/p99, peak memory, tokens/s/GPU and MFU as metrics.

Why here: ML engineers read results in TensorBoard, not in this tool. The rows are the ledger's measured
candidates (orchestrator.ledger.queries.compare: every fidelity, each marked with its own), the metric names
the registry's (orchestrator.core.metrics), the knobs the registry's (orchestrator.core.knobs). A writer is an
optional extra: torch's `torch.utils.tensorboard` when torch and tensorboard are installed, else `tensorboardX`
(`pip install 'dsv4-orchestrator[tensorboard]'`); `writer_class` is None without either, and `export` says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core import knobs, metrics
from orchestrator.core.errors import UserError
from orchestrator.core.metrics import STEP_P50, STEP_P99
from orchestrator.core.states import CandidateStatus
from orchestrator.ledger import queries

PEAK_GB = "peak_memory_gb"  # the heaviest rank's peak (metrics.peak_gb: reserved, else allocated)
SCALARS = (STEP_P50, STEP_P99, "tokens_per_s_per_gpu", "mfu")  # registry names, besides PEAK_GB
HPARAMS_RUN = "hparams"  # the sub-folder each run's HParams session is written to
INSTALL = "pip install 'dsv4-orchestrator[tensorboard]' (tensorboardX), or torch with tensorboard"


def writer_class() -> Callable[..., Any] | None:
    """A SummaryWriter: torch's (needs the tensorboard package), else tensorboardX's; None without either."""
    try:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter
    except ImportError:
        pass
    try:
        from tensorboardX import SummaryWriter as WriterX  # type: ignore[import-untyped,unused-ignore]

        return WriterX
    except ImportError:
        return None


@dataclass(frozen=True)
class Exported:
    sweep: str
    runs: int
    folder: Path


def _run_name(row: dict) -> str:
    """`c<candidate id>-<layout label>-<key[:10]>`, safe as a folder name."""
    label = re.sub(r"[^A-Za-z0-9=+.-]+", "_", knobs.label(row)).strip("_")
    return f"c{row['candidate_id']}-{label}-{str(row['key'])[:10]}"


def hparams(row: dict) -> dict[str, Any]:
    """The layout as TensorBoard hyperparameters (numbers stay numbers; sets and words as text)."""
    out: dict[str, Any] = {}
    for k in knobs.DISPLAYED:
        v = row.get(k.column)
        out[k.column] = v if isinstance(v, (int, float)) and not isinstance(v, bool) else knobs.text(v)
    out["fidelity"] = str(row.get("fidelity") or "")
    return out


def scalars(row: dict) -> dict[str, float]:
    """The run's metrics that were measured (None ones are left out, never written as 0)."""
    out = {name: float(row[name]) for name in SCALARS if row.get(name) is not None}
    peak = metrics.peak_gb(row)
    if peak is not None:
        out[PEAK_GB] = float(peak)
    return out


def export(ledger, sweep: str, folder: Path, writer: Callable[..., Any] | None = None) -> Exported:
    """One event-file folder per measured candidate under `<folder>/<sweep>/`; UserError without a writer."""
    writer = writer or writer_class()
    if writer is None:
        raise UserError(f"TensorBoard export needs a writer: {INSTALL}")
    cols = ["candidate_id", "key", "round", "status", "fidelity", *(k.column for k in knobs.DISPLAYED)]
    cols += [m.name for m in metrics.METRICS if m.scalar and m.name not in cols]
    rows = [
        r
        for r in queries.compare(ledger, sweep=sweep, columns=cols)
        if r.get(STEP_P50) is not None and r["status"] in (CandidateStatus.DONE, CandidateStatus.EXCLUDED)
    ]
    base = folder / sweep
    for r in rows:
        values = scalars(r)
        w = writer(str(base / _run_name(r)))
        try:
            for name, v in values.items():
                w.add_scalar(name, v, global_step=int(r["round"]))
            # the run's name is the third argument of both writers (torch: run_name, tensorboardX: name)
            w.add_hparams(hparams(r), {f"hparam/{k}": v for k, v in values.items()}, HPARAMS_RUN)
        finally:
            w.close()
    return Exported(sweep, len(rows), base)
