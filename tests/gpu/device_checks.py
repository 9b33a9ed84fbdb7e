"""The Python steps of tests/gpu/device.sh, each writing one JSON file: `imports`, `argv`, `gemm`, `summary`.

Why a script beside device.sh: each step must leave evidence even when the one before it failed, and say
beside every measured figure what the planner predicted for it. `imports` and `argv` also run on a machine
without a GPU (device.sh with DEVICE_DRY=1), so the one device run spends no time on what CPUs can prove.

    python tests/gpu/device_checks.py imports OUT/imports.json
    python tests/gpu/device_checks.py argv OUT/argv.json
    python tests/gpu/device_checks.py gemm OUT/gemm.json [--budget-s 90]
    python tests/gpu/device_checks.py summary OUT [--steps steps.tsv]   (reads the step files)
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# What the in-process Megatron path (orchestrator.job.megatron_run running pretrain_hybrid.py with the V4 spec) imports.
# "required": the run cannot start without it; the others say which optional kernels the image lacks.
IMPORTS: tuple[tuple[str, bool], ...] = (
    ("orchestrator.cli", True),
    ("orchestrator.job.megatron_run", True),
    ("orchestrator.job.instrument", True),
    ("hydra", True),
    ("omegaconf", True),
    ("submitit", True),
    ("sqlalchemy", True),
    ("alembic", True),
    ("torch", True),
    ("triton", True),
    ("megatron.core", True),
    ("megatron.training", True),
    ("megatron.training.arguments", True),
    ("megatron.core.models.hybrid.hybrid_model", True),
    ("megatron.core.models.hybrid.hybrid_layer_specs", True),
    ("megatron.core.models.gpt.experimental_attention_variant_module_specs", True),
    ("megatron.core.transformer.experimental_attention_variant.deepseek_v4_hybrid_attention", True),
    ("megatron.core.transformer.moe.moe_layer", True),
    ("megatron.core.context_parallel_layout", True),
    ("hybrid_builders", True),
    ("model_provider", True),
    # The V4 spec builds its layers from TE classes (hybrid_layer_specs.py:4-10, 78-195 at dev d48bd6be):
    ("transformer_engine", False),
    ("transformer_engine.pytorch", False),
    ("cudnn", False),  # cuDNN frontend: --dsa-kernel-backend cudnn (transformer_config.py:1793)
    ("flash_mla", False),
    ("grouped_gemm", False),
    ("deep_ep", False),
)


def _write(path: str | Path, doc: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps(doc, default=str)[:4000])


def step_imports(out: str) -> int:
    """Import every module the path needs; record where each came from or its error's last line.
    Without CUDA (DEVICE_DRY=1) megatron_check's CPU shims go first (they change nothing on the device:
    Python 3.12 has typing.override, and triton is installed there) and triton is not required."""
    import torch

    from orchestrator.job import megatron_check

    cuda = bool(torch.cuda.is_available())
    if not cuda:
        if not hasattr(typing, "override"):
            import typing_extensions

            typing.override = typing_extensions.override  # type: ignore[attr-defined]
        megatron_check._stub_paged_stash()
    rows = []
    for name, needed in IMPORTS:
        required = needed and (cuda or name != "triton")
        t0 = time.perf_counter()
        try:
            mod = importlib.import_module(name)
            rows.append({"module": name, "ok": True, "file": getattr(mod, "__file__", None)})
        except BaseException as exc:  # noqa: BLE001 - a failing import is this step's finding
            rows.append({"module": name, "ok": False, "required": required, "error": f"{type(exc).__name__}: {exc}"})
        rows[-1]["s"] = round(time.perf_counter() - t0, 2)
    te_spec = _te_spec_probe()
    missing = [r["module"] for r in rows if not r["ok"] and r.get("required")]
    doc = {"step": "imports", "ok": not missing, "cuda": cuda, "missing_required": missing, "modules": rows}
    _write(out, {**doc, **te_spec})
    return 0 if not missing else 1


def _te_spec_probe() -> dict[str, Any]:
    """Can the V4 spec's backend be built here? dev asserts transformer_impl == transformer_engine
    (experimental_attention_variant_module_specs.py:521) and TESpecProvider needs TE (same file:50-57)."""
    try:
        specs = importlib.import_module("megatron.core.models.gpt.experimental_attention_variant_module_specs")
        return {"v4_backend_te_available": bool(getattr(specs, "HAVE_TE", False))}
    except BaseException as exc:  # noqa: BLE001
        return {"v4_backend_te_available": None, "v4_backend_error": repr(exc)}


def _gpu1_argv() -> tuple[list[str], Any]:
    """The gpu1 candidate's flags exactly as run-one builds them (tests/job/test_gpu_script.py composes the same)."""
    from orchestrator.commands.plan import megatron_flags
    from orchestrator.config import compose
    from orchestrator.plan import planner

    cfg = compose(["+stage=gpu1", "workload=megatron", "cluster=local"], require_stage=True).cfg
    kept = planner.plan(cfg.model, cfg.hardware, cfg.stage, workload=cfg.workload.name).candidates
    if not kept:
        raise SystemExit("error: the gpu1 stage planned no candidate")
    return megatron_flags(cfg, cfg.stage, kept[0]) + list(cfg.workload.extra_args or []), kept[0]


def step_argv(out: str) -> int:
    """The gpu1 argv through the carried dev checkout's own parse_args + validate_args (+ the
    TransformerConfig where CUDA answers), via orchestrator.job.megatron_check; and the planner's figures."""
    doc: dict[str, Any] = {"step": "argv"}
    try:
        argv, planned = _gpu1_argv()
        doc["argv"] = argv
        pred = planned.prediction
        doc["predicted"] = {
            "memory_gb": pred.memory_gb,
            "step_s": pred.step_time_s,
            "layer_pattern": pred.layer_pattern,
        }
        from orchestrator.job import megatron_check

        megatron_check.import_megatron()
        core = sys.modules.get("megatron.core")
        doc["megatron_core_file"] = getattr(core, "__file__", None)
        # Parser + validate_args + optimizer setup alone, then (where CUDA answers) with the TransformerConfig,
        # whose __post_init__ imports the cuDNN DSA kernels (transformer_config.py:1793 at dev d48bd6be).
        doc["parser_verdict"] = megatron_check.check_candidate(argv, 1, transformer_config=False)
        doc["verdict"] = megatron_check.check_candidate(argv, 1)
        doc["ok"] = doc["parser_verdict"] is None and doc["verdict"] is None
    except BaseException as exc:  # noqa: BLE001
        doc["ok"] = False
        doc["error"] = "".join(traceback.format_exception(exc))[-3000:]
    _write(out, doc)
    return 0 if doc["ok"] else 1


def _planner_gemm() -> dict[str, Any]:
    from orchestrator.config import compose
    from orchestrator.plan.flops import peak_tflops

    cfg = compose(["+stage=gpu1", "hardware=h200", "model=dsv4_pro"], require_stage=True).cfg
    m, hw = cfg.model, cfg.hardware
    return {
        "hidden": int(m.hidden_size),
        "moe_ffn": int(m.moe_ffn_hidden_size),
        "peak_bf16_tflops": peak_tflops(hw, "bf16"),
        "gemm_efficiency": float(hw.gemm_efficiency),
        "hbm_gb": float(hw.hbm_gb),
    }


def _time_ms(fn: Any, torch: Any, reps: int) -> float:
    for _ in range(3):
        fn()
    if not torch.cuda.is_available():  # --smoke on CPU: the code path, not a figure
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) * 1e3 / reps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / reps


def step_gemm(out: str, budget_s: float, smoke: bool = False) -> int:
    """bf16 expert GEMMs of the V4-Pro shapes (fc1 h -> 2 x moe_ffn, SwiGLU; fc2 moe_ffn -> h) on G local
    experts at T tokens each, as one grouped GEMM (torch._grouped_mm where present, else a loop of mm),
    against the planner: efficiency = gemm_efficiency x T / (T + EXPERT_GEMM_HALF_TOKENS)
    (orchestrator/plan/steptime.py expert_efficiency)."""
    from orchestrator.plan.steptime import EXPERT_GEMM_HALF_TOKENS, expert_efficiency

    doc: dict[str, Any] = {"step": "gemm", "rows": [], "ok": False}
    try:
        doc["planner"] = p = _planner_gemm()
        doc["planner"]["expert_gemm_half_tokens"] = EXPERT_GEMM_HALF_TOKENS
        import torch

        if not torch.cuda.is_available() and not smoke:
            doc["error"] = "no CUDA device: nothing measured"
            _write(out, doc)
            return 1
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        doc["device"] = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu (smoke: shapes only)"
        if dev.type == "cuda":  # the memory model's feasibility compares against hardware.hbm_gb
            free, total = torch.cuda.mem_get_info()
            doc["hbm"] = {"total_gb": round(total / 1e9, 2), "free_gb": round(free / 1e9, 2)}
            doc["hbm"]["planner_hbm_gb"] = p["hbm_gb"]
        h, f, groups = p["hidden"], p["moe_ffn"], 8  # 384 experts / EP 48 = 8 local experts
        if smoke:
            h, f, tokens, dense_m = 64, 32, (16, 32), 64
        else:
            tokens, dense_m = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192), 16384
        peak = p["peak_bf16_tflops"]
        grouped = hasattr(torch, "_grouped_mm")
        doc["kernel"] = "torch._grouped_mm" if grouped else "loop of torch.mm"
        # Dense reference: one large GEMM, what hw.gemm_efficiency stands for.
        a = torch.randn(dense_m, h, device=dev, dtype=torch.bfloat16)
        b = torch.randn(h, 2 * f * 3, device=dev, dtype=torch.bfloat16)
        ms = _time_ms(lambda a=a, b=b: a @ b, torch, 20)
        dense = 2 * a.shape[0] * h * b.shape[1] / (ms * 1e-3) / 1e12
        doc["dense"] = {"m": a.shape[0], "k": h, "n": b.shape[1], "tflops": round(dense, 1)}
        doc["dense"]["efficiency"] = round(dense / peak, 3)
        doc["dense"]["planner_efficiency"] = p["gemm_efficiency"]
        del a, b
        # Weights (G, K, N) stored column-major per expert, the layout torch's grouped-GEMM tests use.
        w1 = (torch.randn(groups, 2 * f, h, device=dev, dtype=torch.bfloat16) * 0.02).transpose(-2, -1)
        w2 = (torch.randn(groups, h, f, device=dev, dtype=torch.bfloat16) * 0.02).transpose(-2, -1)
        t_start = time.perf_counter()
        for t in tokens:
            if time.perf_counter() - t_start > budget_s:
                doc["stopped_early"] = f"budget {budget_s} s spent before T={t}"
                break
            x = torch.randn(groups * t, h, device=dev, dtype=torch.bfloat16)
            y = torch.randn(groups * t, f, device=dev, dtype=torch.bfloat16)
            offs = torch.arange(t, groups * t + 1, t, device=dev, dtype=torch.int32)

            def run_grouped(x=x, y=y, offs=offs) -> None:
                torch._grouped_mm(x, w1, offs=offs)
                torch._grouped_mm(y, w2, offs=offs)

            def run_loop(x=x, y=y, t=t) -> None:
                for g in range(groups):
                    x[g * t : (g + 1) * t] @ w1[g]
                    y[g * t : (g + 1) * t] @ w2[g]

            try:
                ms = _time_ms(run_grouped if grouped else run_loop, torch, 20)
            except RuntimeError as exc:  # this build's grouped GEMM refuses the shape: say so, time the loop
                doc["grouped_error"], grouped = repr(exc)[:500], False
                doc["kernel"] = "loop of torch.mm (torch._grouped_mm failed)"
                ms = _time_ms(run_loop, torch, 20)
            flops = 2 * groups * t * (h * 2 * f + f * h)
            tflops = flops / (ms * 1e-3) / 1e12
            doc["rows"].append(
                {
                    "tokens_per_expert": t,
                    "ms": round(ms, 4),
                    "tflops": round(tflops, 1),
                    "measured_efficiency": round(tflops / peak, 3),
                    "planner_efficiency": round(p["gemm_efficiency"] * expert_efficiency(t), 3),
                }
            )
        doc["ok"] = bool(doc["rows"])
    except BaseException as exc:  # noqa: BLE001
        doc["error"] = "".join(traceback.format_exception(exc))[-3000:]
    _write(out, doc)
    for r in doc["rows"]:
        print(
            f"T/expert {r['tokens_per_expert']:>5}: measured {r['tflops']:7.1f} TFLOP/s = "
            f"{r['measured_efficiency']:.3f} of peak; planner assumes {r['planner_efficiency']:.3f}"
        )
    return 0 if doc["ok"] else 1


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def step_summary(out_dir: str, steps_tsv: str | None = None) -> int:
    """One file: each step's exit code and seconds (steps.tsv), and the headline figures of each JSON."""
    out = Path(out_dir)
    steps = []
    tsv = Path(steps_tsv) if steps_tsv else out / "steps.tsv"
    if tsv.exists():
        for line in tsv.read_text().splitlines():
            name, rc, secs = (line.split("\t") + ["", ""])[:3]
            steps.append({"step": name, "rc": int(rc) if rc.lstrip("-").isdigit() else rc, "s": secs})
    doc: dict[str, Any] = {"steps": steps}
    imports = _load(out / "imports.json") or {}
    doc["imports_missing_required"] = imports.get("missing_required")
    doc["v4_backend_te_available"] = imports.get("v4_backend_te_available")
    argv = _load(out / "argv.json") or {}
    doc["argv_parser_verdict"] = argv.get("parser_verdict")
    doc["argv_verdict"] = argv.get("verdict", argv.get("error", "")[-500:] if argv else None)
    doc["predicted"] = argv.get("predicted")
    run = _load(out / "run_one.json") or {}
    keys = ("ok", "failure_class", "failure_detail", "step_p50_s", "predicted_step_s", "peak_memory_gb")
    doc["run_one"] = {k: run.get(k) for k in (*keys, "predicted_memory_gb")} if run else None
    gemm = _load(out / "gemm.json") or {}
    doc["gemm"] = {k: gemm.get(k) for k in ("device", "hbm", "kernel", "dense", "rows", "error")} if gemm else None
    _write(out / "summary.json", doc)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=("imports", "argv", "gemm", "summary"))
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=90.0)
    ap.add_argument("--steps", help="summary: the step log (name, rc, seconds per line); default OUT/steps.tsv")
    ap.add_argument("--smoke", action="store_true", help="gemm without CUDA: tiny shapes on CPU (no figures)")
    a = ap.parse_args(argv)
    if a.step == "imports":
        return step_imports(a.out)
    if a.step == "argv":
        return step_argv(a.out)
    if a.step == "gemm":
        return step_gemm(a.out, a.budget_s, a.smoke)
    return step_summary(a.out, a.steps)


if __name__ == "__main__":
    sys.exit(main())
