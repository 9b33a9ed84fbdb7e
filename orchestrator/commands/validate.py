"""`validate`: the planner against NVIDIA's published Megatron-Bridge measurements of MoE models.

Why: every other check of the step model is against arithmetic, Megatron's own counts or the twin. The rows
of conf/published/megatron_bridge.yaml are measured training steps of hand-tuned layouts on five GPU systems;
for each, this predicts tokens/s/GPU and model TFLOP/s/GPU of NVIDIA's layout under the table's routing
(force-balanced: routing_sigma 0; the 25.09 "tokendrop" rows with their capacity factor 1.0), and ranks that
layout among every legal layout of the same model, system, GPU count, GBS and sequence length (its rank is
unaffected by calibration: one factor per system scales every layout of a row alike).

Calibration, held out honestly: at most one efficiency factor per GPU system, the median of measured /
predicted over that system's rows of the fit releases (the file's fit_releases, 26.02 and 25.11); the
held-out releases (25.09, mostly token drop, and the dropless releases after 26.02, 26.02.01 to 26.08) are
predicted with those factors and never enter a fit (fit_factors reads fit rows only: tests/commands/
test_validate.py perturbs a held-out row and finds every factor unchanged). V4's rows (DeepSeek-V4-Flash, the hybrid
path the tool plans for) are held out always: load_rows refuses a file that puts one in a fit release, and the table
prints their median |error| on a line of its own, so what the GPT path's factors do to V4 is not averaged away.

Where the expert GEMM curve stands (steptime.expert_efficiency, docs/validate.md): every published row has
T_expert = k x EP x b x S / (CP x E) between 1,024 and 32,768 tokens per expert, where the planner's
0.55 T / (T + 256) is at 0.80-0.99 of its plateau and the H200 measurement (docs/measured/h200-2026-11-30.md)
is on its plateau. So the rows measure the plateau, the end-to-end efficiency the per-system factor scales,
and they say it is lower than the planner's 0.55 on every system (factors 0.50-0.86), not higher like the
kernel's 0.65-0.73 alone; the small-T shape, where the measured kernel saturates by T = 256 and the hyperbola
does not, lies below every row. What the two support together: keep gemm_efficiency an end-to-end factor (the
kernel's plateau is not it) and leave EXPERT_GEMM_HALF_TOKENS, which no published row can test; this command
changes neither.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config import CONF_DIR, compose
from orchestrator.core.errors import UserError
from orchestrator.core.knobs import optim_name
from orchestrator.core.schema import HardwareConfig, ModelConfig, RecipeConfig, SearchConfig, StageConfig
from orchestrator.plan.argv import DEFAULT_RECIPE
from orchestrator.plan.layout import Layout
from orchestrator.plan.params import is_v4
from orchestrator.plan.planner import Planned, Rejected, evaluate, plan

NAME = "validate"
HELP = "Predict NVIDIA's published Megatron-Bridge MoE measurements and rank NVIDIA's layouts among all legal ones."
PUBLISHED = CONF_DIR / "published" / "megatron_bridge.yaml"
FORCE_BALANCED = 0.0  # routing_sigma of the tables' force-balanced routing
TOP_PCT = 0.05  # the goal: NVIDIA's layout within the planner's top 5% of legal layouts
GOALS = {"median_uncalibrated": 0.10, "median_calibrated": 0.05, "worst": 0.25}
# The search space each row's rank is taken in: every value the tables use, and the neighbours a tuner would try.
TP = (1, 2, 4, 8)
PP = (1, 2, 4, 8, 16)
VPP = (1, 2, 4, 8)  # and the row's own (3, 12, 24 appear in the tables)
CP = (1,)  # every published MoE row runs CP1 at 4K-8K tokens; CP stays at the row's value
MBS = (1, 2, 4, 8)
DISPATCHERS = ("alltoall", "flex:deepep", "flex:hybridep")
# Megatron's --cuda-graph-impl values (megatron/core/transformer/transformer_config.py, cuda_graph_impl): what a row's
# recipe ran; the per-layer two capture cuda_graph_scope, full_iteration the whole forward-backward
CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine", "full_iteration")
PER_LAYER_GRAPHS = ("local", "transformer_engine")
RECOMPUTE = ((), ("moe_act",), ("layernorm", "moe_act"), ("full",))
MLA_RECOMPUTE = (("mla_up_proj",), ("mla_up_proj", "mlp"), ("mla_up_proj", "moe_act"))
# V4's own: Megatron dev's V4 recipes recompute the MLA up-projections, V4-Pro's the mHC too
# (examples/moe_recipes/deepseek_v4_{flash,pro}/*.yaml at d48bd6be0a85, recompute_modules)
V4_RECOMPUTE = (("mla_up_proj",), ("mhc", "mla_up_proj"))
FAMILY_RECOMPUTE = {"mla": MLA_RECOMPUTE, "dsv4_hybrid": V4_RECOMPUTE}


@dataclass(frozen=True)
class Row:
    """One published measurement (a row of conf/published/megatron_bridge.yaml)."""

    release: str
    line: int
    model: str
    system: str
    gpus: int
    precision: str
    gbs: int
    mbs: int
    seq: int
    tp: int
    pp: int
    cp: int
    vp: int
    ep: int
    tokens: float  # measured tokens/s/GPU
    tflops: float  # measured model TFLOP/s/GPU
    routing: str
    capacity_factor: float | None
    recompute: tuple[str, ...]
    dispatcher: str
    a2a_overlap: bool
    recipe: str
    held_out: bool
    source: str
    variant: str = "main"
    main_grads_dtype: str = "fp32"  # the model recipe's optimizer dtypes (the file's optimizer_dtypes)
    exp_avg_dtype: str = "fp32"
    grad_reduce_in_bf16: bool = False  # the recipe's BF16 grad buffer (the file's grad_reduce_in_bf16)
    file: str = ""  # the table's file in the source repository (the file's source.file when empty)
    # the recipe's CUDA graphs: "none", per-layer ("local", "transformer_engine": cuda_graph_scope names what is
    # captured, [] the whole layer) or "full_iteration" (one graph per forward-backward, no host launches)
    cuda_graph_impl: str = "none"
    cuda_graph_scope: tuple[str, ...] = ()
    notes: str = ""  # what the recipe sets that the row's columns do not say

    @property
    def full_graph(self) -> bool:
        """The row's step ran as one CUDA graph: no host wait per MoE layer (steptime.host_wait)."""
        return self.cuda_graph_impl == "full_iteration"

    def layout(self) -> Layout:
        name, _, backend = self.dispatcher.partition(":")
        return Layout(
            tp=self.tp,
            pp=self.pp,
            vpp=self.vp,
            cp=self.cp,
            ep=self.ep,
            etp=1,
            mbs=self.mbs,
            recompute=tuple(sorted(self.recompute)),
            dispatcher=name,
            flex_backend=backend or None,
            precision=self.precision,
            capacity_factor=self.capacity_factor,
            optim=optim_name(self.main_grads_dtype, self.exp_avg_dtype),
        )


def load_rows(path: Path = PUBLISHED) -> list[Row]:
    """The published rows, each with its source (file@commit:line) and whether its release is held out."""
    if not path.is_file():
        raise UserError(f"no published rows at {path}: restore conf/published/megatron_bridge.yaml from git")
    data = yaml.safe_load(path.read_text())
    src, held = data["source"], set(data["held_out_releases"])
    fit = set(data["fit_releases"])
    dtypes = data.get("optimizer_dtypes") or {}
    if held & fit:
        raise UserError(f"{path}: releases {sorted(held & fit)} are both fitted and held out")
    loose = sorted({r["release"] for r in data["rows"]} - held - fit)
    if loose:
        raise UserError(f"{path}: releases {loose} are neither fitted nor held out: add them to held_out_releases")
    rows = []
    for r in data["rows"]:
        kw = dict(r)
        kw["recompute"] = tuple(kw.get("recompute") or ())
        kw["cuda_graph_scope"] = tuple(kw.get("cuda_graph_scope") or ())
        if kw.get("cuda_graph_impl", "none") not in CUDA_GRAPH_IMPLS:
            raise UserError(
                f"{path}: line {kw.get('line')}: cuda_graph_impl {kw['cuda_graph_impl']!r} is not one of "
                f"{', '.join(CUDA_GRAPH_IMPLS)}: write the impl the row's recipe sets"
            )
        kw["held_out"] = kw["release"] in held
        if not kw["held_out"] and is_v4(_model(kw["model"])):
            raise UserError(
                f"{path}: line {kw.get('line')}: {kw['model']} is a V4 model in fit release {kw['release']}: V4 rows "
                "are held out (the per-system factors are fitted on the GPT path's rows and V4's are checked against "
                "them): move the row to a held-out release"
            )
        kw.update(dtypes.get(kw["model"], {}))
        kw.setdefault("grad_reduce_in_bf16", bool(data.get("grad_reduce_in_bf16", False)))
        kw["file"] = kw.get("file") or src["file"]
        kw["source"] = f"{src['repository']}/blob/{src['commit'][:12]}/{kw['file']}#L{kw['line']}"
        rows.append(Row(**kw))
    return rows


@cache
def _model(name: str) -> ModelConfig:
    return compose([f"model={name}"]).cfg.model


@cache
def _hardware(name: str) -> HardwareConfig:
    return compose([f"hardware={name}"]).cfg.hardware


def search_space(row: Row, model: ModelConfig) -> SearchConfig:
    """Every layout the row's rank is taken among: the module's knob lists, EP over the divisors of E up to N,
    the recompute sets of the model's family, and NVIDIA's own values (so its layout is in the space)."""
    ep = sorted({e for e in (1, 2, 4, 8, 16, 32, 64, 128, 256) if e <= row.gpus and model.num_experts % e == 0})
    recompute = list(RECOMPUTE) + list(FAMILY_RECOMPUTE.get(model.attention_variant, ()))
    recompute.append(tuple(sorted(row.recompute)))

    def plus(values: Iterable[Any], own: Any) -> list[Any]:
        out = list(dict.fromkeys([*values, own]))
        return [list(v) if isinstance(v, tuple) else v for v in out]

    return SearchConfig(
        tp=plus(TP, row.tp),
        pp=plus(PP, row.pp),
        vpp=plus(VPP, row.vp),
        cp=plus(CP, row.cp),
        ep=plus(ep, row.ep),
        etp=[1],
        mbs=plus(MBS, row.mbs),
        recompute=plus(recompute, tuple(sorted(row.recompute))),
        offload=[[]],
        dispatcher=plus(DISPATCHERS, row.dispatcher),
        capacity_factor=[row.capacity_factor],
        use_tp_pp_dp_mapping=[False],
    )


def row_stage(row: Row, model: ModelConfig, hw: HardwareConfig) -> StageConfig:
    """The stage a row ran: its N, GBS, sequence length and precision, the system's hosts, ordinary (BSHD)
    batches as Megatron-Bridge's mock data gives them, one step measured."""
    return StageConfig(
        name=f"published-{row.release}-{row.line}",
        gpus=row.gpus,
        gpus_per_node=hw.gpus_per_node,
        global_batch=row.gbs,
        seq_length=row.seq,
        warmup_iters=1,
        measure_iters=1,
        packed_sequences=False,
        search=search_space(row, model),
    )


def row_recipe(row: Row) -> RecipeConfig:
    """The training recipe's switches the row's performance recipe sets and the planner reads: EP all-to-all
    overlap (Megatron-Bridge's moe_a2a_overlap -> --overlap-moe-expert-parallel-comm), the optimizer's dtypes
    (the precision-aware optimizer's BF16 grads and moments: memory and grad sync) and the grad buffer's
    (ddp.grad_reduce_in_fp32 = False -> --grad-reduce-in-bf16: memory)."""
    return replace(
        DEFAULT_RECIPE,
        overlap_moe_expert_parallel_comm=row.a2a_overlap,
        grad_reduce_in_bf16=row.grad_reduce_in_bf16,
        optim=[row.layout().optim],  # the one optimizer precision the row's recipe declares
        precision=[row.precision],  # and the one compute precision it ran
    )


@dataclass
class Result:
    """What validate says about one row (uncalibrated; calibrate() fills the calibrated fields)."""

    row: Row
    layout: str
    predicted_tokens: float
    predicted_tflops: float
    flops_per_token: float  # model FLOPs per token as the planner counts them (3 x forward)
    memory_gb: float
    hbm_gb: float
    rank: int  # legal layouts predicted faster than NVIDIA's
    legal: int  # legal layouts (NVIDIA's included)
    rejected_by: list[str] = field(default_factory=list)  # rules NVIDIA's layout breaks (mem.exceeds_hbm ...)
    best: str = ""  # the planner's own top layout
    best_tokens: float = 0.0
    factor: float = 1.0
    components: dict[str, float] = field(default_factory=dict)

    @property
    def error(self) -> float:
        return self.predicted_tokens / self.row.tokens - 1.0

    @property
    def calibrated_tokens(self) -> float:
        return self.predicted_tokens * self.factor

    @property
    def calibrated_error(self) -> float:
        return self.calibrated_tokens / self.row.tokens - 1.0

    @property
    def rank_pct(self) -> float:
        return self.rank / self.legal if self.legal else 1.0

    def reason(self) -> str:
        """Why NVIDIA's layout is not in the planner's top 5% ('' when it is)."""
        if self.rank_pct <= TOP_PCT and not self.rejected_by:
            return ""
        if self.rejected_by:
            why = ", ".join(self.rejected_by)
            if "mem.exceeds_hbm" in self.rejected_by:
                why += f" (a memory prediction over HBM: {self.memory_gb:.0f} GB + margin > {self.hbm_gb:.0f} GB)"
            return f"a rule rejects it: {why}; by step time it ranks {self.rank}/{self.legal} ({self.rank_pct:.1%})"
        best = f"its best: {self.best}, {self.best_tokens:,.0f} tok/s/GPU"
        return f"the planner ranks {self.rank} legal layouts faster ({best})"

    def to_dict(self) -> dict[str, Any]:
        r = self.row
        return {
            "source": r.source,
            "release": r.release,
            "model": r.model,
            "system": r.system,
            "gpus": r.gpus,
            "precision": r.precision,
            "gbs": r.gbs,
            "seq_length": r.seq,
            "layout": self.layout,
            "recipe": r.recipe,
            "variant": r.variant,
            "measured_tokens_per_gpu": r.tokens,
            "predicted_tokens_per_gpu": round(self.predicted_tokens, 1),
            "error": round(self.error, 4),
            "calibrated_tokens_per_gpu": round(self.calibrated_tokens, 1),
            "calibrated_error": round(self.calibrated_error, 4),
            "factor": round(self.factor, 4),
            "measured_tflops_per_gpu": r.tflops,
            "predicted_tflops_per_gpu": round(self.predicted_tflops, 1),
            "published_flops_per_token": round(r.tflops * 1e12 / r.tokens, 0),
            "flops_per_token": round(self.flops_per_token, 0),
            "rank": self.rank,
            "legal_layouts": self.legal,
            "rank_pct": round(self.rank_pct, 4),
            "top_5pct": self.rank_pct <= TOP_PCT and not self.rejected_by,
            "reason": self.reason(),
            "memory_gb": round(self.memory_gb, 1),
            "hbm_gb": self.hbm_gb,
            "held_out": r.held_out,
            "cuda_graph_impl": r.cuda_graph_impl,
            "cuda_graph_scope": list(r.cuda_graph_scope),
            "components_s": {k: round(v, 4) for k, v in self.components.items()},
        }


def nvidias_layout(row: Row) -> Planned:
    """NVIDIA's layout of the row predicted under forced balance (memory not checked: the row ran it); a rule
    that rejects it is the table's or the planner's error, one line naming the row."""
    model, hw = _model(row.model), _hardware(row.system)
    lay = row.layout()
    own = evaluate(
        model, hw, row_stage(row, model, hw), lay, check_memory=False, routing_sigma=FORCE_BALANCED,
        recipe=row_recipe(row), full_graph=row.full_graph,
    )  # fmt: skip
    if isinstance(own, Rejected):
        raise UserError(f"{row.source}: NVIDIA's layout {lay.short()} breaks {', '.join(own.rule_ids)}")
    return own


def predict(row: Row) -> Result:
    """NVIDIA's layout predicted under forced balance, and its rank among every legal layout of the row."""
    model, hw = _model(row.model), _hardware(row.system)
    stage = row_stage(row, model, hw)
    lay = row.layout()
    recipe = row_recipe(row)
    own = nvidias_layout(row)
    mem_ok = own.prediction.feasible
    result = plan(model, hw, stage, routing_sigma=FORCE_BALANCED, recipe=recipe, full_graph=row.full_graph)
    times = [p.prediction.step_time_s for p in result.candidates if p.layout != lay]
    t = own.prediction.step_time_s
    best: Planned | None = result.candidates[0] if result.candidates else None
    p = own.prediction
    tokens = p.tokens_per_s / row.gpus
    return Result(
        row=row,
        layout=lay.short(),
        predicted_tokens=tokens,
        predicted_tflops=p.flops_per_step / p.step_time_s / row.gpus / 1e12,
        flops_per_token=p.flops_per_step / (row.gbs * row.seq),
        memory_gb=p.memory_gb,
        hbm_gb=hw.hbm_gb,
        rank=sum(1 for x in times if x < t),
        legal=len(times) + 1,
        rejected_by=[] if mem_ok else ["mem.exceeds_hbm"],
        best=best.layout.short() if best else "",
        best_tokens=(best.prediction.tokens_per_s / row.gpus) if best else 0.0,
        components=dict(p.step_components),
    )


def fit_factors(results: Sequence[Result]) -> dict[str, float]:
    """One efficiency factor per system: the median of measured / predicted tokens over that system's rows of
    the fit releases. Held-out rows are never read."""
    ratios: dict[str, list[float]] = {}
    for r in results:
        if not r.row.held_out:
            ratios.setdefault(r.row.system, []).append(r.row.tokens / r.predicted_tokens)
    return {system: statistics.median(v) for system, v in sorted(ratios.items())}


def step_bias(ratios: Sequence[float]) -> tuple[float, float]:
    """(geometric mean, log-sd) of measured / predicted step over fit rows: the planner's known error, what the
    whole sweep's price draws its step level from (stage.budget.price_step_bias, price_step_sd)."""
    logs = [math.log(x) for x in ratios]
    if not logs:  # no fit row: nothing known, the planner's own step
        return 1.0, 0.0
    return math.exp(statistics.mean(logs)), statistics.stdev(logs) if len(logs) > 1 else 0.0


def fit_step_ratios(rows: Sequence[Row] | None = None) -> list[float]:
    """Measured / predicted step of NVIDIA's layout on each fit row (predicted / measured tokens), from its own
    evaluation alone (no rank: seconds, not minutes). Held-out rows are never read."""
    out = []
    for row in load_rows() if rows is None else rows:
        if row.held_out:
            continue
        out.append(nvidias_layout(row).prediction.tokens_per_s / row.gpus / row.tokens)
    return out


def calibrate(results: Sequence[Result]) -> dict[str, float]:
    factors = fit_factors(results)
    for r in results:
        r.factor = factors.get(r.row.system, 1.0)
    return factors


@dataclass(frozen=True)
class Summary:
    """The goal's figures, over every row and over the held-out ones."""

    rows: int
    median_abs: float
    median_abs_calibrated: float
    held_out_median_abs: float
    held_out_median_abs_calibrated: float
    worst_abs_calibrated: float
    worst_row: str
    worst_abs: float  # uncalibrated
    in_top: int  # rows whose layout is legal and in the top 5%
    in_top_by_time: int  # rows whose layout is in the top 5% by predicted step time (memory rule aside)
    factors: Mapping[str, float]

    def goals(self) -> dict[str, bool]:
        return {
            "median |error| <= 10% uncalibrated": self.median_abs <= GOALS["median_uncalibrated"]
            and self.held_out_median_abs <= GOALS["median_uncalibrated"],
            "median |error| <= 5% calibrated": self.median_abs_calibrated <= GOALS["median_calibrated"]
            and self.held_out_median_abs_calibrated <= GOALS["median_calibrated"],
            "no row off by more than 25% (calibrated)": self.worst_abs_calibrated <= GOALS["worst"],
            "NVIDIA's layout in the top 5% on every row": self.in_top == self.rows,
        }


def median_errors(results: Sequence[Result]) -> tuple[float, float]:
    """(median |error| uncalibrated, calibrated) of a set of rows; NaN for none."""
    if not results:
        return float("nan"), float("nan")
    return (
        statistics.median(abs(r.error) for r in results),
        statistics.median(abs(r.calibrated_error) for r in results),
    )


def summarise(results: Sequence[Result], factors: Mapping[str, float]) -> Summary:
    held = [r for r in results if r.row.held_out]
    worst = max(results, key=lambda r: abs(r.calibrated_error))
    (all_u, all_c), (held_u, held_c) = median_errors(results), median_errors(held)
    return Summary(
        rows=len(results),
        median_abs=all_u,
        median_abs_calibrated=all_c,
        held_out_median_abs=held_u,
        held_out_median_abs_calibrated=held_c,
        worst_abs_calibrated=abs(worst.calibrated_error),
        worst_row=f"{worst.row.release} {worst.row.model} {worst.row.system} (line {worst.row.line})",
        worst_abs=max(abs(r.error) for r in results),
        in_top=sum(1 for r in results if not r.reason()),
        in_top_by_time=sum(1 for r in results if r.rank_pct <= TOP_PCT),
        factors=dict(factors),
    )


def held_out_by_release(results: Sequence[Result]) -> dict[str, tuple[int, float, float]]:
    """Per held-out release: its rows and their median |error| uncalibrated and calibrated (25.09 runs token
    drop, the releases after 26.02 run dropless, most from 26.06 on with full-iteration CUDA graphs: apart,
    what each set says is not averaged away)."""
    by: dict[str, list[Result]] = {}
    for r in results:
        if r.row.held_out:
            by.setdefault(r.row.release, []).append(r)
    return {rel: (len(rs), *median_errors(rs)) for rel, rs in sorted(by.items())}


def is_v4_row(r: Result) -> bool:
    """A row of V4's family (DeepSeek-V4-Flash): the V4 hybrid path the tool plans for."""
    return is_v4(_model(r.row.model))


def held_out_v4(results: Sequence[Result]) -> tuple[int, float, float]:
    """The held-out V4 rows (load_rows refuses a V4 row in a fit release): their count and median |error|
    uncalibrated and calibrated, apart from the GPT-path rows whose factors they are predicted with."""
    v4 = [r for r in results if r.row.held_out and is_v4_row(r)]
    return (len(v4), *median_errors(v4))


def validate(rows: Sequence[Row] | None = None) -> tuple[list[Result], Summary]:
    """Predict, rank and calibrate every published row."""
    results = [predict(r) for r in (load_rows() if rows is None else rows)]
    factors = calibrate(results)
    return results, summarise(results, factors)


def table(results: Sequence[Result], summary: Summary) -> str:
    """The table `validate` and `make bench` print, and its summary."""
    head = (
        f"{'rel':5} {'model':15} {'sys':5} {'N':>4} {'prec':6} {'layout':44} {'meas':>7} {'pred':>7} {'err':>6} "
        f"{'cal':>6} {'TF meas':>7} {'TF pred':>7} {'rank':>10} {'':2}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.row.release:5} {r.row.model:15} {r.row.system:5} {r.row.gpus:>4} {r.row.precision:6} "
            f"{r.layout[:44]:44} "
            f"{r.row.tokens:>7,.0f} {r.predicted_tokens:>7,.0f} {r.error:>+6.0%} {r.calibrated_error:>+6.0%} "
            f"{r.row.tflops:>7,.0f} {r.predicted_tflops:>7,.0f} {r.rank:>4}/{r.legal:<5} "
            f"{'H' if r.row.held_out else ''}{'' if not r.reason() else '*'}"
        )
    lines.append("H: held out (never fitted); *: NVIDIA's layout not in the planner's top 5% (reasons below)")
    for r in results:
        if r.reason():
            lines.append(f"  * {r.row.release} {r.row.model} {r.row.system} line {r.row.line}: {r.reason()}")
    s = summary
    v4_n, v4_u, v4_c = held_out_v4(results)
    lines += [
        f"per-system factors (fit on {', '.join(sorted({r.row.release for r in results if not r.row.held_out}))}): "
        + ", ".join(f"{k} {v:.3f}" for k, v in s.factors.items()),
        "the planner's step on the fit rows, measured / predicted (the price's stage.budget.price_step_bias and "
        "price_step_sd): geometric mean {:.2f}, log-sd {:.2f}".format(
            *step_bias([r.predicted_tokens / r.row.tokens for r in results if not r.row.held_out])
        ),
        f"median |error| uncalibrated: all {s.median_abs:.1%}, held out {s.held_out_median_abs:.1%}; "
        f"calibrated: all {s.median_abs_calibrated:.1%}, held out {s.held_out_median_abs_calibrated:.1%}",
        "held out by release, median |error| uncalibrated / calibrated: "
        + ", ".join(f"{rel} ({n} rows) {u:.1%} / {c:.1%}" for rel, (n, u, c) in held_out_by_release(results).items()),
        f"held out, V4 rows ({v4_n}): median |error| uncalibrated / calibrated: "
        + (f"{v4_u:.1%} / {v4_c:.1%}" if v4_n else "none"),
        f"worst row: calibrated {s.worst_abs_calibrated:.1%} ({s.worst_row}), uncalibrated {s.worst_abs:.1%}",
        f"NVIDIA's layout legal and in the planner's top 5%: {s.in_top}/{s.rows} rows; in the top 5% by predicted "
        f"step time (the memory rule aside): {s.in_top_by_time}/{s.rows}",
    ]
    lines += [f"goal: {name} -> {'met' if ok else 'MISSED'}" for name, ok in s.goals().items()]
    return "\n".join(lines)


def features(r: Result) -> dict[str, str]:
    """What distinguishes one row from another, for grouping the errors (`validate --format groups`)."""
    row, model = r.row, _model(r.row.model)
    t_expert = model.moe_router_topk * row.ep * row.mbs * row.seq / (row.cp * model.num_experts)
    return {
        "system": row.system,
        "host": "grace" if row.system.startswith("gb") else "x86",
        "model": row.model.removesuffix("_nomtp"),
        "precision": "bf16" if row.precision == "bf16" else "fp8",
        "dispatcher": row.dispatcher,
        "a2a_overlap": str(row.a2a_overlap),
        "TP": str(row.tp),
        "EP": str(row.ep),
        "PP": str(row.pp),
        "VP>1": str(row.vp > 1),
        "MBS": str(row.mbs),
        "T_expert": "<=2048" if t_expert <= 2048 else ("<=8192" if t_expert <= 8192 else ">8192"),
        "release": row.release,
        "cuda_graphs": "per-layer" if row.cuda_graph_impl in PER_LAYER_GRAPHS else row.cuda_graph_impl,
    }


def groups(results: Sequence[Result]) -> str:
    """The median signed error (uncalibrated, and calibrated) of the rows sharing each feature value: where the
    step model's error has structure a per-system factor cannot carry."""
    by: dict[str, dict[str, list[Result]]] = {}
    for r in results:
        for k, v in features(r).items():
            by.setdefault(k, {}).setdefault(v, []).append(r)
    lines = [f"{'feature':12} value: rows, median error uncalibrated / calibrated"]
    for k, vals in by.items():
        cells = [
            f"{v}: {len(rs)}, {statistics.median(x.error for x in rs):+.0%} / "
            f"{statistics.median(x.calibrated_error for x in rs):+.0%}"
            for v, rs in sorted(vals.items())
        ]
        lines.append(f"{k:12} " + " | ".join(cells))
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--format", choices=["table", "json", "groups"], default="table")
    parser.add_argument("--release", action="append", default=[], help="only these releases (repeatable)")
    parser.add_argument("--model", action="append", default=[], help="only these models (repeatable)")


def run(args, overrides: list[str]) -> int:
    if overrides:
        raise UserError(
            f"validate takes no config overrides ({' '.join(overrides)}): each row names its model and system"
        )
    rows = load_rows()
    if args.release or args.model:
        rows = [
            r
            for r in rows
            if (not args.release or r.release in args.release) and (not args.model or r.model in args.model)
        ]
        if not rows:
            raise UserError("no published row matches --release/--model (see conf/published/megatron_bridge.yaml)")
    results, summary = validate(rows)
    if args.format == "json":
        for r in results:
            sys.stdout.write(json.dumps(r.to_dict(), sort_keys=True) + "\n")
    elif args.format == "groups":
        print(groups(results))
    else:
        print(table(results, summary))
    return 0
