"""Run a Megatron entry script in this process with instrumentation, then leave a per-rank sidecar.

Why in-process: a forward hook on the router and a wrapper on train_step need the same interpreter
as the model (a subprocess would hide both). The entry script (pretrain_hybrid.py from a Megatron-LM
checkout) runs via runpy as __main__ with sys.argv = [script, *argv].

Import order: the checkout (the script's folder, which holds `megatron/` and the model_provider /
hybrid_builders modules the script imports) goes first on sys.path before anything imports `megatron`,
the router hook included. Otherwise an installed megatron-core wheel answers `import megatron` and the
V4 script dies on a dev-only module (ModuleNotFoundError: megatron.core.context_parallel_layout). If
megatron.core was imported from elsewhere before main() ran, the sidecar says so (`instrument_error`),
and it records where megatron.core came from (`megatron_path`).

The sidecar `sidecar-rank-<r>.json` is written in `finally` and, for exits that skip it, at atexit
(once): CUDA allocator peaks of this rank (Megatron's memory line covers only DP-rank-0 GPUs), the GPU's total
memory (what the sweep plans with instead of hardware.hbm_gb), the router evidence from
orchestrator.job.instrument, what the node ran with (orchestrator.job.node: versions, the checkout's git
commit, the container, the NCCL/NVTE environment) and "simulated": false.

Imports stay stdlib at module level: torch and megatron are imported only inside main().
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.core.paths import JobPaths, atomic_write
from orchestrator.job import instrument, node, probe_mode
from orchestrator.plan import probe


def _megatron_facts() -> dict[str, Any]:
    """PP stage, capacity factor, force-balanced routing and versions, when Megatron got that far."""
    facts: dict[str, Any] = {
        "pp_stage": None,
        "capacity_factor": None,
        "force_balanced_routing": None,
        "megatron_path": None,
        "versions": {},
    }
    try:
        import torch

        facts["versions"]["torch"] = torch.__version__
        from megatron.core import package_info, parallel_state

        facts["megatron_path"] = getattr(sys.modules.get("megatron.core"), "__file__", None)
        facts["versions"]["megatron_core"] = package_info.__version__
        if parallel_state.model_parallel_is_initialized():
            facts["pp_stage"] = parallel_state.get_pipeline_model_parallel_rank()
        from megatron.training.global_vars import get_args

        args = get_args()
        facts["capacity_factor"] = getattr(args, "moe_expert_capacity_factor", None)
        facts["force_balanced_routing"] = bool(getattr(args, "moe_router_force_load_balancing", False))
    except Exception:  # noqa: BLE001 - best effort: a crash before init still gets memory + counts
        pass
    return facts


def write_sidecar(
    out_dir: str | os.PathLike[str],
    rank: int,
    counter: instrument.RouterCounter | None,
    error: str | None = None,
    checkout: Path | None = None,
    probing: bool = False,
) -> Path:
    """Atomically write this rank's sidecar (`checkout`: the Megatron tree whose commit it records; `probing`: a
    rank probe, whose sidecar names its probe mode)."""
    doc: dict[str, Any] = {"simulated": False, "source": "megatron_run", "rank": rank}
    doc.update(_megatron_facts())
    here = node.facts(checkout)
    doc["node"], doc["env"] = here["node"], here["env"]
    doc["versions"] = {**here["versions"], **doc["versions"]}
    doc.update(instrument.peak_memory_mb())
    doc.update(instrument.device_memory())
    if counter is not None:
        doc.update(counter.report())
    if probing:  # what the probe ran with: the mode is part of its provenance (orchestrator/plan/probe.py)
        done = probe_mode.installed()
        doc["probe_mode"] = done.report() if done is not None else {"mode": probe.OFF}
        doc["versions"]["probe_mode"] = done.mode if done is not None else probe.OFF
    if error:
        doc["instrument_error"] = error
    return atomic_write(JobPaths(out_dir).sidecar(rank), json.dumps(doc))


def _checkout_first(checkout: Path) -> str | None:
    """Put the Megatron checkout first on sys.path; say so if `megatron` already came from elsewhere."""
    sys.path.insert(0, str(checkout))
    core = sys.modules.get("megatron.core")  # `megatron` itself is a namespace package: core decides
    where = getattr(core, "__file__", None)
    if where is not None and not Path(where).resolve().is_relative_to(checkout):
        return f"megatron.core was imported from {where} before the checkout {checkout} was put first on sys.path"
    return None


def _install_probe_mode(argv: Sequence[str]) -> str | None:
    """Install the probe mode the job asked for (orchestrator/plan/probe.py MODE_ENV) before Megatron runs;
    None when installed or none was asked, else the one line that says why it cannot be (ProbeModeError)."""
    mode, skew = probe_mode.from_env()
    if mode is None:
        return None
    seq, mbs = probe.flag_value(argv, "--seq-length"), probe.flag_value(argv, "--micro-batch-size")
    try:
        probe_mode.install(
            mode,
            skew=skew,
            seq_length=int(seq) if seq and seq.isdigit() else None,
            micro_batch_size=int(mbs) if mbs and mbs.isdigit() else None,
        )
    except probe_mode.ProbeModeError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - Megatron or torch would not even import: the probe cannot run
        return f"probe mode {mode} not installed: {exc!r}"
    return None


def main(
    entry_script: str, argv: Sequence[str], window: tuple[int, int], out_dir: str | os.PathLike[str], rank: int
) -> int:
    """Run entry_script as __main__ with argv, counting routers in the (warmup, measure) window.
    Returns the script's exit code (SystemExit is caught); other exceptions propagate after the
    sidecar is written."""
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    script = Path(entry_script).resolve()
    shadowed = _checkout_first(script.parent)  # before the router hook imports megatron
    counter: instrument.RouterCounter | None = None
    errors = [shadowed] if shadowed else []
    probing = probe.is_probe(argv)
    refused = _install_probe_mode(argv) if probing else None
    try:
        counter = instrument.RouterCounter.for_window(*window).install()
    except Exception as exc:  # noqa: BLE001 - no megatron-core here: run uninstrumented, say why
        errors.append(f"router hook not installed: {exc!r}")
    if probing:
        print(probe_mode.describe(), flush=True)
    if refused:
        errors.append(refused)
    error = "; ".join(errors) or None
    written: list[Path] = []

    def finish() -> None:
        if not written:
            written.append(write_sidecar(out_dir, rank, counter, error, script.parent, probing))

    if refused:  # the probe cannot run as the real job's rank: say why, run nothing
        print(f"[orchestrator] {refused}", file=sys.stderr)
        sys.path[:] = saved_path
        finish()
        if counter is not None:
            counter.uninstall()
        probe_mode.uninstall()
        return 1

    atexit.register(finish)
    sys.argv = [str(script), *argv]
    try:
        runpy.run_path(str(script), run_name="__main__")
        return 0
    except SystemExit as exc:
        if isinstance(exc.code, int) or exc.code is None:
            return exc.code or 0
        print(exc.code, file=sys.stderr)  # sys.exit("message"): what the interpreter would print
        return 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        finish()
        atexit.unregister(finish)
        if counter is not None:
            counter.uninstall()
        probe_mode.uninstall()
