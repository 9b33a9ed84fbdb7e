"""`plan`: list a stage's legal layouts ranked by predicted step time, or the flags of one of them.

The numbers are the analytic models' estimates (orchestrator/plan), not measurements; the header
says so. `--show-rejected` explains every rejection with the rule ids of orchestrator/plan/rules.py.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections import Counter
from typing import Any

from orchestrator import runspec
from orchestrator.config import compose, stage_or_error
from orchestrator.core import knobs
from orchestrator.core.errors import UserError
from orchestrator.plan import rules as R
from orchestrator.plan.layout import Layout
from orchestrator.plan.planner import Planned, PlanResult, Rejected, plan
from orchestrator.plan.space import knob_values

NAME = "plan"
HELP = "Rank a stage's legal parallel layouts by predicted step time (analytic estimates)."
NOTE = "predictions are analytic estimates (orchestrator/plan models), not measurements"
PREDICTION_COLUMNS = [
    "D_a",
    "D_e",
    "m",
    "bubble",
    "T_group",
    "T_expert",
    "ep_nodes",
    "routed_weight_gb",
    "heaviest_stage",
    "memory_gb",
    "step_time_s",
    "mfu",
    "layer_pattern",
]
# A narrow terminal keeps the layout first (TP/PP/CP/EP, the knobs the rows differ in), then the predicted step, the
# knobs every row shares, and memory.
LAYOUT_FIRST = ("tp", "pp", "cp", "ep")
PRIORITY = ("step_time_s", "memory_gb", "mfu", "bubble", "m")
TABLE_COLUMNS = ["candidate", *knobs.columns(), *PREDICTION_COLUMNS]  # the table adds knobs the stage varies
PATTERN_WIDTH = 28
TEXT = {k.column for k in knobs.DISPLAYED if k.sql == "str"} | {"layer_pattern"}
FLOAT_FORMATS = {"bubble": ".3f", "routed_weight_gb": ".2f", "memory_gb": ".1f", "step_time_s": ".3f", "mfu": ".3f"}


def add_arguments(parser) -> None:
    parser.add_argument("--format", choices=["table", "json", "csv"], default="table")
    parser.add_argument(
        "--show-rejected",
        action="store_true",
        help="also list rejected layouts with their rule ids and reasons (json: compact)",
    )
    parser.add_argument(
        "--top",
        type=int,
        default=None,
        metavar="N",
        help="show the N best candidates (table default 20, json/csv default all)",
    )
    parser.add_argument(
        "--argv",
        type=int,
        default=None,
        metavar="INDEX",
        help="print the exact Megatron flags of candidate INDEX (the `candidate` column: 0 = the predicted "
        "best; the same index as `run-one --candidate`) and exit",
    )


def row(index: int, p: Planned) -> dict[str, Any]:
    """One candidate as a flat record with the model's names (json/csv/table share it).

    `candidate` is its index in the planner's order, 0 = the predicted best, as `run-one --candidate` and
    `plan --argv` count ("rank" is kept for GPU ranks)."""
    lay, pr = p.layout, p.prediction
    return {
        "candidate": index,
        "key": p.key,
        **knobs.display(lay),
        "D_a": pr.d_a,
        "D_e": pr.d_e,
        "m": pr.m,
        "bubble": round(pr.bubble, 4),
        "T_group": pr.t_group,
        "T_expert": pr.t_expert,
        "experts_per_rank": pr.experts_per_rank,
        "ep_nodes": pr.ep_nodes,
        "cp_nodes": pr.cp_nodes,
        "routed_weight_gb": round(pr.routed_weight_gb, 3),
        "heaviest_stage": pr.heaviest_stage,
        "memory_gb": round(pr.memory_gb, 2),
        "memory_by_stage": [round(x, 2) for x in pr.memory_by_stage],
        "feasible": pr.feasible,
        "step_time_s": round(pr.step_time_s, 4),
        "step_components": {k: round(v, 4) for k, v in pr.step_components.items()},
        "mfu": round(pr.mfu, 4),
        "tokens_per_s": round(pr.tokens_per_s, 1),
        "flops_per_step": pr.flops_per_step,
        "recompute_flops_per_step": pr.recompute_flops_per_step,
        "layer_pattern": pr.layer_pattern,
    }


LAYOUT_FIELDS = tuple(Layout.__dataclass_fields__)


def layout_dict(lay: Layout) -> dict[str, Any]:
    """Layout.to_dict() without dataclasses.asdict's deep copy (16k stages reject ~85k layouts)."""
    d = {f: getattr(lay, f) for f in LAYOUT_FIELDS}
    for f in knobs.SETS:
        d[f] = list(d[f])
    return d


def rejected_row(r: Rejected) -> dict[str, Any]:
    return {
        "layout": layout_dict(r.layout),
        "rules": r.rule_ids,
        "reasons": [_reason(x) for x in r.rules],
        "memory_gb": r.memory_gb,
    }


def _reason(rule: R.Rule, _cache: dict[str, str] = {}) -> str:  # noqa: B006 - a deliberate memo
    if rule.id not in _cache:
        _cache[rule.id] = f"{rule.id}: {rule.reason} [{rule.source}]"
    return _cache[rule.id]


def megatron_flags(cfg, stage, p: Planned) -> list[str]:
    """The candidate's Megatron flags (orchestrator.plan.argv), as a job of this stage would get them."""
    return runspec.layout_flags(cfg, stage, p.layout, p.prediction.layer_pattern)


def _header(cfg, stage, res: PlanResult) -> str:
    head = (
        f"# plan {stage.name}: N={stage.gpus} B={stage.global_batch} S={stage.seq_length} model={cfg.model.name} "
        f"hardware={cfg.hardware.name}; {res.raw_count} raw layouts, {len(res.candidates)} legal and feasible "
        f"({res.elapsed_s:.2f} s). Note: {NOTE}."
    )
    return "\n".join([head, *(f"# {line}" for line in R.lift_notes(stage))])


def _table(cfg, stage, res: PlanResult, top: int, show_rejected: bool) -> None:
    from rich.table import Table

    from orchestrator.commands._shared import console as make_console
    from orchestrator.commands._shared import fitted, left_out_note

    console = make_console()  # the terminal's width (a pipe: whole rows)
    console.print(_header(cfg, stage, res), markup=False, highlight=False)
    # a knob that is not always shown gets a column when the stage searches several values of it
    varying = [k for k, values in knob_values(stage.search, cfg.workload.recipe).items() if len(values) > 1]
    knob_cols = knobs.columns(varying)
    columns = ["candidate", *knob_cols, *PREDICTION_COLUMNS]
    groups = grouped(res.candidates, top, knob_cols)

    def build(shown: list[str]) -> Table:
        table = Table(show_lines=False)
        for col in shown:
            table.add_column(col, no_wrap=True, min_width=len(col), justify="left" if col in TEXT else "right")
        for cells in groups:
            table.add_row(*(cells[c] for c in shown))
        return table

    # the knobs that tell the rows shown apart come before the step; a knob every row shares comes after it
    apart = [c for c in knob_cols if len({cells[c] for cells in groups}) > 1]
    order = ["candidate", *LAYOUT_FIRST, *apart, PRIORITY[0], *knob_cols, *PRIORITY]
    table, left = fitted(columns, list(dict.fromkeys(order)), console.width, build)
    console.print(table)
    if left:
        console.print(left_out_note(left, console.width), highlight=False)
    if any("," in g["candidate"] for g in groups):
        console.print(
            "rows with identical predictions are one row (the knobs they differ in are counted): "
            "`plan --argv N` takes any candidate listed",
            highlight=False,
        )
    if show_rejected:
        counts = Counter(rid for r in res.rejected for rid in r.rule_ids)
        legend = Table(title=f"{len(res.rejected)} rejected layouts, by rule (a layout may break several)")
        for col in ("rule", "layouts", "reason", "source"):
            legend.add_column(col, overflow="fold")
        for rid, n in counts.most_common():
            rule = R.BY_ID[rid]
            legend.add_row(rid, str(n), rule.reason, rule.source)
        console.print(legend)
        detail = Table(title=f"first {min(top, len(res.rejected))} rejected layouts")
        detail.add_column("layout")
        detail.add_column("rules", overflow="fold")
        for r in res.rejected[:top]:
            detail.add_row(r.layout.short(), ", ".join(r.rule_ids))
        console.print(detail)


def _cells(i: int, p: Planned, knob_cols: list[str]) -> dict[str, str]:
    d = row(i, p)
    for col in knob_cols:
        d[col] = knobs.text(d[col])
    pat = d["layer_pattern"]
    d["layer_pattern"] = pat if len(pat) <= PATTERN_WIDTH else pat[: PATTERN_WIDTH - 1] + "…"
    d["T_expert"] = f"{d['T_expert']:g}"
    for col, fmt in FLOAT_FORMATS.items():
        d[col] = format(d[col], fmt)
    return {k: str(v) for k, v in d.items()}


def grouped(candidates: list[Planned], top: int, knob_cols: list[str]) -> list[dict[str, str]]:
    """The table's first `top` rows, neighbours with identical predictions as one row: the models cannot tell
    them apart (a dispatcher pair often), so they are one choice to the reader. Its candidate cell lists every
    index; a knob they differ in says how many values ("2 dispatchers")."""
    out: list[dict[str, str]] = []
    members: list[list[dict[str, str]]] = []
    for i, p in enumerate(candidates):
        cells = _cells(i, p, knob_cols)
        if members and all(cells[c] == members[-1][0][c] for c in PREDICTION_COLUMNS):
            members[-1].append(cells)
            continue
        if len(members) == top:
            break
        members.append([cells])
    for group in members:
        first = dict(group[0])
        if len(group) > 1:
            first["candidate"] = ",".join(g["candidate"] for g in group)
            for col in knob_cols:
                values = {g[col] for g in group}
                if len(values) > 1:
                    first[col] = f"{len(values)} {col}s"
        out.append(first)
    return out


def _csv(res: PlanResult, top: int | None) -> str:
    buf = io.StringIO()
    rows = [row(i, p) for i, p in enumerate(res.candidates[:top])]
    fields = list(rows[0]) if rows else TABLE_COLUMNS  # a header even when nothing is legal
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for d in rows:
        for k, v in d.items():
            if isinstance(v, list):
                d[k] = "+".join(map(str, v))
            elif isinstance(v, dict):
                d[k] = json.dumps(v, sort_keys=True)
        writer.writerow(d)
    return buf.getvalue()


def run(args, overrides) -> int:
    composed = compose(overrides, require_stage=True, command=NAME)
    cfg = composed.cfg
    stage = stage_or_error(composed)
    if args.top is not None and args.top < 0:
        raise UserError(f"--top {args.top}: must be >= 0")
    res = plan(cfg.model, cfg.hardware, stage, workload=cfg.workload.name, recipe=cfg.workload.recipe)
    if not res.candidates and not args.show_rejected:
        raise UserError(res.why_empty(stage))
    if args.argv is not None:
        n = len(res.candidates)
        if not 0 <= args.argv < n:
            raise UserError(
                f"--argv {args.argv}: no such candidate; stage {stage.name} has {n} legal candidates "
                f"(indices 0..{n - 1}; see `python -m orchestrator plan +stage={stage.name}`)"
            )
        print(runspec.format_argv(megatron_flags(cfg, stage, res.candidates[args.argv])))
        return 0
    if args.format == "table":
        _table(cfg, stage, res, 20 if args.top is None else args.top, args.show_rejected)
    elif args.format == "csv":
        sys.stdout.write(_csv(res, args.top))
    else:
        out: dict[str, Any] = {
            "note": NOTE,
            "stage": stage.name,
            "model": cfg.model.name,
            "hardware": cfg.hardware.name,
            "gpus": stage.gpus,
            "global_batch": stage.global_batch,
            "seq_length": stage.seq_length,
            "raw_count": res.raw_count,
            "legal_count": len(res.candidates),
            "lifted_rules": list(stage.lifted_rules),
            "rule_notes": R.lift_notes(stage),
            "elapsed_s": round(res.elapsed_s, 4),
            "candidates": [row(i, p) for i, p in enumerate(res.candidates[: args.top])],
        }
        if args.show_rejected:
            out["rejected"] = [rejected_row(r) for r in res.rejected]
        # with every rejected layout the output is large: compact (pipe it through jq to read it)
        sys.stdout.write(json.dumps(out, indent=None if args.show_rejected else 1) + "\n")
    if not res.candidates:  # --show-rejected printed the reasons; still a failure
        print(f"error: {res.why_empty(stage)}", file=sys.stderr)
        return 2
    return 0
