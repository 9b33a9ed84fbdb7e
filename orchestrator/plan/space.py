"""The candidate space: the cartesian product of a stage's knob lists, as `Layout`s.

Why normalise here: the YAML lists are written for people ("flex:deepep", [mhc, mla_up_proj]);
the planner, the rules and the ledger key need one spelling per knob value, so two spellings of the
same set never become two candidates. Legality is not decided here (that is rules.py): even values
no rule accepts are enumerated, so the planner can say which rule rejects them. Which knobs there are,
how each normalises and the walk order come from the registry (orchestrator/core/knobs.py). A numerics knob
(`Knob.declared`: the optimizer's precision) takes its values from the recipe, which the user declares: the
search never widens the training semantics a stage was asked to keep.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import Any

from orchestrator.core import knobs
from orchestrator.core.knobs import Layout
from orchestrator.core.knobs import parse_dispatcher as parse_dispatcher
from orchestrator.core.schema import RecipeConfig, SearchConfig

# Walk order of the knobs. The planner walks them in this order too, checking each rule as soon as
# every knob it reads is bound, so cheap rules that reject a whole subtree run near the root.
KNOBS: tuple[str, ...] = tuple(k.name for k in knobs.SEARCHED)

# Layout field -> the knob that sets it ("dispatcher" sets both dispatcher and flex_backend).
FIELD_KNOB: dict[str, str] = {k.name: k.part_of or k.name for k in knobs.KNOBS}
_MULTI = tuple((name, fields) for name, fields in knobs.FIELDS.items() if len(fields) > 1)  # value: a tuple


def _unique(values: Iterable[Hashable]) -> list[Any]:
    seen: set[Hashable] = set()
    out: list[Any] = []
    for v in values:
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out


def knob_values(search: SearchConfig, recipe: RecipeConfig | None = None) -> dict[str, list[Any]]:
    """Normalised, de-duplicated values of each knob, in KNOBS order; a numerics knob's from the recipe's declared
    list (None: RecipeConfig's defaults).

    recompute/offload sets become sorted tuples; dispatcher values become (dispatcher, flex_backend).
    """
    recipe = recipe or RecipeConfig()
    return {
        k.name: _unique(
            k.normalise(v) for v in getattr(recipe if k.declared is not None else search, k.declared or k.name)
        )
        for k in knobs.SEARCHED
    }


def make_layout(assignment: Mapping[str, Any]) -> Layout:
    """A Layout from a knob -> value mapping (missing knobs keep Layout's defaults); the value of a knob
    with parts (dispatcher) is the tuple of its fields' values."""
    kw = dict(assignment)
    for name, fields in _MULTI:
        if name in kw:
            kw.update(zip(fields, kw[name]))  # fields[0] is the knob itself
    return Layout(**kw)


def enumerate_layouts(search: SearchConfig, recipe: RecipeConfig | None = None) -> Iterator[Layout]:
    """Every combination of the knob lists, in KNOBS order (last knob varies fastest)."""
    values = knob_values(search, recipe)
    for combo in itertools.product(*(values[k] for k in KNOBS)):
        yield make_layout(dict(zip(KNOBS, combo)))


def raw_count(search: SearchConfig, recipe: RecipeConfig | None = None) -> int:
    """Size of the raw product (before any rule), equal to len(list(enumerate_layouts(search, recipe)))."""
    n = 1
    for vals in knob_values(search, recipe).values():
        n *= len(vals)
    return n


def knob_sizes(search: SearchConfig, recipe: RecipeConfig | None = None) -> list[tuple[str, int]]:
    """(knob, number of values) pairs, for explaining where the raw count comes from."""
    return [(k, len(v)) for k, v in knob_values(search, recipe).items()]
