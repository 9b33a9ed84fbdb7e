"""The knob registry: every parallel-layout knob, declared once, as a field of `Layout`.

Why one owner: the planner searches the knobs, argv writes them as Megatron flags, the ledger keeps each
in its own column, `compare` filters on them, the policy moves them one group at a time and every table
prints them. Each of those reads `KNOBS` instead of spelling the knob list out again, so adding a knob (an
FP8 recipe, a per-stage capacity factor) is one `knob(...)` field below, the model terms that read it
(orchestrator/plan) and an Alembic revision that adds its column. tests/core/test_knobs.py checks every
consumer against the registry.

A knob is a `Layout` field declared with `knob(default, ...)`: the field gives its name, Python type and
default, the call gives the rest (see `Knob`). `Layout` lives here rather than in orchestrator/plan so
that orchestrator/ledger/ and jobs/ read the registry without importing the planner; orchestrator.plan.layout re-exports
it. SearchConfig is built from `search_fields()` with dataclasses.make_dataclass rather than written out
and checked by a test: a new knob then needs no edit in orchestrator/core/schema.py, and it is still a real
dataclass, so OmegaConf validates a stage's search lists by type (the type checker sees a small stub).

stdlib only: jobs/ imports it on compute nodes with a bare Python, orchestrator/ledger/ without the planner.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, TypeVar

from orchestrator.core.bounds import ranged_list

T = TypeVar("T")


@dataclass(frozen=True)
class Knob:
    """One knob: the `Layout` field `name` and what every consumer needs to know about it."""

    name: str
    type: Any  # the field's type: int, bool, str, str | None, float | None or tuple[str, ...]
    default: Any
    flags: tuple[str, ...]  # the Megatron flags that carry it (orchestrator/plan/argv.py writes and reads them)
    label: str | None  # how it prints: "TP{}" -> "TP2"; None: inside the label of the knob it is part_of
    column: str  # its ledger column (orchestrator/ledger/models.Candidate)
    length: int  # VARCHAR length of a str or module-set column
    search: tuple[Any, ...] | None  # a stage's default search list; None: set by part_of's search value
    walk: int | None  # its level in the planner's knob-by-knob walk (0 = root: cheap rules cut early)
    group: str | None  # the policy moves one group at a time (PP with VPP); None: never moved alone
    part_of: str | None  # the knob whose search value also sets this one ("flex:deepep" sets flex_backend)
    shown: bool  # always printed; False: in labels only off its default, in tables only where it varies
    parse: Callable[[Any], tuple[Any, ...]] | None  # search value -> (this, *parts), for a knob with parts
    # A numerics knob (it changes what training computes, not only how fast): the RecipeConfig field that lists
    # the values the user allows. The search explores only those; no stage search list holds it (search=None).
    declared: str | None = None

    @property
    def nullable(self) -> bool:
        return isinstance(self.type, types.UnionType) and type(None) in typing.get_args(self.type)

    @property
    def base(self) -> type:
        """int, float, bool, str, or tuple for a module set."""
        if isinstance(self.type, types.UnionType):
            return next(t for t in typing.get_args(self.type) if t is not type(None))
        origin = typing.get_origin(self.type)
        return origin if origin is not None else self.type

    @property
    def sql(self) -> str:
        """The column's SQL type in a word (orchestrator/ledger/models maps it): int, float, bool or str."""
        return "str" if self.base in (str, tuple) else self.base.__name__

    def normalise(self, value: Any) -> Any:
        """One spelling per value: module sets sorted and de-duplicated, numbers typed, None kept where allowed.
        A knob with parts returns the tuple (its value, *its parts' values) from `parse`."""
        if self.parse is not None:
            return self.parse(value)
        if value is None and self.nullable:
            return None
        if self.base is tuple:
            return tuple(sorted(set(value or ())))
        return self.base(value)


def knob(
    default: T,
    *,
    flags: tuple[str, ...] = (),
    label: str | None = None,
    column: str | None = None,
    length: int = 30,
    search: tuple[Any, ...] | None = None,
    walk: int | None = None,
    group: str | None = None,
    part_of: str | None = None,
    shown: bool = True,
    parse: Callable[[Any], tuple[Any, ...]] | None = None,
    declared: str | None = None,
) -> T:
    """A Layout field that is a knob (typed as its default for the type checker; a dataclass field at run time)."""
    spec = Knob(
        "", object, default, flags, label, column or "", length, search, walk, group, part_of, shown, parse, declared
    )
    return field(default=default, metadata={"knob": spec})


def parse_dispatcher(label: Any) -> tuple[str, str | None]:
    """'flex:deepep' -> ('flex', 'deepep'); 'alltoall' -> ('alltoall', None).

    A bare 'flex' means Megatron's default backend, deepep, spelled out so the key is unique.
    """
    name, _, backend = str(label).partition(":")
    name, backend = name.strip(), backend.strip()
    if name == "flex" and not backend:
        backend = "deepep"
    return name, backend or None


# Compute precisions by name -> the --fp8-recipe each writes (bf16: none; every FP8 recipe also writes
# --fp8-format e4m3, as dev's V4 recipes do: examples/moe_recipes/deepseek_v4_pro/gb300/
# mxfp8_SL4K_256GPU_TP1PP4EP64.yaml:232-234). fp8 is DeepSeek's 128x128 blockwise scaling (Hopper and later),
# fp8_cs tensorwise current scaling (Megatron-Bridge's "FP8-CS"), mxfp8 32-element microscaling (Blackwell only:
# orchestrator/plan/flops.has_precision). dev's recipe names: megatron/core/enums.py:12 (Fp8Recipe); mxfp8 runs TE's
# MXFP8BlockScaling (megatron/core/fp8_utils.py:772-773).
PRECISIONS: dict[str, str | None] = {"bf16": None, "fp8": "blockwise", "fp8_cs": "tensorwise", "mxfp8": "mxfp8"}


# The precision-aware optimizer's settings by name: (main grads, main params, exp_avg, exp_avg_sq) dtypes, as
# Megatron's flags spell them (dev megatron/training/arguments.py:5103-5139). "fp32" is Megatron's default and
# writes no flag; the others write --use-precision-aware-optimizer and all four dtypes. Main params stay FP32:
# dev's parser offers fp32|fp16 only and its V4 recipe keeps fp32.
OPTIM_DTYPES: dict[str, tuple[str, str, str, str]] = {
    "fp32": ("fp32", "fp32", "fp32", "fp32"),
    # dev's DSv4-Pro recipe (examples/moe_recipes/deepseek_v4_pro/gb300/mxfp8_SL4K_256GPU_TP1PP4EP64.yaml:237-241)
    # and Megatron-Bridge's DeepSeek-V3 recipes: BF16 main grads and moments
    "bf16": ("bf16", "fp32", "bf16", "bf16"),
    # Megatron-Bridge's V4-Flash performance recipe: FP32 main grads, BF16 moments
    # (src/megatron/bridge/perf_recipes/deepseek/gb200/deepseek_v4.py:92-95 @ 4ab94dfad)
    "bf16_moments": ("fp32", "fp32", "bf16", "bf16"),
}


def optim_name(main_grads: str = "fp32", exp_avg: str = "fp32") -> str:
    """The OPTIM_DTYPES name of a (main grads, moments) dtype pair; ValueError names the pairs there are."""
    for name, (grads, _params, avg, _sq) in OPTIM_DTYPES.items():
        if (grads, avg) == (main_grads, exp_avg):
            return name
    pairs = ", ".join(f"{n} (grads {g}, moments {a})" for n, (g, _p, a, _s) in OPTIM_DTYPES.items())
    raise ValueError(f"no optimizer precision has main grads {main_grads} and moments {exp_avg}: one of {pairs}")


def optim_text(name: str) -> str:
    """How a layout's optimizer numerics read in `best` and the report: 'main grads bf16, master fp32, moments bf16
    (precision-aware optimizer)'; Megatron's default says so."""
    if name not in OPTIM_DTYPES:
        return f"{name} (unknown)"
    grads, params, avg, avg_sq = OPTIM_DTYPES[name]
    moments = avg if avg == avg_sq else f"{avg}/{avg_sq}"
    how = "Megatron's default" if name == "fp32" else "precision-aware optimizer"
    return f"main grads {grads}, master {params}, moments {moments} ({how})"


def precision_text(name: str) -> str:
    """How a layout's compute numerics read in `best` and the report: 'fp8 (--fp8-recipe blockwise)'; BF16 says it
    writes no FP8 flag."""
    if name not in PRECISIONS:
        return f"{name} (unknown)"
    recipe = PRECISIONS[name]
    return f"{name} (--fp8-recipe {recipe})" if recipe else f"{name} (no FP8 recipe: BF16 GEMMs)"


@dataclass(frozen=True, order=True)
class Layout:
    """The knobs of one candidate. Frozen and hashable so the planner can dedupe and key it."""

    # A knob's flags are every flag its value decides (argv writes the first; the rest follow from it): the
    # layout flags, the only ones two layouts of one stage differ in (tests/plan/test_argv.py diffs them).
    tp: int = knob(1, flags=("--tensor-model-parallel-size", "--sequence-parallel"), label="TP{}", search=(1,), walk=3)
    pp: int = knob(1, flags=("--pipeline-model-parallel-size",), label="PP{}", search=(4, 8, 16), walk=1, group="pp")
    # virtual pipeline stages per PP rank (1 = no interleaving): the pattern has PP x VPP '|' segments
    vpp: int = knob(1, flags=("--hybrid-layer-pattern",), label="VPP{}", search=(1, 2), walk=2, group="pp")
    cp: int = knob(
        1,
        flags=("--context-parallel-size", "--cp-comm-type", "--cp-partition-mode", "--max-seqlen-per-dp-cp-rank"),
        label="CP{}",
        search=(1, 2, 4),
        walk=4,
        group="cp",
    )
    ep: int = knob(1, flags=("--expert-model-parallel-size",), label="EP{}", search=(32, 64, 128), walk=6, group="ep")
    etp: int = knob(1, flags=("--expert-tensor-parallel-size",), label="ETP{}", search=(1,), walk=7)
    mbs: int = knob(1, flags=("--micro-batch-size",), label="MBS{}", search=(1, 2), walk=5, group="mbs")  # b
    # --recompute-modules (selective); ("full",) = --recompute-granularity full
    recompute: tuple[str, ...] = knob(
        (),
        flags=("--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--recompute-modules"),
        label="rc={}",
        length=200,
        search=((), ("mla_up_proj", "mhc"), ("moe_act",)),
        walk=8,
        group="recompute",
    )
    # --offload-modules (fine-grained activation offload)
    offload: tuple[str, ...] = knob(
        (),
        flags=("--fine-grained-activation-offloading", "--offload-modules"),
        label="off={}",
        length=200,
        search=((),),
        walk=9,
        shown=False,
    )
    # alltoall | allgather | flex; a search value "flex:deepep" also sets flex_backend
    dispatcher: str = knob(
        "alltoall",
        flags=("--moe-token-dispatcher-type",),
        label="{}",
        search=("alltoall", "flex:deepep", "flex:hybridep"),
        walk=10,
        group="dispatcher",
        parse=parse_dispatcher,
    )
    flex_backend: str | None = knob(  # ncclep also sizes its receive buffer (--moe-expert-rank-capacity-factor)
        None,
        flags=("--moe-flex-dispatcher-backend", "--moe-expert-rank-capacity-factor"),
        column="backend",
        part_of="dispatcher",
    )
    capacity_factor: float | None = knob(  # None = dropless
        None, flags=("--moe-expert-capacity-factor",), label="cf={}", search=(None,), walk=11, shown=False
    )
    use_tp_pp_dp_mapping: bool = knob(
        False, flags=("--use-tp-pp-dp-mapping",), label="tp-pp-dp", search=(False,), walk=12, shown=False
    )
    # Compute precision of the GEMMs (a PRECISIONS name): numerics, so the recipe declares the allowed set
    # (RecipeConfig.precision) and the hardware group says which the part has (mcore.precision_on_hardware). First in
    # the walk: that rule reads this knob alone and cuts a precision the GPU lacks (MXFP8 on Hopper) at the root.
    precision: str = knob(
        "bf16", flags=("--fp8-format", "--fp8-recipe"), label="{}", walk=0, shown=False, declared="precision"
    )
    # Optimizer-state and main-grad precision (an OPTIM_DTYPES name): numerics, so the recipe declares the allowed
    # set (RecipeConfig.optim). The default is the V4 recipe's, as the recipe's own default list; an argv without
    # the flags reads back as "fp32" (Megatron's default: no precision-aware optimizer).
    optim: str = knob(
        "fp32",
        flags=(
            "--use-precision-aware-optimizer",
            "--main-grads-dtype",
            "--main-params-dtype",
            "--exp-avg-dtype",
            "--exp-avg-sq-dtype",
        ),
        label="opt={}",
        walk=13,
        shown=False,
        declared="optim",
    )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in SETS:
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Layout:
        kw = {k: v for k, v in d.items() if k in KNOB}
        for k in SETS:
            kw[k] = tuple(kw.get(k) or ())
        return cls(**kw)

    def but(self, **knobs: Any) -> Layout:
        """This layout with `knobs` overridden (a set knob given as a list is a tuple here, as from_dict reads it)."""
        return Layout.from_dict({**self.to_dict(), **knobs})

    @property
    def dispatcher_label(self) -> str:
        """'flex:deepep', or the dispatcher alone."""
        return str(display(self)["dispatcher"])

    def short(self) -> str:
        """A compact human label, e.g. TP1 PP8 VPP1 CP1 EP64 ETP1 MBS1 rc=none alltoall."""
        return label(display(self))


def _registry() -> tuple[Knob, ...]:
    hints = typing.get_type_hints(Layout)
    return tuple(
        replace(f.metadata["knob"], name=f.name, type=hints[f.name], column=f.metadata["knob"].column or f.name)
        for f in fields(Layout)
    )


KNOBS: tuple[Knob, ...] = _registry()  # in Layout's field order: the order tables and labels print them
KNOB: dict[str, Knob] = {k.name: k for k in KNOBS}
LAYOUT_FLAGS: frozenset[str] = frozenset(f for k in KNOBS for f in k.flags)  # the flags a layout decides
# The knobs a stage searches (its search lists, and the recipe's declared numerics), in the planner's walk order;
# every other knob is part_of one of them.
SEARCHED: tuple[Knob, ...] = tuple(sorted((k for k in KNOBS if k.walk is not None), key=lambda k: k.walk or 0))
NUMERICS: tuple[Knob, ...] = tuple(k for k in KNOBS if k.declared is not None)  # the recipe declares their values
# knob -> the Layout fields one of its search values sets (itself, then its parts)
FIELDS: dict[str, tuple[str, ...]] = {
    k.name: (k.name, *(p.name for p in KNOBS if p.part_of == k.name)) for k in KNOBS if k.part_of is None
}


def _groups() -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for k in KNOBS:
        if k.group is not None:
            out[k.group] = out.get(k.group, ()) + FIELDS[k.name]
    return out


# the policy's one-factor moves: group -> the Layout fields that move together
GROUPS: dict[str, tuple[str, ...]] = _groups()
SETS: tuple[str, ...] = tuple(k.name for k in KNOBS if k.base is tuple)  # module-set knobs
LABELLED: tuple[Knob, ...] = tuple(k for k in KNOBS if k.label is not None)
# A table's knob columns: one per knob, parts inside their knob's value ("flex:deepep").
DISPLAYED: tuple[Knob, ...] = tuple(k for k in KNOBS if k.part_of is None)


def columns(varying: Iterable[str] = ()) -> list[str]:
    """The knob columns of a table: every shown knob, and the others named in `varying` (those whose
    value differs between the rows shown: else two rows would look alike), in registry order."""
    extra = set(varying)
    return [k.column for k in DISPLAYED if k.shown or k.column in extra]


def text(value: Any) -> str:
    """How one value prints: module sets '+'-joined ('none' when empty), None as 'none', floats short."""
    if isinstance(value, (tuple, list)):
        return "+".join(str(v) for v in value) or "none"
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def display(layout: Layout) -> dict[str, Any]:
    """Knob -> value as people and JSON see it: parts folded into their knob ('flex:deepep'), sets as lists.

    The keys are the knob names that are not part_of another, in registry order."""
    out: dict[str, Any] = {}
    for name, parts in FIELDS.items():
        value = getattr(layout, name)
        if parts[1:]:
            value = ":".join(str(v) for v in (getattr(layout, p) for p in parts) if v is not None)
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def label(values: Mapping[str, Any], before: Mapping[str, Any] | None = None) -> str:
    """'TP1 PP8 VPP1 CP1 EP64 ETP1 MBS1 rc=none alltoall' from display values (or a `compare` row); a knob
    that is not `shown` appears only off its default. With `before`, a changed knob reads 'CP2->4'."""
    out = []
    for k in LABELLED:
        now = text(values.get(k.name, k.default))
        was = now if before is None else text(before.get(k.name, k.default))
        if k.shown or now != text(k.default) or was != now:
            out.append(str(k.label).format(now if was == now else f"{was}->{now}"))
    return " ".join(out)


def column_value(k: Knob, value: Any) -> Any:
    """A knob's value as its ledger column holds it: module sets '+'-joined ('none' when empty)."""
    if k.base is tuple:
        return "+".join(value or ()) or "none"
    return value if value is None and k.nullable else k.base(value)


def ledger_columns(layout: Mapping[str, Any]) -> dict[str, Any]:
    """Ledger column -> value for a Layout.to_dict() (a missing knob takes its default)."""
    return {k.column: column_value(k, layout.get(k.name, k.default)) for k in KNOBS}


def search_fields() -> list[tuple[str, Any, Any]]:
    """(name, type, field) of each searched knob, for dataclasses.make_dataclass: a list of values each."""
    return [
        (
            k.name,
            list[list[str]] if k.base is tuple else types.GenericAlias(list, (k.type,)),
            ranged_list(_lists(k.search), **_search_range(k)),
        )
        for k in KNOBS
        if k.search is not None
    ]


def _search_range(k: Knob) -> dict[str, Any]:
    """A search list holds at least one value; a count knob's values are >= 1, a float knob's > 0."""
    if k.base is int:
        return {"lo": 1, "nonempty": True}
    if k.base is float:
        return {"gt": 0, "nonempty": True}
    return {"nonempty": True}


def _lists(values: tuple[Any, ...]) -> Callable[[], list[Any]]:
    """A default_factory: a fresh list of the values, module sets as lists (what YAML gives)."""
    return lambda: [list(v) if isinstance(v, tuple) else v for v in values]
