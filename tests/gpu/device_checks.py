"""The Python steps of tests/gpu/device.sh, each writing one JSON file: `imports`, `argv`, `gemm`, `moe`, `gpt`,
`te`, `summary`.

Why a script beside device.sh: each step must leave evidence even when the one before it failed, and say
beside every measured figure what the planner predicted for it. `imports` and `argv` also run on a machine
without a GPU (device.sh with DEVICE_DRY=1), so the one device run spends no time on what CPUs can prove.

    python tests/gpu/device_checks.py imports OUT/imports.json
    python tests/gpu/device_checks.py argv OUT/argv.json
    python tests/gpu/device_checks.py gemm OUT/gemm.json [--budget-s 90]
    python tests/gpu/device_checks.py moe OUT/moe.json [--budget-s 90]         (Tier A: one EP rank's MoELayer)
    python tests/gpu/device_checks.py gpt OUT/gpt.json --megatron MEG          (Tier A: GPT-MoE through the job chain)
    python tests/gpu/device_checks.py te OUT/te.json                           (Tier B: Transformer Engine imports)
    python tests/gpu/device_checks.py summary OUT [--steps steps.tsv]   (reads the step files)
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import subprocess
import sys
import time
import traceback
import typing
from collections.abc import Sequence
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


def _gpu1_argv(overrides: Sequence[str] = ()) -> tuple[list[str], Any]:
    """The gpu1 candidate's flags exactly as run-one builds them (tests/job/test_gpu_script.py composes the same)."""
    from orchestrator.commands.plan import megatron_flags
    from orchestrator.config import compose
    from orchestrator.plan import planner

    cfg = compose(["+stage=gpu1", "workload=megatron", "cluster=local", *overrides], require_stage=True).cfg
    kept = planner.plan(cfg.model, cfg.hardware, cfg.stage, workload=cfg.workload.name).candidates
    if not kept:
        raise SystemExit("error: the gpu1 stage planned no candidate")
    return megatron_flags(cfg, cfg.stage, kept[0]) + list(cfg.workload.extra_args or []), kept[0]


def step_argv(out: str, overrides: Sequence[str] = ()) -> int:
    """The gpu1 argv through the carried dev checkout's own parse_args + validate_args (+ the
    TransformerConfig where CUDA answers), via orchestrator.job.megatron_check; and the planner's figures."""
    doc: dict[str, Any] = {"step": "argv"}
    try:
        argv, planned = _gpu1_argv(overrides)
        doc["argv"], doc["overrides"] = argv, list(overrides)
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


# ------------------------------------------------------------------------------ Tier A: one EP rank's MoE
def moe_cases(limit: int = 8, smoke: bool = False) -> list[dict[str, Any]]:
    """The (EP, CP, micro-batch, S) of the planner's best layouts at 1k and 8k, distinct, best first: the EP
    ranks the search will most likely launch. Smoke (CPU): the tiny model on two short cases."""
    if smoke:
        return [
            {"stage": "smoke", "ep": 8, "cp": 2, "mbs": 1, "seq_length": 512},
            {"stage": "smoke", "ep": 32, "cp": 1, "mbs": 1, "seq_length": 256},
        ]
    from orchestrator.config import compose
    from orchestrator.plan import planner

    out: list[dict[str, Any]] = []
    for stage in ("1k", "8k"):
        cfg = compose([f"+stage={stage}"]).cfg
        seen = {(c["ep"], c["cp"], c["mbs"]) for c in out}
        for c in planner.plan(cfg.model, cfg.hardware, cfg.required_stage(), workload=cfg.workload.name).candidates:
            key = (c.layout.ep, c.layout.cp, c.layout.mbs)
            if key in seen:
                continue
            seen.add(key)
            out.append({"stage": stage, "ep": key[0], "cp": key[1], "mbs": key[2], "seq_length": cfg.stage.seq_length})
            if sum(1 for o in out if o["stage"] == stage) >= limit // 2:
                break
    return out


def emulation(model: Any, case: dict[str, Any]) -> dict[str, int]:
    """One EP rank on one GPU: its E/EP local experts receive exactly its tokens per expert, k T EP / E, when
    the layer routes T = b S / CP tokens top-k among E/EP experts (T_expert = k T / (E/EP)). Megatron routes
    top-k among at least k experts, so past EP = E/k (E/EP < k) the layer routes top-(E/EP) and gets
    T k / (E/EP) tokens instead: the same tokens per expert; the router and the shared expert then see that many."""
    e_local = model.num_experts // case["ep"]
    tokens = case["mbs"] * case["seq_length"] // case["cp"]
    k = min(model.moe_router_topk, e_local)
    layer_tokens = tokens * model.moe_router_topk // k
    return {
        "experts": e_local,
        "topk": k,
        "rank_tokens": tokens,
        "layer_tokens": layer_tokens,
        "tokens_per_expert": layer_tokens * k // e_local,
    }


def moe_planner_terms(model: Any, hw: Any, case: dict[str, Any], emu: dict[str, int]) -> dict[str, Any]:
    """What the planner says of this MoE layer on this rank, from its own formulas:
    saved activations: orchestrator/plan/memory.py block_activation_elems (the MoE tensors, the layer's input
    `mlp_norm`), BF16, per token; the expert tensors once as balanced routing gives them and once x the hot-rank
    skew stage_memory applies (moe.rank_skew); weights: E/EP experts x P_expert + shared + router, BF16;
    forward+backward: steptime.step_time's compute term for this layer, 3 x (router + shared FLOPs) /
    (peak x gemm_efficiency) + 3 x 2 k P_expert / (peak x gemm_efficiency x expert_efficiency(T_expert))."""
    from orchestrator.plan import memory, moe
    from orchestrator.plan.flops import peak_tflops
    from orchestrator.plan.params import p_expert
    from orchestrator.plan.steptime import expert_efficiency

    h, k, E = model.hidden_size, model.moe_router_topk, model.num_experts
    fs = model.moe_shared_expert_intermediate_size
    elems = memory.block_activation_elems(model, 0, True)
    expert = sum(v for n, v in elems.items() if n in memory.EXPERT_TENSORS)
    dense = elems["router"] + elems["shared"] + elems["mlp_norm"]
    dense_emulated = 2 * emu["experts"] + elems["shared"] + elems["mlp_norm"]  # the router scores E/EP experts
    t, lt = emu["rank_tokens"], emu["layer_tokens"]
    skew = moe.rank_skew(memory.DEFAULT_ROUTING_SIGMA, E, case["ep"], None)
    act = memory.ACT_BYTES / memory.GB
    peak = peak_tflops(hw, "bf16") * 1e12
    t_expert = moe.t_expert(k, moe.t_group(case["ep"], case["mbs"], case["seq_length"], case["cp"]), E)
    dense_flops = 2 * E * h + 2 * 3 * h * fs  # router + shared expert, forward, per token
    dense_flops_emulated = 2 * emu["experts"] * h + 2 * 3 * h * fs
    expert_flops = 2 * k * p_expert(model)
    eff = hw.gemm_efficiency
    return {
        "saved_activations_gb": t * (dense + expert) * act,
        "saved_activations_gb_with_skew": t * (dense + expert * skew) * act,
        "saved_activations_gb_as_emulated": (lt * dense_emulated + t * expert) * act,
        "hot_rank_skew": skew,
        "weights_gb": (emu["experts"] * p_expert(model) + 3 * h * fs + h * E) * memory.WEIGHT_BYTES / memory.GB,
        "tokens_per_expert": t_expert,
        "expert_efficiency": eff * expert_efficiency(t_expert),
        "forward_backward_ms": 1e3
        * (3 * t * dense_flops / (peak * eff) + 3 * t * expert_flops / (peak * eff * expert_efficiency(t_expert))),
        "forward_backward_ms_as_emulated": 1e3
        * (
            3 * lt * dense_flops_emulated / (peak * eff)
            + 3 * t * expert_flops / (peak * eff * expert_efficiency(t_expert))
        ),
    }


def _init_single_rank(torch: Any, cuda: bool, store: Path) -> None:
    """A one-rank process group and Megatron's parallel state (every size 1): the EP rank is emulated."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not cuda:  # Megatron asks for the current device; on CPU the answer is the CPU
        torch.cuda.current_device = lambda: "cpu"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{store}", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    if cuda:  # the RNG streams Megatron forks (forced balancing draws its logits in the expert-parallel one)
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(1234)


def _moe_layer(torch: Any, model: Any, emu: dict[str, int], cuda: bool) -> Any:
    """dev's MoELayer from the local spec (SequentialMLP experts, no Transformer Engine)."""
    import torch.nn.functional as F
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(
        num_layers=1,
        hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_moe_experts=emu["experts"],
        moe_router_topk=emu["topk"],
        moe_ffn_hidden_size=model.moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size=model.moe_shared_expert_intermediate_size,
        # alltoall at EP 1 is the local permutation; on CPU the allgather dispatcher (alltoall wants CUDA streams)
        moe_token_dispatcher_type="alltoall" if cuda else "allgather",
        # every expert gets exactly its share, T_expert as modelled (random logits from Megatron's CUDA RNG
        # tracker: on CPU the router's own scores, roughly balanced at random init)
        moe_router_force_load_balancing=cuda,
        moe_router_load_balancing_type="none",
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,
        moe_router_dtype="fp32",
        add_bias_linear=False,
        gated_linear_unit=True,
        activation_func=F.silu,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_cpu_initialization=not cuda,
    )
    layer = get_moe_module_spec(use_te=False, num_experts=emu["experts"], moe_grouped_gemm=False)(config=cfg)
    return layer.to(device="cuda" if cuda else "cpu", dtype=torch.bfloat16)


def _fwd_bwd(
    torch: Any, layer: Any, x: Any, saved: dict[int, int] | None = None, params: set[int] = frozenset()
) -> None:
    def pack(t: Any) -> Any:
        if saved is not None:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in params:
                saved[ptr] = t.untyped_storage().nbytes()
        return t

    layer.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
    y = out[0] if isinstance(out, tuple) else out
    y.float().sum().backward()


def measure_moe_case(torch: Any, model: Any, hw: Any, case: dict[str, Any], cuda: bool, reps: int) -> dict[str, Any]:
    """Build the rank's layer, run forward+backward: saved activations (bytes of every tensor autograd saved,
    once per storage, parameters excluded), allocator peak above the weights, time per forward+backward."""
    emu = emulation(model, case)
    row: dict[str, Any] = {**case, "emulation": emu, "planner": moe_planner_terms(model, hw, case, emu)}
    t0 = time.perf_counter()
    layer = _moe_layer(torch, model, emu, cuda)
    dev = "cuda" if cuda else "cpu"
    x = torch.randn(
        emu["layer_tokens"] // case["mbs"], case["mbs"], model.hidden_size, device=dev, dtype=torch.bfloat16
    )
    x.requires_grad_(True)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    row["weights_gb"] = sum(p.numel() * p.element_size() for p in layer.parameters()) / 1e9
    _fwd_bwd(torch, layer, x)  # warm-up: kernels, allocator
    saved: dict[int, int] = {}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    _fwd_bwd(torch, layer, x, saved, params)
    row["saved_activations_gb"] = sum(saved.values()) / 1e9
    if cuda:
        torch.cuda.synchronize()
        row["peak_above_weights_gb"] = (torch.cuda.max_memory_allocated() - base) / 1e9
        row["grads_gb"] = (
            sum(p.grad.numel() * p.grad.element_size() for p in layer.parameters() if p.grad is not None) / 1e9
        )
    row["forward_backward_ms"] = _time_ms(functools.partial(_fwd_bwd, torch, layer, x), torch, reps)
    row["s"] = round(time.perf_counter() - t0, 2)
    p = row["planner"]
    row["measured_over_planner"] = {
        "saved_activations": row["saved_activations_gb"] / p["saved_activations_gb_as_emulated"],
        "forward_backward": row["forward_backward_ms"] / p["forward_backward_ms_as_emulated"],
    }
    layer = x = None  # free this case's memory before the next is built
    if cuda:
        torch.cuda.empty_cache()
    return row


def step_moe(out: str, budget_s: float, smoke: bool = False, limit: int = 8) -> int:
    """dev's real MoELayer at V4-Pro expert shapes emulating one EP rank per case (`emulation`), beside the
    planner's terms for it (`moe_planner_terms`). Smoke (CPU): the tiny model, figures without meaning."""
    doc: dict[str, Any] = {"step": "moe", "ok": False, "rows": []}
    try:
        import torch

        from orchestrator.config import compose
        from orchestrator.job import megatron_check

        cuda = bool(torch.cuda.is_available())
        if not cuda and not smoke:
            doc["error"] = "no CUDA device: nothing measured"
            _write(out, doc)
            return 1
        megatron_check.import_megatron()
        cfg = compose(["+stage=smoke" if smoke else "+stage=1k"]).cfg
        doc["model"], doc["hardware"] = cfg.model.name, cfg.hardware.name
        doc["device"] = torch.cuda.get_device_name(0) if cuda else "cpu (smoke: the code path, no figures)"
        doc["megatron_core_file"] = getattr(sys.modules.get("megatron.core"), "__file__", None)
        _init_single_rank(torch, cuda, Path(out).with_suffix(".store"))
        t_start = time.perf_counter()
        for case in moe_cases(limit, smoke):
            if time.perf_counter() - t_start > budget_s:
                doc["stopped_early"] = f"budget {budget_s} s spent before {case}"
                break
            try:
                doc["rows"].append(measure_moe_case(torch, cfg.model, cfg.hardware, case, cuda, 3 if smoke else 10))
            except BaseException as exc:  # noqa: BLE001 - one case's failure is a finding, the next case runs
                doc["rows"].append({**case, "error": "".join(traceback.format_exception(exc))[-2000:]})
        doc["ok"] = bool(doc["rows"]) and not any("error" in r for r in doc["rows"])
    except BaseException as exc:  # noqa: BLE001
        doc["error"] = "".join(traceback.format_exception(exc))[-3000:]
    _write(out, doc)
    for r in doc["rows"]:
        if "error" in r:
            print(f"EP{r['ep']} CP{r['cp']} mbs{r['mbs']}: {r['error'].strip().splitlines()[-1]}")
            continue
        q = r["measured_over_planner"]
        print(
            f"EP{r['ep']} CP{r['cp']} mbs{r['mbs']} S{r['seq_length']}: "
            f"{r['emulation']['tokens_per_expert']} tokens/expert; "
            f"saved {r['saved_activations_gb']:.3f} GB = {q['saved_activations']:.2f} x planner; "
            f"fwd+bwd {r['forward_backward_ms']:.2f} ms = {q['forward_backward']:.2f} x planner"
        )
    return 0 if doc["ok"] else 1


# ---------------------------------------------------------------- Tier A: a GPT-MoE step through the job chain
GPT_LAYERS, GPT_EP, GPT_SEQ, GPT_GBS, GPT_VOCAB = 4, 64, 4096, 2, 32768  # the experts of one EP64 rank
GPT_HEADS = 56  # 7168 / 56 = 128: standard attention at V4-Pro's hidden size
UNFUSED = (  # what --transformer-impl local runs without TE, apex or fused kernels
    "--no-masked-softmax-fusion",
    "--no-bias-dropout-fusion",
    "--no-bias-swiglu-fusion",
    "--no-rope-fusion",
    "--no-gradient-accumulation-fusion",
    "--no-persist-layer-norm",
    "--attention-backend",
    "unfused",
)


CPU_ENTRY = (
    "import sys; from orchestrator.job import megatron_check; megatron_check.import_megatron(); "
    "from orchestrator.job.entry import main; sys.exit(main(sys.argv[1:]))"
)


def gpt_argv(model: Any, iters: int, smoke: bool = False) -> list[str]:
    """A 4-layer GPT-MoE at V4-Pro's hidden and expert shapes (6 local experts: one EP64 rank's), top-6,
    built by gpt_builders.py's local spec (gpt_builders.py:146-159 at dev d48bd6be0a85: no TE class), trained
    by pretrain_gpt.py on mock data with dev's torch AdamW fallback (megatron/core/optimizer/__init__.py:14-33)."""
    h = 64 if smoke else model.hidden_size
    f = 32 if smoke else model.moe_ffn_hidden_size
    a = [
        "--transformer-impl", "local", *UNFUSED,
        "--num-layers", str(GPT_LAYERS), "--hidden-size", str(h),
        "--num-attention-heads", str(4 if smoke else GPT_HEADS),
        "--ffn-hidden-size", str(4 * h), "--seq-length", str(GPT_SEQ), "--max-position-embeddings", str(GPT_SEQ),
        "--micro-batch-size", "1", "--global-batch-size", str(GPT_GBS), "--train-iters", str(iters),
        "--num-experts", str(model.num_experts // GPT_EP), "--moe-router-topk", str(model.moe_router_topk),
        "--moe-ffn-hidden-size", str(f), "--moe-shared-expert-intermediate-size", str(f),
        "--moe-token-dispatcher-type", "alltoall", "--moe-router-score-function", "sigmoid",
        "--moe-router-enable-expert-bias", "--moe-router-dtype", "fp32",
        "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-4",
        "--moe-router-force-load-balancing",
        "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear", "--position-embedding-type", "rope",
        "--untie-embeddings-and-output-weights", "--bf16",
        "--lr", "3.9e-6", "--min-lr", "3.9e-7", "--lr-decay-style", "cosine",
        "--weight-decay", "0.1", "--clip-grad", "1.0",
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(GPT_VOCAB),
        "--log-interval", "1", "--log-throughput", "--timing-log-level", "1",
        "--eval-iters", "0", "--eval-interval", "100000", "--use-distributed-optimizer", "--seed", "1234",
    ]  # fmt: skip
    return a


def gpt_spec(entry: Path, job_dir: Path, smoke: bool = False) -> Any:
    """The JobSpec of the GPT-MoE step: the gpu1 stage's window (3 + 5), one GPU, in-process Megatron."""
    import dataclasses

    from orchestrator.config import compose
    from orchestrator.core.spec import JobSpec
    from orchestrator.plan.layout import Layout

    cfg = compose(["+stage=gpu1", "workload=megatron", "cluster=local", "model=dsv4_pro"], require_stage=True).cfg
    stage = dataclasses.replace(
        cfg.required_stage(), seq_length=GPT_SEQ, global_batch=GPT_GBS, num_layers_override=None
    )
    iters = stage.warmup_iters + stage.measure_iters
    workload = dataclasses.replace(cfg.workload, command=["python", str(entry)], extra_args=[], in_process=True)
    lay = Layout(tp=1, pp=1, vpp=1, cp=1, ep=1, etp=1, mbs=1)
    return JobSpec(
        sweep="device",
        candidate_key="gpt-moe-local",
        attempt=1,
        layout=lay.to_dict(),
        model=cfg.model,
        stage=stage,
        hardware=cfg.hardware,
        workload=workload,
        argv=gpt_argv(cfg.model, iters, smoke),
        job_dir=str(job_dir),
        n_gpus=1,
        gpus_per_node=1,
    )


def step_gpt(out: str, megatron: str | None, entry: str | None, limit_s: float, smoke: bool = False) -> int:
    """The first real test of the job chain: Megatron's own parser and validator on the argv, then
    `python -m orchestrator.job.entry job.json` (entry.run_task -> megatron_run with the router hook, the
    measurement window, the sidecar), then orchestrator.evidence.collect on the folder (the log parser).
    Smoke (CPU): a stand-in entry script prints Megatron's lines (pretrain_gpt.py needs CUDA)."""
    from orchestrator.core.paths import JobPaths

    doc: dict[str, Any] = {"step": "gpt", "ok": False}
    try:
        entry_path = Path(entry) if entry else Path(megatron or "") / "pretrain_gpt.py"
        if not entry_path.is_file():
            raise SystemExit(f"error: no {entry_path}: carry megatron-dev.tar.gz with pretrain_gpt.py (docs/gpu.md)")
        job_dir = Path(out).parent / "gpt-job"
        if job_dir.exists():
            import shutil

            shutil.rmtree(job_dir)
        spec = gpt_spec(entry_path.resolve(), job_dir, smoke)
        spec.save(JobPaths(job_dir).spec)
        doc["argv"] = spec.argv
        from orchestrator.job import megatron_check

        doc["megatron_verdict"] = megatron_check.check_candidate(spec.argv, 1, transformer_config=False)
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "orchestrator.job.entry", str(JobPaths(job_dir).spec)]
        if smoke:  # CPU: megatron-core imports only with megatron_check's shims (no triton), before the router hook
            cmd[1:3] = ["-c", CPU_ENTRY]
        proc = subprocess.run(
            cmd,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=limit_s,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))},
        )
        doc["run_s"], doc["returncode"] = round(time.perf_counter() - t0, 1), proc.returncode
        doc["entry_stderr_tail"] = proc.stderr[-2000:]
        from orchestrator.evidence.collect import collect

        res = collect(job_dir, exit_code=proc.returncode)
        keys = ("ok", "failure_class", "failure_detail", "measure_iters", "step_p50_s", "tokens_per_s",
                "peak_allocated_gb", "peak_reserved_gb", "gpu_capacity_gb", "gpu_capacity_source",
                "simulated")  # fmt: skip
        doc["result"] = {k: getattr(res, k) for k in keys}
        sidecars = [json.loads(p.read_text()) for p in JobPaths(job_dir).sidecars()]
        kept = ("routed_tokens", "dropped_tokens", "window", "peak_reserved_mb", "gpu_total_memory_bytes",
                "instrument_error", "megatron_path")  # fmt: skip
        doc["sidecar"] = {k: sidecars[0].get(k) for k in kept} if sidecars else None
        # dropless, force-balanced routing: every measured iteration routes GBS x S tokens x top-k in each MoE layer
        expected = spec.stage.measure_iters * GPT_GBS * GPT_SEQ * spec.model.moe_router_topk * GPT_LAYERS
        doc["expected_routed_tokens"] = expected
        doc["checks"] = {
            "megatron_accepts_argv": doc["megatron_verdict"] is None,
            "measured_window": res.measure_iters == spec.stage.measure_iters,
            "sidecar_written": bool(sidecars),
            "router_counts_window": bool(sidecars) and sidecars[0].get("routed_tokens") == expected,
            "gpu_capacity_stated": res.gpu_capacity_gb is not None,
        }
        if smoke:  # the stand-in routes its own tokens, every iteration (no train_step drives the window)
            doc["checks"]["router_counts_window"] = bool(sidecars) and (sidecars[0].get("routed_tokens") or 0) > 0
            doc["checks"].pop("gpu_capacity_stated")  # a CPU has no device memory to state
        doc["ok"] = all(doc["checks"].values())
    except BaseException as exc:  # noqa: BLE001
        doc["error"] = "".join(traceback.format_exception(exc))[-3000:]
    _write(out, doc)
    return 0 if doc["ok"] else 1


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def step_te(out: str) -> int:
    """Tier B: does the installed Transformer Engine import with its torch extension, at the version the V4
    path needs (>= 2.13 for --moe-router-fusion with sqrtsoftplus, moe_utils.py:742-745), and which
    fast_hadamard_transform answers (the CUDA package or the torch stand-in)?"""
    doc: dict[str, Any] = {"step": "te", "ok": False}
    try:
        import transformer_engine  # noqa: F401 - the import is the check
        import transformer_engine.pytorch as te

        doc["transformer_engine"] = getattr(te, "__version__", None) or getattr(transformer_engine, "__version__", None)
        doc["file"] = getattr(te, "__file__", None)
        major, minor = (int(x) for x in str(doc["transformer_engine"]).split(".")[:2])
        doc["at_least_2_13"] = (major, minor) >= (2, 13)
    except BaseException as exc:  # noqa: BLE001
        doc["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    try:
        import fast_hadamard_transform as fht

        doc["fast_hadamard_transform"] = {"file": fht.__file__, "standin": bool(getattr(fht, "STANDIN", False))}
    except BaseException as exc:  # noqa: BLE001
        doc["fast_hadamard_transform"] = {"error": f"{type(exc).__name__}: {exc}"}
    doc["ok"] = bool(doc.get("at_least_2_13")) and "file" in doc["fast_hadamard_transform"]
    _write(out, doc)
    return 0 if doc["ok"] else 1


def _moe_summary(moe: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for r in moe.get("rows") or []:
        if "error" in r:
            out.append({k: r.get(k) for k in ("ep", "cp", "mbs", "seq_length")} | {"error": r["error"][-300:]})
            continue
        p = r["planner"]
        out.append(
            {
                **{k: r[k] for k in ("ep", "cp", "mbs", "seq_length")},
                "tokens_per_expert": r["emulation"]["tokens_per_expert"],
                "saved_activations_gb": [r["saved_activations_gb"], p["saved_activations_gb_as_emulated"]],
                "peak_above_weights_gb": [r.get("peak_above_weights_gb"), p["saved_activations_gb_as_emulated"]],
                "weights_gb": [r["weights_gb"], p["weights_gb"]],
                "forward_backward_ms": [r["forward_backward_ms"], p["forward_backward_ms_as_emulated"]],
            }
        )
    return out


def step_summary(out_dir: str, steps_tsv: str | None = None) -> int:
    """One file: each step's exit code and seconds (steps.tsv), and the headline figures of each JSON, every
    measured figure as [measured, predicted] beside the planner's prediction for it."""
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
    if run:
        doc["v4_step"] = {  # Tier B: [measured, the planner's prediction]
            "memory_gb": [run.get("peak_memory_gb"), run.get("predicted_memory_gb")],
            "step_s": [run.get("step_p50_s"), run.get("predicted_step_s")],
        }
    gemm = _load(out / "gemm.json") or {}
    doc["gemm"] = {k: gemm.get(k) for k in ("device", "hbm", "kernel", "dense", "rows", "error")} if gemm else None
    moe = _load(out / "moe.json")
    doc["moe"] = {"device": moe.get("device"), "rows": _moe_summary(moe), "error": moe.get("error")} if moe else None
    gpt = _load(out / "gpt.json")
    doc["gpt"] = {k: gpt.get(k) for k in ("ok", "checks", "result", "error")} if gpt else None
    te = _load(out / "te.json")
    doc["te"] = {k: te.get(k) for k in ("ok", "transformer_engine", "fast_hadamard_transform", "error")} if te else None
    _write(out / "summary.json", doc)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=("imports", "argv", "gemm", "moe", "gpt", "te", "summary"))
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=90.0)
    ap.add_argument("--steps", help="summary: the step log (name, rc, seconds per line); default OUT/steps.tsv")
    ap.add_argument("--smoke", action="store_true", help="without CUDA: tiny shapes on CPU (no figures)")
    ap.add_argument("--set", action="append", default=[], help="argv: a Hydra override (tier B's)")
    ap.add_argument("--megatron", help="gpt: the Megatron-LM checkout holding pretrain_gpt.py")
    ap.add_argument("--entry", help="gpt: the entry script instead (the dry run's CPU stand-in)")
    a = ap.parse_args(argv)
    if a.step == "imports":
        return step_imports(a.out)
    if a.step == "argv":
        return step_argv(a.out, a.set)
    if a.step == "gemm":
        return step_gemm(a.out, a.budget_s, a.smoke)
    if a.step == "moe":
        return step_moe(a.out, a.budget_s, a.smoke)
    if a.step == "gpt":
        return step_gpt(a.out, a.megatron, a.entry, a.budget_s, a.smoke)
    if a.step == "te":
        return step_te(a.out)
    return step_summary(a.out, a.steps)


if __name__ == "__main__":
    sys.exit(main())
