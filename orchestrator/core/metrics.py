"""The metric registry: every measurement one attempt's result holds, declared once.

Why one owner: the evidence fills a JobResult field, the ledger keeps each in its own `result` column,
`compare` filters and sorts on it (the best first: lower for a time, higher for a throughput), `best`,
`status` and the report print it under a heading in a unit. Each of those reads `METRICS` instead of
spelling the metric out again, so adding a metric (an NCCL bus bandwidth, a per-stage p99) is one
`Metric(...)` row below, the evidence code that computes it (orchestrator/evidence) and an Alembic revision
that adds its column. tests/core/test_metrics.py checks every consumer against the registry.

A metric's `name` is the JobResult field it comes from (orchestrator/core/result.py) and its ledger column
(orchestrator/ledger/models.py `Result`, built from this table). `source` says how the evidence yields it
(orchestrator/evidence/metrics.py and collect.py compute them); `better` what a sort without a sign puts
first; `unit`, `label` and `fmt` how a table prints it. Besides the measurements proper, the table holds
what qualifies them (`simulated`, `partial`, the window): every `result` column but its keys.

stdlib only, like orchestrator/core/knobs.py: the ledger reads it without the evidence code.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Metric:
    """One result column: the JobResult field `name` and what every consumer needs to know about it."""

    name: str
    sql: str  # the column's type in a word (orchestrator/ledger/models maps it): float int bool str text json
    unit: str  # "s", "GB", "tokens/s", "TFLOP/s", "fraction" (printed as a percentage), "" (a count, a ratio)
    label: str  # a table heading
    source: str  # where the evidence comes from and how it is derived
    better: str | None = None  # "lower" | "higher": what a sort puts first; None: not a ranking figure
    default: Any = None  # the column's default; None: nullable (not measured), unless `required`
    required: bool = False  # NOT NULL without a default: every result states it
    length: int = 0  # VARCHAR length of a "str"
    alias: str | None = None  # a shorter `compare` key it is also shown under (tokens_per_gpu)
    also: tuple[str, ...] = ()  # more `compare` keys for it (step_s)
    shown: bool = False  # one of `compare`'s default columns
    fmt: str = ".3g"  # how a value prints in plain text

    @property
    def nullable(self) -> bool:
        return self.default is None and not self.required

    @property
    def scalar(self) -> bool:
        """A value `compare` can filter and sort on (the JSON columns are not)."""
        return self.sql != "json"

    @property
    def key(self) -> str:
        """The name `compare` shows it under: its alias, else its name."""
        return self.alias or self.name

    def text(self, value: Any) -> str:
        """One value as plain text with its unit ('1.234 s', '61.2 GB', '12.0%'); '-' when not measured."""
        if value is None:
            return "-"
        if self.unit == "fraction":  # fmt applies to the percentage
            return f"{100 * float(value):{self.fmt}}%"
        if isinstance(value, bool) or self.sql in ("str", "text", "json"):
            return str(value)
        unit = "" if self.unit in ("", "fraction") else f" {self.unit}"
        return f"{value:{self.fmt}}{unit}"


LOG = "rank logs, the iteration lines of the measured window (warm-up excluded)"
SIDECAR = "sidecar-rank-<r>.json (the router/memory hook, orchestrator/job/instrument.py)"

METRICS: tuple[Metric, ...] = (
    # What qualifies every figure below
    Metric(
        "simulated",
        "bool",
        "",
        "simulated",
        "the twin workload wrote it (a [SIMULATED] line, a sidecar flag)",
        required=True,
        shown=True,
    ),
    Metric(
        "partial",
        "bool",
        "",
        "partial",
        "the job stopped before its window ended (fewer iterations measured than asked)",
        default=False,
    ),
    Metric(
        "warmup_iters",
        "int",
        "",
        "warm-up",
        "the job spec's warm-up (iterations excluded before the window)",
        default=0,
        fmt="d",
    ),
    Metric("measure_iters_requested", "int", "", "window asked", "the job spec's measured window", default=0, fmt="d"),
    Metric("measure_iters", "int", "", "window", f"iterations measured: {LOG}", default=0, fmt="d"),
    Metric(
        "settled_iters",
        "int",
        "",
        "settled after",
        "leading iterations (warm-up included) whose step ran above the window's steady p50: rank logs, the "
        "iteration lines from iteration 1 (orchestrator.evidence.metrics.settled_iters); what a warm start learns",
        fmt="d",
    ),
    # Step time over the measured window
    Metric(
        "step_p50_s",
        "float",
        "s",
        "p50 (s)",
        f"median 'elapsed time per iteration' over the {LOG}",
        "lower",
        also=("step_s",),
        shown=True,
        fmt=".3f",
    ),
    Metric("step_p95_s", "float", "s", "p95 (s)", f"95th percentile step time, {LOG}", "lower", fmt=".3f"),
    Metric("step_p99_s", "float", "s", "p99 (s)", f"99th percentile step time, {LOG}", "lower", shown=True, fmt=".3f"),
    Metric("step_mean_s", "float", "s", "mean (s)", f"mean step time, {LOG}: what a launch cost", "lower", fmt=".3f"),
    Metric("step_max_s", "float", "s", "max (s)", f"slowest step, {LOG}", "lower", fmt=".3f"),
    # Throughput
    Metric("tokens_per_s", "float", "tokens/s", "tok/s", "B x S / step p50", "higher", fmt=",.0f"),
    Metric(
        "tokens_per_s_per_gpu",
        "float",
        "tokens/s",
        "tok/s/GPU",
        "tokens_per_s / N",
        "higher",
        alias="tokens_per_gpu",
        shown=True,
        fmt=".1f",
    ),
    Metric(
        "tflops_per_gpu",
        "float",
        "TFLOP/s",
        "TFLOP/s/GPU",
        "our model FLOPs per step / (step p50 x N)",
        "higher",
        fmt=".1f",
    ),
    Metric(
        "mfu",
        "float",
        "fraction",
        "MFU",
        "tflops_per_gpu / the hardware peak named in mfu_peak",
        "higher",
        shown=True,
        fmt=".1f",
    ),
    Metric("mfu_peak", "str", "", "MFU peak", "the peak MFU divides by (precision, TFLOP/s)", default="", length=100),
    Metric(
        "megatron_tflops_per_gpu",
        "float",
        "TFLOP/s",
        "Megatron TFLOP/s/GPU",
        f"median of Megatron's own 'throughput per GPU' field, {LOG}",
        "higher",
        fmt=".1f",
    ),
    Metric(
        "recompute_tflops_per_gpu",
        "float",
        "TFLOP/s",
        "recompute TFLOP/s/GPU",
        "recomputed FLOPs per step / (step p50 x N), never inside MFU",
        fmt=".1f",
    ),
    # Memory: the heaviest rank
    Metric(
        "heaviest_rank",
        "int",
        "",
        "heaviest rank",
        f"the rank with the largest max allocated: Megatron's '[Rank r] memory (MB)' lines and {SIDECAR}",
        fmt="d",
    ),
    Metric("heaviest_pp_stage", "int", "", "heaviest PP stage", "the heaviest rank's pipeline stage", fmt="d"),
    Metric(
        "peak_allocated_gb",
        "float",
        "GB",
        "alloc GB",
        "the heaviest rank's max allocated (MiB -> decimal GB)",
        "lower",
        shown=True,
        fmt=".1f",
    ),
    Metric(
        "peak_reserved_gb",
        "float",
        "GB",
        "reserved GB",
        "the heaviest rank's max reserved: what the allocator holds and what OOMs",
        "lower",
        fmt=".1f",
    ),
    # Stragglers
    Metric(
        "slowest_rank",
        "int",
        "",
        "slowest rank",
        "the rank the timer maxima and straggler lines name most often in the window",
        fmt="d",
    ),
    Metric("slowest_stage", "int", "", "slowest stage", "the slowest rank's pipeline stage", fmt="d"),
    # MoE evidence
    Metric(
        "token_drop_fraction",
        "float",
        "fraction",
        "drop",
        f"dropped / routed token-expert assignments, {SIDECAR}; None: not measured",
        "lower",
        alias="token_drop",
        shown=True,
        fmt=".2f",
    ),
    Metric(
        "padding_fraction",
        "float",
        "fraction",
        "padding",
        f"padding share of expert input slots, {SIDECAR}",
        "lower",
        alias="padding",
        fmt=".1f",
    ),
    Metric(
        "expert_load_p50",
        "float",
        "",
        "load p50",
        f"tokens per expert over the window, median across experts, {SIDECAR}",
        fmt=".0f",
    ),
    Metric("expert_load_p95", "float", "", "load p95", "tokens per expert, 95th percentile across experts", fmt=".0f"),
    Metric("expert_load_p99", "float", "", "load p99", "tokens per expert, 99th percentile across experts", fmt=".0f"),
    Metric(
        "hot_expert_ratio",
        "float",
        "",
        "hot-expert ratio",
        "the most loaded expert of one layer over that layer's mean",
        "lower",
        fmt=".2f",
    ),
    Metric(
        "force_balanced_routing",
        "bool",
        "",
        "forced balance",
        f"the router was forced to balance, {SIDECAR}",
        default=False,
    ),
    Metric(
        "token_drop_note", "text", "", "drop note", "why token drops were not measured (drops inside the dispatcher)"
    ),
    Metric("hot_expert", "str", "", "hot expert", "'layer L expert e' of hot_expert_ratio", length=64),
    Metric(
        "hot_rank_tokens_p50",
        "float",
        "",
        "hot-rank tokens p50",
        "tokens the hottest EP rank receives per dispatch, median over dispatches",
        fmt=".0f",
    ),
    Metric("hot_rank_tokens_p95", "float", "", "hot-rank tokens p95", "the same, 95th percentile", fmt=".0f"),
    Metric("hot_rank_tokens_p99", "float", "", "hot-rank tokens p99", "the same, 99th percentile", fmt=".0f"),
    Metric(
        "hot_rank_share_p50",
        "float",
        "fraction",
        "hot-rank share p50",
        "the hottest EP rank's share of a dispatch (1/EP when balanced), median",
        fmt=".1f",
    ),
    Metric("hot_rank_share_p95", "float", "fraction", "hot-rank share p95", "the same, 95th percentile", fmt=".1f"),
    Metric("hot_rank_share_p99", "float", "fraction", "hot-rank share p99", "the same, 99th percentile", fmt=".1f"),
    # Long-run window (effective throughput)
    Metric(
        "ckpt_save_s",
        "float",
        "s",
        "ckpt save (s)",
        "the save-checkpoint timer's max over ranks (long-run window)",
        "lower",
        fmt=".2f",
    ),
    Metric(
        "ckpt_restore_s",
        "float",
        "s",
        "ckpt restore (s)",
        "the load-checkpoint timer's max over ranks (long-run restore job)",
        "lower",
        fmt=".2f",
    ),
    Metric(
        "tokens_per_s_after_restart",
        "float",
        "tokens/s",
        "tok/s after restart",
        "tokens_per_s of the long-run restore job",
        "higher",
        fmt=",.0f",
    ),
    Metric(
        "effective_fraction",
        "float",
        "fraction",
        "effective",
        "advancing share of wall time (orchestrator.evidence.effective)",
        "higher",
        fmt=".1f",
    ),
    Metric(
        "q_effective",
        "float",
        "tokens/s",
        "Q_eff (tok/s)",
        "tokens/s that advanced and were not rolled back (orchestrator.evidence.effective)",
        "higher",
        fmt=",.0f",
    ),
    # Raw evidence kept whole
    Metric(
        "timers_ms",
        "json",
        "",
        "timers",
        "Megatron's timer blocks in the window: name -> [min, max] ms over ranks",
        default={},
    ),
    Metric("versions", "json", "", "versions", "versions the job reported (Megatron, torch, TE)", default={}),
    Metric(
        "run_env",
        "json",
        "",
        "run env",
        "the NCCL/NVTE environment the ranks ran with (orchestrator.job.node)",
        default={},
    ),
)
METRIC: dict[str, Metric] = {m.name: m for m in METRICS}
ALIASES: dict[str, str] = {a: m.name for m in METRICS for a in (*([m.alias] if m.alias else []), *m.also)}
HIGHER_IS_BETTER: frozenset[str] = frozenset(m.name for m in METRICS if m.better == "higher")
SCALARS: tuple[str, ...] = tuple(m.name for m in METRICS if m.scalar)
FRACTIONS: frozenset[str] = frozenset(m.name for m in METRICS if m.unit == "fraction")

# The figures the measured best is ranked on (orchestrator/core/ranking.py), named once here.
STEP_P50 = METRIC["step_p50_s"].name
STEP_P99 = METRIC["step_p99_s"].name
STEP_MEAN = METRIC["step_mean_s"].name


_SQL_TYPES: dict[str, type] = {"float": float, "int": int, "bool": bool, "str": str, "text": str}


class Measured(Mapping[str, Any]):
    """One stored result's metrics, as the ledger hands them out: read-only, keyed by the registry (a name
    that is no `Metric` is a KeyError naming it, never a silent None), each value of its metric's type. The
    figures the driver, the history and the ranking read have typed properties; `dict(m)` is the JSON shape."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        unknown = sorted(set(values or {}) - set(METRIC))
        if unknown:
            raise KeyError(f"not metrics of orchestrator/core/metrics.py METRICS: {unknown}")
        self._values = {m.name: _typed(m, (values or {}).get(m.name, m.default)) for m in METRICS}

    def __getitem__(self, name: str) -> Any:
        if name not in self._values:
            raise KeyError(f"{name!r} is no metric of orchestrator/core/metrics.py METRICS")
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        shown = {k: v for k, v in self._values.items() if v is not None and METRIC[k].scalar}
        return f"Measured({shown})"

    def _float(self, name: str) -> float | None:
        v = self._values[name]
        return None if v is None else float(v)

    @property
    def step_p50_s(self) -> float | None:
        return self._float(STEP_P50)

    @property
    def step_p99_s(self) -> float | None:
        return self._float(STEP_P99)

    @property
    def step_mean_s(self) -> float | None:
        return self._float(STEP_MEAN)

    @property
    def tokens_per_s(self) -> float | None:
        return self._float("tokens_per_s")

    @property
    def settled_iters(self) -> int | None:
        v = self._values["settled_iters"]
        return None if v is None else int(v)

    @property
    def peak_gb(self) -> float | None:
        return peak_gb(self)


def _typed(m: Metric, value: Any) -> Any:
    """A stored value as its metric's type (SQLite hands back what was written: a count as 3.0, a flag as 1)."""
    kind = _SQL_TYPES.get(m.sql)
    if value is None or kind is None:
        return value
    return kind(value)


def peak_gb(values: Mapping[str, Any]) -> float | None:
    """The heaviest rank's peak memory of a result: reserved (what the allocator holds, what OOMs), else
    allocated (a log without the reserved figure); None when neither was measured."""
    reserved, allocated = values.get("peak_reserved_gb"), values.get("peak_allocated_gb")
    return reserved if reserved is not None else allocated


def heading(name: str) -> str:
    """A table heading for a metric (its label), or the name itself for anything else."""
    m = METRIC.get(name)
    return m.label if m is not None else name


def text(name: str, value: Any) -> str:
    """A metric's value as plain text with its unit (Metric.text)."""
    return METRIC[name].text(value)
