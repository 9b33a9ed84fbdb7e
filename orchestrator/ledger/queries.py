"""The one query module behind `compare`, `best`, exports and the budget spent. Filters, sorts and limits are built
from a fixed registry of columns (COLUMNS); user values are always bound parameters, and a key that
is not in the registry is refused with the list of valid keys. No SQL text is ever built by hand.

The joined row: sweep + candidate + its latest attempt + its latest successful result.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    Integer,
    Select,
    and_,
    case,
    exists,
    func,
    not_,
    or_,
    select,
    true,
)
from sqlalchemy.orm import QueryableAttribute, aliased
from sqlalchemy.sql.elements import ColumnElement

from orchestrator.core.decision import NO_DECISION, Decision
from orchestrator.core.knobs import FIELDS, KNOB, KNOBS
from orchestrator.core.metrics import ALIASES as METRIC_ALIASES
from orchestrator.core.metrics import HIGHER_IS_BETTER as METRIC_HIGHER
from orchestrator.core.metrics import METRICS, SCALARS, STEP_MEAN, STEP_P50
from orchestrator.core.ranking import RULE, Standing
from orchestrator.core.ranking import best as ranked_best
from orchestrator.core.ranking import standing as standing_of
from orchestrator.core.states import AttemptRole, CandidateStatus, Fidelity
from orchestrator.ledger import models as m
from orchestrator.ledger.convert import decode, measured
from orchestrator.ledger.errors import LedgerError
from orchestrator.ledger.models import RESULT_METRICS

if TYPE_CHECKING:
    from orchestrator.ledger.ledger import Ledger

# A registry entry: a mapped attribute (m.Candidate.tp) or an expression over them (the joined dispatcher).
Column = ColumnElement[Any] | QueryableAttribute[Any]
AnySelect = Select[*tuple[Any, ...]]


def _knob_columns() -> dict[str, Column]:
    """One key per knob of the registry, on its ledger column. A knob with parts (the dispatcher, stored as
    dispatcher + backend) is shown and filtered joined, "flex:deepep"; each part keeps its own key too."""
    out: dict[str, Column] = {k.column: getattr(m.Candidate, k.column) for k in KNOBS}
    for name, fields in FIELDS.items():
        joined = out[KNOB[name].column]
        for part in fields[1:]:  # a part that is NULL (no flex backend) is left out
            joined = func.coalesce(joined + ":" + out[KNOB[part].column], joined)
        out[KNOB[name].column] = joined
    return out


KNOB_COLUMNS = _knob_columns()


def excluded() -> ColumnElement[bool]:
    """A candidate that failed the correctness gate: its status says so, or one of its parity checks failed."""
    failing_parity = exists().where(m.Parity.candidate_id == m.Candidate.id, not_(m.Parity.passed))
    return or_(m.Candidate.status == CandidateStatus.EXCLUDED, failing_parity)


# The attempt that produced the candidate's latest result: its fidelity is the figures' (the latest attempt may be a
# later launch at another fidelity, e.g. the full-window run that OOMed after a fit probe measured).
MEASURING = aliased(m.Attempt, name="measuring")
FIDELITY = func.coalesce(MEASURING.fidelity, m.Attempt.fidelity)


class Measured:
    """What a row's figures are, the `measured` column: only FULL ones are full-window measurements a best may be
    decided on (orchestrator.core.ranking's rule); the rest are marked and, in `compare`, sorted after them."""

    FULL = "full"  # a complete full-window result that passed the correctness gate
    PARTIAL = "partial"  # the job stopped before its window ended
    SCREEN = "screen-only"  # a short window ranks contenders; never a best
    PROBE = "probe-only"  # a fit probe: start-up and a few iterations (one GPU's compute-only step)
    FAILED = "failed"  # the candidate failed (its figures, if any, are an earlier probe's or screen's)
    EXCLUDED = "excluded"  # measured, then failed the correctness gate
    NONE = "none"  # no result yet


COLUMNS: dict[str, Column] = {
    "sweep": m.Sweep.name,
    "stage": m.Sweep.stage,
    "model": m.Sweep.model,
    "hardware": m.Sweep.hardware,
    "workload": m.Sweep.workload,
    "candidate_id": m.Candidate.id,
    "round": m.Candidate.round,
    "key": m.Candidate.key,
    **KNOB_COLUMNS,
    "layer_pattern": m.Candidate.layer_pattern,
    "status": m.Candidate.status,
    "verdict": m.Candidate.verdict,
    "edge_kind": m.Candidate.edge_kind,
    "pred_step_time_s": m.Candidate.pred_step_time_s,
    "pred_memory_gb": m.Candidate.pred_memory_gb,
    "pred_mfu": m.Candidate.pred_mfu,
    "pred_tokens_per_s": m.Candidate.pred_tokens_per_s,
    "pred_bubble": m.Candidate.pred_bubble,
    "d_a": m.Candidate.d_a,
    "d_e": m.Candidate.d_e,
    "m": m.Candidate.m,
    "feasible": m.Candidate.feasible,
    "attempt_no": m.Attempt.attempt_no,
    "job_id": m.Attempt.job_id,
    "array_index": m.Attempt.array_index,
    "state": m.Attempt.state,
    "failure_class": m.Attempt.failure_class,
    "exit_code": m.Attempt.exit_code,
    "node_list": m.Attempt.node_list,
    "simulated": m.Attempt.simulated,
    "fidelity": FIDELITY,  # the figures' (the measuring attempt's), else the latest attempt's
    "excluded": excluded(),
    "result_id": m.Result.id,
    # every scalar metric of the registry (simulated is the attempt's, above)
    **{k: getattr(m.Result, k) for k in SCALARS if k != "simulated"},
}
COLUMNS["measured"] = case(
    (COLUMNS["excluded"], Measured.EXCLUDED),
    (m.Candidate.status == CandidateStatus.FAILED, Measured.FAILED),
    (m.Result.id.is_(None), Measured.NONE),
    (FIDELITY == Fidelity.PROBE, Measured.PROBE),
    (FIDELITY == Fidelity.SCREEN, Measured.SCREEN),
    (COLUMNS["partial"] == true(), Measured.PARTIAL),
    else_=Measured.FULL,
)
ALIASES = {**METRIC_ALIASES, "b": "mbs"}
# the simulated flag last: it qualifies every figure before it
DEFAULT_COLUMNS = (
    "sweep",
    "round",
    "key",
    *(k.column for k in KNOBS if k.shown and k.part_of is None),
    "status",
    "fidelity",
    "measured",
    *(k.key for k in METRICS if k.shown and k.name != "simulated"),
    "simulated",
)
# What a `compare` row always shows, whatever --columns asks: whether its figures are a full-window measurement.
STANDING_COLUMNS = ("status", "fidelity", "measured")
# Sorting a metric without a sign puts the best first: high throughput, low time and memory (the registry's
# `better`), and the same for the predictions of a throughput.
HIGHER_IS_BETTER = METRIC_HIGHER | {"pred_mfu", "pred_tokens_per_s"}
OPERATORS = ("!=", "<=", ">=", "=", "<", ">")
_OPS = {"=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_WHERE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(!=|<=|>=|=|<|>)\s*(.*?)\s*$", re.S)


@dataclass(frozen=True)
class Filter:
    key: str
    op: str
    value: Any


def resolve(key: str) -> str:
    """Canonical column name for a user key (aliases allowed); LedgerError listing valid keys."""
    name = ALIASES.get(key, key)
    if name not in COLUMNS:
        raise LedgerError(f"unknown column '{key}'; valid keys: {', '.join(sorted(set(COLUMNS) | set(ALIASES)))}")
    return name


def parse_where(tokens: Sequence[str]) -> list[Filter]:
    """`ep=64`, `tokens_per_gpu>=1000`, `recompute=moe_act` -> typed filters (values not yet SQL)."""
    out = []
    for tok in tokens:
        hit = _WHERE.match(tok)
        if not hit:
            raise LedgerError(
                f"cannot read --where '{tok}': expected KEY OP VALUE with OP one of {' '.join(OPERATORS)}"
            )
        key, op, raw = hit.groups()
        name = resolve(key)
        out.append(Filter(name, op, _coerce(name, raw)))
    return out


def _coerce(name: str, raw: str) -> Any:
    """Type the value by its column, so `ep=1; DROP TABLE result` is refused and a string stays data."""
    col_type = COLUMNS[name].type
    if "\x00" in raw:  # PostgreSQL text cannot hold NUL; refuse it the same way on both engines
        raise LedgerError(f"--where {name}: values cannot contain NUL characters")
    if raw.lower() == "null":  # "none" stays text: recompute=none means no recompute
        return None
    try:
        if isinstance(col_type, Boolean):
            if raw.lower() in ("1", "true", "yes", "y"):
                return True
            if raw.lower() in ("0", "false", "no", "n"):
                return False
            raise ValueError
        if isinstance(col_type, Integer):
            value = int(raw)
            if abs(value) >= 2 ** (63 if isinstance(col_type, BigInteger) else 31):  # PostgreSQL's int4/int8
                raise ValueError
            return value
        if isinstance(col_type, Float):
            return float(raw)
    except ValueError:
        kind = "true/false" if isinstance(col_type, Boolean) else type(col_type).__name__.lower()
        raise LedgerError(f"--where {name}: '{raw}' is not a valid {kind} value") from None
    return raw


def _condition(f: Filter) -> ColumnElement[bool]:
    col = COLUMNS[f.key]
    if f.value is None:
        return col.is_(None) if f.op == "=" else col.is_not(None) if f.op == "!=" else _bad_null(f)
    if isinstance(f.value, bool) and f.op not in ("=", "!="):
        raise LedgerError(f"--where {f.key}{f.op}...: only = and != apply to true/false columns")
    cond: ColumnElement[bool] = _OPS[f.op](col, f.value)
    return cond


def _bad_null(f: Filter) -> NoReturn:
    raise LedgerError(f"--where {f.key}{f.op}null: only = and != compare with null")


def _order(sort: str | None, grouped: bool = True) -> list[Column]:
    """ORDER BY: full-window measurements first (grouped), then `sort` within each group (or the ledger's order)."""
    first = [case((COLUMNS["measured"] == Measured.FULL, 0), else_=1)] if grouped else []
    return first + _key_order(sort)


def _key_order(sort: str | None) -> list[Column]:
    if not sort:
        return [m.Sweep.id, m.Candidate.round, m.Candidate.id]
    desc = None
    if sort[0] in "+-":
        desc, sort = sort[0] == "-", sort[1:]
    name = resolve(sort)
    if desc is None:
        desc = name in HIGHER_IS_BETTER
    col = COLUMNS[name]
    return [(col.desc() if desc else col.asc()).nulls_last(), m.Candidate.id]


def _joins(q: AnySelect) -> AnySelect:
    """FROM candidate + sweep + latest attempt + latest result. All LEFT JOINs on primary keys (sweep_id
    is NOT NULL, so the rows are those of an inner join): the planner can drop the unused ones."""
    return (
        q.select_from(m.Candidate)
        .outerjoin(m.Sweep, m.Sweep.id == m.Candidate.sweep_id)
        .outerjoin(m.Attempt, m.Attempt.id == m.Candidate.latest_attempt_id)
        .outerjoin(m.Result, m.Result.id == m.Candidate.latest_result_id)
        .outerjoin(MEASURING, MEASURING.id == m.Result.attempt_id)
    )


def joined(columns: Sequence[str]) -> AnySelect:
    """SELECT the named columns over the joined row."""
    return _joins(select(*[COLUMNS[c].label(c) for c in columns]))


def compare(
    ledger: Ledger,
    *,
    sweep: str | None = None,
    stage: str | None = None,
    round: int | None = None,
    status: str | None = None,
    where: Sequence[str | Filter] = (),
    sort: str | None = None,
    limit: int | None = None,
    columns: Sequence[str] | None = None,
    grouped: bool = True,
) -> list[dict[str, Any]]:
    """Rows (dicts keyed by column name) for `python -m orchestrator compare`. Grouped (the default), rows whose
    figures are a full-window measurement (`measured` = full) come first, then failed, probe-only, screen-only,
    partial, excluded and unmeasured ones, each group in `sort`'s order: a fit probe's compute-only step never
    outranks a layout measured at scale. `grouped=False` orders every row by `sort` alone.

    With a limit, the filter + sort first pick candidate ids over narrow rows; only those `limit`
    rows are then widened to every column (100k runs: the sort never carries the wide columns).
    """
    names = list(columns or DEFAULT_COLUMNS)
    cols = [resolve(c) for c in names]
    filters = [f if isinstance(f, Filter) else parse_where([f])[0] for f in where]
    for key, value in (("sweep", sweep), ("stage", stage), ("round", round), ("status", status)):
        if value is not None:
            filters.append(Filter(key, "=", value))
    cond = and_(true(), *[_condition(f) for f in filters])
    order = _order(sort, grouped)
    if limit is None:
        q = joined(cols).where(cond).order_by(*order)
    else:
        if limit < 1:
            raise LedgerError("--limit must be at least 1")
        top = _joins(select(m.Candidate.id)).where(cond).order_by(*order).limit(limit).subquery()
        q = joined(cols).join(top, top.c.id == m.Candidate.id).order_by(*order)
    with ledger.store.read() as s:
        return [dict(zip(names, row)) for row in s.execute(q)]


def measured_select(*, sweep: str | None = None, stage: str | None = None, model: str | None = None) -> AnySelect:
    """(sweep, candidate, attempt, result, excluded) of every candidate with a successful result, its latest:
    what `ledger.evidence.measured` hands out and `best` ranks (the same rows: one answer to "best")."""
    q = (
        select(m.Sweep, m.Candidate, m.Attempt, m.Result, excluded().label("excluded"))
        .join(m.Candidate, m.Candidate.sweep_id == m.Sweep.id)
        .join(m.Result, m.Result.id == m.Candidate.latest_result_id)
        .join(m.Attempt, m.Attempt.id == m.Result.attempt_id)
        .where(m.Attempt.role == AttemptRole.MEASURE)  # a finalist's parity / long-run job is no measurement
    )
    if sweep is not None:
        q = q.where(m.Sweep.name == sweep)
    if stage is not None:
        q = q.where(m.Sweep.stage == stage)
    if model is not None:
        q = q.where(m.Sweep.model == model)
    return q


def best(ledger: Ledger, *, sweep: str | None = None, stage: str | None = None) -> dict[str, Any] | None:
    """The fastest MEASURED layout, as orchestrator.core.ranking decides it (never on predictions).

    SQL only narrows the rows (each candidate's latest result, with a step p50); which of them may be a best
    and in what order is the ranking's. Returns the evidence: layout, every metric, job id, logs.
    """
    q = measured_select(sweep=sweep, stage=stage).where(COLUMNS[STEP_P50].is_not(None))
    with ledger.store.read() as s:
        hits = list(s.execute(q))

        def standing(hit: Any) -> Standing:
            _, _, a, r, bad = hit
            return standing_of(
                measured(r),
                fidelity=a.fidelity,
                partial=r.partial,
                excluded=bool(bad),
                order=r.id,
            )

        top = ranked_best(hits, standing)
        if top is None:
            return None
        sw, c, a, r, _ = top
        return {
            "sweep": sw.name,
            "stage": sw.stage,
            "model": sw.model,
            "hardware": sw.hardware,
            "workload": sw.workload,
            "candidate_id": c.id,
            "key": c.key,
            "round": c.round,
            "status": c.status,
            "layout": c.layout,
            "layer_pattern": c.layer_pattern,
            "verdict": c.verdict,
            "predicted": c.predicted,
            "chosen_on": RULE,
            "simulated": r.simulated,
            "attempt": {
                "id": a.id,
                "attempt_no": a.attempt_no,
                "job_id": a.job_id,
                "array_index": a.array_index,
                "job_dir": a.job_dir,
                "node_list": a.node_list,
                "state": a.state,
                "fidelity": a.fidelity,
                "start_time": a.start_time.isoformat() if a.start_time else None,
                "end_time": a.end_time.isoformat() if a.end_time else None,
                "log_paths": a.log_paths,
                "sidecar_paths": a.sidecar_paths,
            },
            "metrics": {k: getattr(r, k) for k in RESULT_METRICS},
        }


@dataclass(frozen=True)
class AttemptCost:
    """What one attempt of a sweep cost: its measured mean step, else its wall time (start, end)."""

    candidate_id: int
    simulated: bool
    start_time: datetime | None
    end_time: datetime | None
    step_mean_s: float | None  # None when the attempt has no result
    fidelity: Fidelity = Fidelity.FULL
    warmup_iters: int | None = None  # the window the attempt ran (its result's), None without a result
    measure_iters: int | None = None
    role: str = "measure"  # states.AttemptRole: the finalists' jobs are charged like any attempt
    round: int = 0  # its candidate's round
    failure_class: str | None = None  # an OOM does not use up a run (history.spent)
    decision: Decision = NO_DECISION  # its candidate's (a rank probe's names the ranks it runs)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fidelity", Fidelity(self.fidelity or Fidelity.FULL))
        object.__setattr__(self, "decision", decode("decision", self.decision))

    @property
    def probed_ranks(self) -> int:
        """How many one-GPU rank-probe tasks the attempt ran (0: a launch on the stage's N GPUs)."""
        if self.fidelity != Fidelity.PROBE or self.role != "measure":
            return 0
        return len(self.decision.probed_ranks())  # a confirmed probe keeps its probe's decision as `previous`


def attempt_costs(ledger: Ledger, sweep: str) -> list[AttemptCost]:
    """Every attempt of `sweep` with its result's mean step, in ONE joined query: the live view asks on
    every change, so the cost must not be a query per candidate."""
    q = (
        select(
            m.Attempt.candidate_id,
            m.Attempt.simulated,
            m.Attempt.start_time,
            m.Attempt.end_time,
            COLUMNS[STEP_MEAN],
            m.Attempt.fidelity,
            COLUMNS["warmup_iters"],
            COLUMNS["measure_iters_requested"],
            m.Attempt.role,
            m.Candidate.round,
            m.Attempt.failure_class,
            m.Candidate.decision,
        )
        .join(m.Candidate, m.Candidate.id == m.Attempt.candidate_id)
        .join(m.Sweep, m.Sweep.id == m.Candidate.sweep_id)
        .outerjoin(m.Result, m.Result.attempt_id == m.Attempt.id)
        .where(m.Sweep.name == sweep)
        .order_by(m.Attempt.id)
    )
    with ledger.store.read() as s:
        return [AttemptCost(*row) for row in s.execute(q)]
