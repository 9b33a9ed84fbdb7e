"""The candidate space: the cartesian product of a stage's knob lists, as `Layout`s.

Why normalise here: the YAML lists are written for people ("flex:deepep", [mhc, mla_up_proj]);
the planner, the rules and the ledger key need one spelling per knob value, so two spellings of the
same set never become two candidates. Legality is not decided here (that is rules.py): even values
no rule accepts are enumerated, so the planner can say which rule rejects them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from orchestrator.plan.layout import Layout
from orchestrator.schema import SearchConfig

# Walk order of the knobs. The planner walks them in this order too, checking each rule as soon as
# every knob it reads is bound, so cheap rules that reject a whole subtree run near the root.
KNOBS: tuple[str, ...] = (
    "pp",
    "vpp",
    "tp",
    "cp",
    "mbs",
    "ep",
    "etp",
    "recompute",
    "offload",
    "dispatcher",
    "capacity_factor",
    "use_tp_pp_dp_mapping",
)

# Layout field -> the knob that sets it ("dispatcher" sets both dispatcher and flex_backend).
FIELD_KNOB: dict[str, str] = {k: k for k in KNOBS}
FIELD_KNOB["flex_backend"] = "dispatcher"


def parse_dispatcher(label: str) -> tuple[str, str | None]:
    """'flex:deepep' -> ('flex', 'deepep'); 'alltoall' -> ('alltoall', None).

    A bare 'flex' means Megatron's default backend, deepep, spelled out so the key is unique.
    """
    name, _, backend = str(label).partition(":")
    name, backend = name.strip(), backend.strip() or None
    if name == "flex" and backend is None:
        backend = "deepep"
    return name, backend


def _unique(values: Sequence) -> list:
    seen, out = set(), []
    for v in values:
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out


def knob_values(search: SearchConfig) -> dict[str, list]:
    """Normalised, de-duplicated values of each knob, in KNOBS order.

    recompute/offload sets become sorted tuples; dispatcher values become (dispatcher, flex_backend).
    """
    return {
        "pp": _unique(int(v) for v in search.pp),
        "vpp": _unique(int(v) for v in search.vpp),
        "tp": _unique(int(v) for v in search.tp),
        "cp": _unique(int(v) for v in search.cp),
        "mbs": _unique(int(v) for v in search.mbs),
        "ep": _unique(int(v) for v in search.ep),
        "etp": _unique(int(v) for v in search.etp),
        "recompute": _unique(tuple(sorted(set(r or ()))) for r in search.recompute),
        "offload": _unique(tuple(sorted(set(o or ()))) for o in search.offload),
        "dispatcher": _unique(parse_dispatcher(d) for d in search.dispatcher),
        "capacity_factor": _unique(None if c is None else float(c) for c in search.capacity_factor),
        "use_tp_pp_dp_mapping": _unique(bool(v) for v in search.use_tp_pp_dp_mapping),
    }


def make_layout(assignment: dict[str, object]) -> Layout:
    """A Layout from a knob -> value mapping (missing knobs keep Layout's defaults)."""
    kw = dict(assignment)
    if "dispatcher" in kw:
        kw["dispatcher"], kw["flex_backend"] = kw["dispatcher"]  # type: ignore[misc]
    return Layout(**kw)  # type: ignore[arg-type]


def enumerate_layouts(search: SearchConfig) -> Iterator[Layout]:
    """Every combination of the knob lists, in KNOBS order (last knob varies fastest)."""
    values = knob_values(search)
    for combo in itertools.product(*(values[k] for k in KNOBS)):
        yield make_layout(dict(zip(KNOBS, combo)))


def raw_count(search: SearchConfig) -> int:
    """Size of the raw product (before any rule), equal to len(list(enumerate_layouts(search)))."""
    n = 1
    for vals in knob_values(search).values():
        n *= len(vals)
    return n


def knob_sizes(search: SearchConfig) -> list[tuple[str, int]]:
    """(knob, number of values) pairs, for explaining where the raw count comes from."""
    return [(k, len(v)) for k, v in knob_values(search).items()]
