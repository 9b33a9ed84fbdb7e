"""The planner: (model, hardware, stage) -> legal candidates ranked by predicted step time, and the
rejected ones with the rules they break.

Why a knob-by-knob walk and not "enumerate, then check": a stage has tens of thousands of raw
layouts and most are illegal for reasons that read one or two knobs (TP=1 on the V4 path, E % EP).
Each rule sits at the first level of the walk where every knob it reads is bound; its verdicts are
tabulated once over the values of those knobs, and an illegal subtree is cut at that level. Only
survivors reach the argv checks and the analytic models (pipeline split, memory, step time), which
are memoised on the knobs they read.
Rejected subtrees are expanded lazily, when someone asks for `PlanResult.rejected`, so every
rejection still lists all the rules it violates.
"""

from __future__ import annotations

import itertools
import operator
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

from orchestrator.core.schema import HardwareConfig, ModelConfig, RecipeConfig, StageConfig
from orchestrator.plan import argv as argv_mod
from orchestrator.plan import flops, memory, moe, params, pipeline, ranks, space, steptime
from orchestrator.plan import rules as R
from orchestrator.plan.layout import Groups, Layout, Prediction, canonical_key
from orchestrator.plan.memory import StageMemory

CHEAP_PHASES = ("layout", "pattern")
# memory.stage_memory does not read these fields (the flex backend's buffers are sized alike, the
# rank order changes no group size); tests/plan/test_planner.py checks it, so its result is shared.
MEMORY_IGNORES = ("flex_backend", "use_tp_pp_dp_mapping")
MEMORY_READS = tuple(f for f in Layout.__dataclass_fields__ if f not in MEMORY_IGNORES)


@cache
def _getter(fields: tuple[str, ...]) -> Callable[[Layout], tuple[Any, ...]]:
    """A fast projection of a Layout onto `fields` (a tuple, also for one or no field)."""
    if not fields:
        return lambda _lay: ()
    get = operator.attrgetter(*fields)
    return (lambda lay: (get(lay),)) if len(fields) == 1 else get


@dataclass(init=False)
class Planned:
    """A legal, feasible layout, what the models predict for it, and its ledger key.

    Planned(layout, prediction, key). The planner leaves `key` (canonical_key) to be computed on first
    use: hashing every survivor of a large stage costs more than planning it, and most are never
    shown or stored.
    """

    layout: Layout
    prediction: Prediction

    def __init__(
        self,
        layout: Layout,
        prediction: Prediction,
        key: str | None = None,
        *,
        ident: tuple[str, str, str, str] = ("", "", "", ""),
    ):
        self.layout, self.prediction = layout, prediction
        self._key, self._ident = key, ident  # ident: model, stage, hardware, workload names

    @property
    def key(self) -> str:
        if self._key is None:
            model, stage, hardware, workload = self._ident
            self._key = canonical_key(self.layout, model=model, stage=stage, hardware=hardware, workload=workload)
        return self._key


@dataclass
class Rejected:
    layout: Layout
    rules: list[R.Rule]
    memory_gb: float | None = None  # set when the memory model ran (mem.exceeds_hbm)

    @property
    def rule_ids(self) -> list[str]:
        return [r.id for r in self.rules]


@dataclass
class PlanResult:
    candidates: list[Planned]  # feasible, by predicted step_time_s then memory_gb
    raw_count: int
    elapsed_s: float
    _late: list[Rejected] = field(default_factory=list, repr=False)  # argv/memory rejections
    _expand: Callable[[], list[Rejected]] | None = field(default=None, repr=False)
    _rejected: list[Rejected] | None = field(default=None, repr=False)

    @property
    def rejected(self) -> list[Rejected]:
        """Every rejected layout with all the rules it violates (expanded on first access)."""
        if self._rejected is None:
            early = self._expand() if self._expand else []
            self._rejected = early + self._late
        return self._rejected

    def why_empty(self, stage: StageConfig, top: int = 3) -> str:
        """For a stage with no legal, feasible layout: one line naming the rules that rejected most layouts."""
        counts: dict[str, int] = {}
        reasons: dict[str, str] = {}
        for r in self.rejected:
            for rule in r.rules:
                counts[rule.id] = counts.get(rule.id, 0) + 1
                reasons[rule.id] = rule.reason
        worst = "; ".join(
            f"{k} rejects {counts[k]:,} ({reasons[k]})" for k in sorted(counts, key=lambda k: (-counts[k], k))[:top]
        )
        return (
            f"stage {stage.name} has no legal layout that fits: all {self.raw_count:,} layouts of N={stage.gpus} "
            f"B={stage.global_batch} S={stage.seq_length} are rejected. Most often: {worst}. Fix the stage "
            f"(gpus, global_batch, search ranges) or the hardware; `plan --show-rejected` lists every rejection."
        )


class _Tables:
    """The memo tables of one (model, hardware, stage, recipe, routing spread): what the rules and the memory
    model say of a layout does not depend on the calibration (`factors`, `memory_factor`), so a sweep that
    re-plans its stage every round with new factors reads them again instead of recomputing them."""

    def __init__(self) -> None:
        self.split: dict[tuple[int, int], tuple[tuple[int, ...], str] | None] = {}
        self.spans: dict[tuple[int, ...], tuple[int, int, int, int]] = {}
        self.moe: dict[tuple[int, int, int], tuple[int, float, int]] = {}
        self.argv_memo: dict[tuple[str, tuple[Any, ...]], bool] = {}
        self.flops: dict[tuple[str, ...], flops.StepFlops] = {}
        self.mem: dict[tuple[Any, ...], tuple[list[memory.StageMemory], memory.StageMemory]] = {}
        self.terms: dict[int, tuple[dict[str, float], ...]] = {}  # id of a list held in mem -> its terms
        self.groups: dict[tuple[int, ...], Groups] = {}
        self.steps: dict[Layout, steptime.StepTime] = {}  # uncalibrated: the factors are applied per problem
        # the stage's walk: its cut subtrees and, in walk order, each leaf's argv rejection or its _Leaf (a
        # calibration re-plans only the memory phase and the predictions)
        self.no_offload: dict[Layout, Layout] = {}
        self.walk: tuple[_Walk, list[Any], list[_Leaf | Rejected], dict[Layout, _Leaf]] | None = None


# The last few planning problems' tables, keyed by the repr of every input they depend on (a config changed in
# place has a new repr, so it never reads another's tables).
_TABLES: OrderedDict[tuple[str, ...], _Tables] = OrderedDict()
_TABLES_KEPT = 4


def _tables_for(
    model: ModelConfig,
    hw: HardwareConfig,
    stage: StageConfig,
    recipe: RecipeConfig,
    routing_sigma: float,
    full_graph: bool = False,
) -> _Tables:
    key = (repr(model), repr(hw), repr(stage), repr(recipe), repr(routing_sigma), repr(full_graph))
    hit = _TABLES.get(key)
    if hit is None:
        hit = _TABLES[key] = _Tables()
        while len(_TABLES) > _TABLES_KEPT:
            _TABLES.popitem(last=False)
    else:
        _TABLES.move_to_end(key)
    return hit


class _Env:
    """One planning problem: its calibration, and the memo tables of its inputs (shared by every problem that
    differs from it only in calibration, `_tables_for`)."""

    def __init__(
        self,
        model: ModelConfig,
        hw: HardwareConfig,
        stage: StageConfig,
        factors: Mapping[str, float] | None,
        memory_factor: memory.MemoryScale,
        workload: str,
        recipe: RecipeConfig | None = None,
        routing_sigma: float = memory.DEFAULT_ROUTING_SIGMA,
        full_graph: bool = False,
    ):
        self.model, self.hw, self.stage = model, hw, stage
        self.routing_sigma, self.full_graph = routing_sigma, full_graph
        self.factors, self.memory_factor, self.workload = factors, memory_factor, workload
        self.recipe = recipe or argv_mod.DEFAULT_RECIPE
        self.rules = R.active(stage)  # every rule but those stage.lifted_rules lifts
        self.blocks = params.effective_layers(model, stage)
        self.domain = ranks.allocated_domain(hw.gpus_per_nvlink_domain, hw.gpus_per_node)
        t = _tables_for(model, hw, stage, self.recipe, routing_sigma, full_graph)
        self._split, self._spans, self._moe, self._argv_memo = t.split, t.spans, t.moe, t.argv_memo
        self._flops, self._mem, self._terms, self._groups = t.flops, t.mem, t.terms, t.groups
        self._steps = t.steps
        self._tables = t
        self._factors_by_set: dict[tuple[str, ...], tuple[float, float, float, float]] = {}
        self.tokens = stage.global_batch * stage.seq_length
        self.ident = (model.name, stage.name, hw.name, workload)

    def split(self, pp: int, vpp: int) -> tuple[tuple[int, ...], str] | None:
        """(blocks per segment, layer pattern) for PP x VPP segments; None if a segment would be empty."""
        key = (pp, vpp)
        if key not in self._split:
            segs = pp * vpp
            if self.blocks < segs:
                self._split[key] = None
            else:
                split = self._balanced_split(pp, segs)
                self._split[key] = (split, pipeline.layer_pattern(self.model, list(split)))
        return self._split[key]

    def _balanced_split(self, pp: int, segs: int) -> tuple[int, ...]:
        """Blocks per segment, balanced on per-block FLOPs (embedding on the first, head/loss/MTP on the
        last). With PP>1 the hash-routed layers stay in the first segment when possible (else
        mcore.hash_layers_first_segment reports the split that could not)."""
        costs, first, last = flops.block_costs(self.model, self.stage.seq_length, self.blocks)
        n_hash = self.model.moe_n_hash_layers if pp > 1 else 1
        try:
            return tuple(pipeline.split_blocks(self.blocks, segs, costs, first, last, min_first=max(1, n_hash)))
        except ValueError:
            return tuple(pipeline.split_blocks(self.blocks, segs, costs, first, last))

    def ctx(self, layout: Layout) -> R.Ctx:
        sp = self.split(layout.pp, layout.vpp)
        ctx = R.Ctx(
            self.model,
            self.stage,
            self.hw,
            layout,
            self.blocks,
            split=sp[0] if sp else None,
            pattern=sp[1] if sp else None,
        )
        gkey = (layout.tp, layout.pp, layout.cp, layout.ep, layout.etp, layout.mbs)
        g = self._groups.get(gkey)
        if g is None:
            g = self._groups[gkey] = ctx.groups
        else:
            ctx.__dict__["groups"] = g  # fills the cached_property: groups read only these six knobs
        return ctx

    def spans(self, lay: Layout) -> tuple[int, int, int, int]:
        """(ep_nodes, cp_nodes, ep_domains, cp_domains): hosts and NVLink domains one EP / CP group spans."""
        key = (lay.tp, lay.cp, lay.ep, lay.etp, lay.pp, lay.use_tp_pp_dp_mapping)
        if key not in self._spans:
            nodes = ranks.node_spans(lay, self.stage.gpus, self.stage.gpus_per_node)
            domains = (
                nodes
                if self.domain <= self.stage.gpus_per_node
                else ranks.domain_spans(lay, self.stage.gpus, self.domain)
            )
            self._spans[key] = (*nodes, *domains)
        return self._spans[key]

    def moe_shape(self, lay: Layout) -> tuple[int, float, int]:
        """(T_group, T_expert, experts per rank) for this EP, b, CP."""
        key = (lay.ep, lay.mbs, lay.cp)
        if key not in self._moe:
            tg = moe.t_group(lay.ep, lay.mbs, self.stage.seq_length, lay.cp)
            te = moe.t_expert(self.model.moe_router_topk, tg, self.model.num_experts)
            self._moe[key] = (tg, te, moe.experts_per_rank(self.model.num_experts, lay.ep))
        return self._moe[key]

    def argv(self, lay: Layout) -> tuple[str, ...] | None:
        sp = self.split(lay.pp, lay.vpp)
        if sp is None:
            return None
        return tuple(
            argv_mod.megatron_argv(
                self.model,
                self.stage,
                lay,
                layer_pattern=sp[1],
                train_iters=self.stage.warmup_iters + self.stage.measure_iters,
                recipe=self.recipe,
            )
        )

    def argv_violations(self, ctx: R.Ctx, rules: Sequence[R.Rule]) -> list[R.Rule]:
        """Argv rules, each checked once per combination of the knobs it declares (memoised): the
        flags argv.py emits for those knobs do not depend on the others (tests/plan/test_rules.py)."""
        bad = []
        for rule in rules:
            key = (rule.id, _getter(rule.needs)(ctx.layout))
            hit = self._argv_memo.get(key)
            if hit is None:
                if ctx.argv is None:
                    ctx.argv = self.argv(ctx.layout)
                    ctx.__dict__.pop("flags", None)
                hit = self._argv_memo[key] = rule.violated(ctx)
            if hit:
                bad.append(rule)
        return bad

    def no_offload(self, layout: Layout) -> Layout:
        """The layout without activation offload (memoised: every plan asks it of every offload layout)."""
        hit = self._tables.no_offload.get(layout)
        if hit is None:
            hit = self._tables.no_offload[layout] = replace(layout, offload=())
        return hit

    def walked(self, values: dict[str, list[Any]]) -> tuple[_Walk, list[Any], list[_Leaf | Rejected]]:
        """The stage's walk (its cut subtrees, then each leaf's argv verdict and raw memory), once per tables:
        `values` follow from the stage and recipe, which key the tables."""
        if self._tables.walk is None:
            walk = _Walk(self, values)
            late_rules, _ = _late_rules(self.rules)
            leaves: list[_Leaf | Rejected] = []
            cut = walk.run(lambda lay: leaves.append(self.legal_leaf(self.ctx(lay), late_rules)))
            passed = {x.ctx.layout: x for x in leaves if isinstance(x, _Leaf)}
            self._tables.walk = (walk, cut, leaves, passed)
        walk, cut, leaves, _ = self._tables.walk
        return walk, cut, leaves

    def memory(
        self, lay: Layout, g: Groups, split: tuple[int, ...]
    ) -> tuple[list[memory.StageMemory], memory.StageMemory]:
        """(per-rank StageMemory list, heaviest), memoised on every knob but MEMORY_IGNORES."""
        key = _getter(MEMORY_READS)(lay)
        hit = self._mem.get(key)
        if hit is None:
            mems = memory.stage_memory(
                self.model,
                self.hw,
                self.stage,
                lay,
                g,
                list(split),
                routing_sigma=self.routing_sigma,
                recipe=self.recipe,
            )
            hit = self._mem[key] = (mems, memory.heaviest(mems))
        return hit

    def terms(self, mems: list[StageMemory]) -> tuple[dict[str, float], ...]:
        """Raw per-rank memory terms (memory.TERMS), memoised with the StageMemory list they come from."""
        hit = self._terms.get(id(mems))
        if hit is None:
            hit = self._terms[id(mems)] = tuple(s.terms() for s in mems)
        return hit

    def step_flops(self, lay: Layout) -> flops.StepFlops:
        """flops.step_flops reads only the recompute set of the layout (model and stage are fixed)."""
        hit = self._flops.get(lay.recompute)
        if hit is None:
            hit = self._flops[lay.recompute] = flops.step_flops(self.model, self.stage, lay)
        return hit

    def verdict(self, layout: Layout, *, check_memory: bool = True) -> Planned | Rejected:
        """Every rule for one layout (the cheap ones first), then its predictions if it is legal."""
        walked = self._tables.walk
        leaf = walked[3].get(layout) if walked is not None else None
        if leaf is not None:  # the stage's walk passed it: only this calibration's memory phase is left
            return self.predict(leaf, _late_rules(self.rules)[1], check_memory=check_memory)
        ctx = self.ctx(layout)
        bad = R.violations(ctx, [r for r in self.rules if r.phase in CHEAP_PHASES])
        if bad:
            return Rejected(layout, bad)
        return self.finish(ctx, *_late_rules(self.rules), memo_argv=False, check_memory=check_memory)

    def finish(
        self,
        ctx: R.Ctx,
        late_rules: Sequence[R.Rule],
        mem_rules: Sequence[R.Rule],
        *,
        memo_argv: bool = True,
        check_memory: bool = True,
    ) -> Planned | Rejected:
        """Argv and memory phases, then every prediction, for a layout that passed the cheap rules.
        Without check_memory a layout over HBM is still predicted, marked not feasible."""
        leaf = self.legal_leaf(ctx, late_rules, memo_argv=memo_argv)
        if isinstance(leaf, Rejected):
            return leaf
        return self.predict(leaf, mem_rules, check_memory=check_memory)

    def legal_leaf(self, ctx: R.Ctx, late_rules: Sequence[R.Rule], *, memo_argv: bool = True) -> _Leaf | Rejected:
        """The argv phase and the raw memory model: what no calibration changes (a walk keeps them, `_Tables.walk`)."""
        lay = ctx.layout
        if late_rules:
            if memo_argv:
                bad = self.argv_violations(ctx, late_rules)
            else:
                ctx.argv = self.argv(lay)
                bad = R.violations(ctx, late_rules)
            if bad:
                return Rejected(lay, bad)
        if ctx.split is None:  # cannot happen: the pattern rules passed
            raise ValueError(f"{lay.short()}: no pipeline split")
        mems, heavy = self.memory(lay, ctx.groups, ctx.split)
        return _Leaf(ctx, mems, heavy, self.terms(mems), tuple(s.total for s in mems))

    def _term_factors(
        self, scale: Mapping[str, float], recompute: tuple[str, ...]
    ) -> tuple[float, float, float, float]:
        """This calibration's per-term memory factors for one recompute set (memory.term_factors), once per set."""
        hit = self._factors_by_set.get(recompute)
        if hit is None:
            hit = self._factors_by_set[recompute] = memory.term_factors(scale, recompute)
        return hit

    def predict(self, leaf: _Leaf, mem_rules: Sequence[R.Rule], *, check_memory: bool = True) -> Planned | Rejected:
        """The memory phase and every prediction under this calibration, for a layout the argv phase passed."""
        ctx, mems, heavy = leaf.ctx, leaf.mems, leaf.heavy
        lay, g, split = ctx.layout, ctx.groups, ctx.split
        d_a, d_e, m = g.sizes()  # legal: the group rules passed
        scale = self.memory_factor
        if isinstance(scale, Mapping):  # per-term factors can change which rank is heaviest
            f = self._term_factors(scale, lay.recompute)
            totals = [memory.scaled_total(t, f) for t in leaf.terms]
            top = max(range(len(mems)), key=lambda i: (totals[i], -i))
            heavy, ctx.memory_gb = mems[top], totals[top]
        else:
            ctx.memory_gb = heavy.total * scale
        over = R.violations(ctx, mem_rules)
        if over and check_memory:
            return Rejected(lay, over, memory_gb=ctx.memory_gb)
        by_stage = tuple(totals) if isinstance(scale, Mapping) else tuple(t * scale for t in leaf.totals)
        ep_nodes, cp_nodes, ep_domains, cp_domains = self.spans(lay)
        raw = self._steps.get(lay)
        if raw is None:
            raw = self._steps[lay] = steptime.step_time(
                self.model,
                self.hw,
                self.stage,
                lay,
                g,
                list(split or ()),
                ep_nodes,
                cp_nodes,
                recipe=self.recipe,
                routing_sigma=self.routing_sigma,
                ep_domains=ep_domains,
                cp_domains=cp_domains,
                full_graph=self.full_graph,
            )
        st = steptime.calibrated(raw, self.factors)
        fl = self.step_flops(lay)
        t_group, t_expert, per_rank = self.moe_shape(lay)
        pred = Prediction(
            d_a=d_a,
            d_e=d_e,
            m=m,
            bubble=pipeline.bubble(lay.pp, m, lay.vpp),
            t_group=t_group,
            t_expert=t_expert,
            experts_per_rank=per_rank,
            ep_nodes=ep_nodes,
            cp_nodes=cp_nodes,
            routed_weight_gb=heavy.routed_weights,
            heaviest_stage=heavy.stage,
            memory_gb=ctx.memory_gb,
            memory_by_stage=by_stage,
            memory_terms_by_stage=leaf.terms,
            feasible=not over,
            step_time_s=st.total_s,
            step_components=dict(st.components),
            flops_per_step=fl.model_flops,
            recompute_flops_per_step=fl.recompute_flops,
            mfu=flops.mfu(fl.model_flops, st.total_s, self.stage.gpus, self.hw, lay.precision),
            tokens_per_s=self.tokens / st.total_s if st.total_s > 0 else 0.0,
            layer_pattern=ctx.pattern or "",
            probe_step_s=st.probe_s,
        )
        return Planned(lay, pred, ident=self.ident)


@dataclass
class _Leaf:
    """A layout every calibration-free rule passed, with its raw memory model (per rank, heaviest, terms). Kept
    across plans: `predict` sets its ctx's memory_gb to the calibration at hand just before the memory rule reads
    it (planning runs on one thread; the lease's heartbeat thread plans nothing)."""

    ctx: R.Ctx
    mems: list[StageMemory]
    heavy: StageMemory
    terms: tuple[dict[str, float], ...]
    totals: tuple[float, ...]  # each rank's raw total (StageMemory.total), read by every calibration


def _late_rules(rules: Sequence[R.Rule] = R.RULES) -> tuple[tuple[R.Rule, ...], tuple[R.Rule, ...]]:
    return R.by_phase("argv", rules), R.by_phase("memory", rules)


def evaluate(
    model: ModelConfig,
    hw: HardwareConfig,
    stage: StageConfig,
    layout: Layout,
    *,
    factors: Mapping[str, float] | None = None,
    memory_factor: memory.MemoryScale = 1.0,
    workload: str = "",
    check_memory: bool = True,
    recipe: RecipeConfig | None = None,
    routing_sigma: float = memory.DEFAULT_ROUTING_SIGMA,
    full_graph: bool = False,
) -> Planned | Rejected:
    """Check one layout against every rule and, if legal, predict it. Used by the policy and the twin.

    check_memory=False skips the memory rule (the policy's raw model needs the components of a layout
    over HBM too); the Planned then says `feasible=False` when it does not fit. recipe: the workload's
    training recipe (None: its defaults); its flags and overlaps feed the argv rules and the step time.
    routing_sigma: the per-expert load spread the memory and step-time models assume (0: force-balanced routing,
    as Megatron-Bridge's published benchmarks run). full_graph: the step runs as one CUDA graph (steptime.step_time:
    validate's rows that ran one; argv never emits it)."""
    env = _Env(model, hw, stage, factors, memory_factor, workload, recipe, routing_sigma, full_graph)
    res = env.verdict(layout, check_memory=check_memory)
    if check_memory and isinstance(res, Planned) and _offload_not_needed(env, layout):
        return Rejected(layout, [R.OFFLOAD_NOT_NEEDED], res.prediction.memory_gb)
    return res


class _Walk:
    """The knob-by-knob walk over a stage's search space (see the module docstring).

    Each cheap rule sits at the level of the deepest knob it reads. Its verdicts are tabulated once
    over the product of the values of the knobs it reads (a few hundred entries at most), so the
    walk itself only builds tuples and looks them up; a Layout is built only for legal leaves.
    """

    def __init__(self, env: _Env, values: dict[str, list[Any]]):
        self.env, self.values = env, values
        self.knobs = space.KNOBS
        level = {k: i for i, k in enumerate(self.knobs)}
        self.order = {r.id: i for i, r in enumerate(env.rules)}
        by_level: dict[int, list[R.Rule]] = {}
        for rule in env.rules:
            if rule.phase in CHEAP_PHASES:
                lv = max((level[space.FIELD_KNOB[f]] for f in rule.needs), default=-1)
                by_level.setdefault(lv, []).append(rule)
        root = by_level.pop(-1, [])
        self.root_bad = R.violations(env.ctx(Layout()), root)
        # level -> (knobs read, {their values: violated rules})
        self.tables: list[tuple[tuple[str, ...], dict[tuple[Any, ...], list[R.Rule]]] | None] = [None] * len(self.knobs)
        for lv, rules in by_level.items():
            read = {space.FIELD_KNOB[f] for r in rules for f in r.needs}
            knobs = tuple(k for k in self.knobs if k in read)
            table = {}
            for combo in itertools.product(*(values[k] for k in knobs)):
                ctx = env.ctx(space.make_layout(dict(zip(knobs, combo))))
                table[combo] = R.violations(ctx, rules)
            self.tables[lv] = (knobs, table)

    def run(self, on_leaf: Callable[[Layout], None]) -> list[tuple[dict[str, Any], list[R.Rule], int]]:
        """Walk with pruning: call on_leaf for each legal leaf; return the cut subtrees."""
        if self.root_bad:
            return [({}, list(self.root_bad), -1)]
        cut: list[tuple[dict[str, Any], list[R.Rule], int]] = []
        last = len(self.knobs) - 1
        knobs, values, tables = self.knobs, self.values, self.tables

        def go(level: int, assign: dict[str, Any]) -> None:
            knob, tab = knobs[level], tables[level]
            for v in values[knob]:
                assign[knob] = v
                bad = tab[1][tuple([assign[k] for k in tab[0]])] if tab else None
                if bad:
                    cut.append((dict(assign), bad, level))
                elif level == last:
                    on_leaf(space.make_layout(assign))
                else:
                    go(level + 1, assign)
            del assign[knob]

        go(0, {})
        return cut

    def expand(self, cut: Sequence[tuple[dict[str, Any], list[R.Rule], int]]) -> list[Rejected]:
        """Every leaf under the cut subtrees, with all the rules it violates (no pruning).

        Levels above a cut broke no rule (else the walk had cut there), so a leaf's rules are the
        cut's plus those of the levels below it, gathered on the way down.
        """
        out: list[Rejected] = []
        knobs, values, tables, order = self.knobs, self.values, self.tables, self.order
        last = len(knobs) - 1

        def down(level: int, assign: dict[str, Any], acc: list[R.Rule]) -> None:
            if level > last:
                rules = sorted(acc, key=lambda r: order[r.id]) if len(acc) > 1 else list(acc)
                out.append(Rejected(space.make_layout(assign), rules))
                return
            knob, tab = knobs[level], tables[level]
            for v in values[knob]:
                assign[knob] = v
                down(level + 1, assign, acc + tab[1][tuple([assign[k] for k in tab[0]])] if tab else acc)
            del assign[knob]

        for assign, bad, level in cut:
            down(level + 1, dict(assign), list(self.root_bad) + (bad if level >= 0 else []))
        return out


def _offload_not_needed(env: _Env, layout: Layout, fits: set[Layout] | None = None) -> bool:
    """rules.OFFLOAD_NOT_NEEDED: `layout` offloads, and the same layout without offload is legal and fits. `fits`:
    the no-offload layouts a plan found legal and fitting, when its search enumerated every sibling; otherwise
    the sibling is checked here (evaluate() and the walk give one verdict: tests/plan/test_planner.py)."""
    if not layout.offload:
        return False
    sibling = env.no_offload(layout)
    if fits is not None:
        return sibling in fits
    return isinstance(env.verdict(sibling), Planned)


def _offload_where_needed(env: _Env, planned: list[Planned], late: list[Rejected], every: bool) -> list[Planned]:
    """The planned layouts less each offload layout whose no-offload sibling is legal and fits (it moves to `late`,
    rejected by rules.OFFLOAD_NOT_NEEDED): offload only buys memory, so it stays only where it is what fits.
    every: the search holds no offload (`[]`), so every sibling was planned or rejected here already."""
    fits = {p.layout for p in planned if not p.layout.offload} if every else None
    keep: list[Planned] = []
    for p in planned:
        if _offload_not_needed(env, p.layout, fits):
            late.append(Rejected(p.layout, [R.OFFLOAD_NOT_NEEDED], p.prediction.memory_gb))
        else:
            keep.append(p)
    return keep


def plan(
    model: ModelConfig,
    hw: HardwareConfig,
    stage: StageConfig,
    *,
    factors: Mapping[str, float] | None = None,
    memory_factor: memory.MemoryScale = 1.0,
    workload: str = "",
    recipe: RecipeConfig | None = None,
    routing_sigma: float = memory.DEFAULT_ROUTING_SIGMA,
    full_graph: bool = False,
) -> PlanResult:
    """Every layout of stage.search: the feasible ones ranked, the rest rejected with rule ids. recipe,
    routing_sigma and full_graph: as in evaluate()."""
    t0 = time.perf_counter()
    env = _Env(model, hw, stage, factors, memory_factor, workload, recipe, routing_sigma, full_graph)
    values = space.knob_values(stage.search, env.recipe)
    walk, cut, leaves = env.walked(values)
    _, mem_rules = _late_rules(env.rules)
    planned: list[Planned] = []
    late: list[Rejected] = []
    for leaf in leaves:
        res = leaf if isinstance(leaf, Rejected) else env.predict(leaf, mem_rules)
        if isinstance(res, Planned):
            planned.append(res)
        else:
            late.append(res)
    planned = _offload_where_needed(env, planned, late, every=() in values["offload"])
    planned.sort(key=lambda p: (p.prediction.step_time_s, p.prediction.memory_gb))  # stable: walk order on ties
    raw = space.raw_count(stage.search, env.recipe)
    return PlanResult(
        candidates=planned,
        raw_count=raw,
        elapsed_s=time.perf_counter() - t0,
        _late=late,
        _expand=lambda: walk.expand(cut),
    )
