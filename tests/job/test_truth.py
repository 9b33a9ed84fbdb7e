"""The twin's truth (orchestrator/job/twin/truth/) is a machine of its own: not the planner, seeded, per-component."""

from __future__ import annotations

import ast
import dataclasses
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config import compose
from orchestrator.core.schema import TwinConfig, TwinSurface
from orchestrator.job.twin import truth
from orchestrator.job.twin.truth.surfaces import DRAWS, quirks
from orchestrator.plan import planner

ROOT = Path(__file__).resolve().parents[2]
TRUTH = ROOT / "orchestrator" / "job" / "twin" / "truth"


def _module_file(name: str) -> Path | None:
    """The repository file of a dotted module name, or None when it is not ours (stdlib, site-packages)."""
    base = ROOT.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _imports(path: Path) -> set[str]:
    """Dotted names a module imports (absolute and relative), with every parent package it initialises."""
    pkg = ".".join(path.relative_to(ROOT).with_suffix("").parts)  # a.b.c (a module) or a.b.__init__
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                mod = ".".join(pkg.split(".")[: -node.level] + ([mod] if mod else []))
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return {".".join(n.split(".")[:i]) for n in out for i in range(1, n.count(".") + 2)}


def test_truth_imports_nothing_from_the_planner_transitively():
    """Every module orchestrator/job/twin/truth* reaches, through any chain of imports of repository modules, is
    outside orchestrator/plan/: the grep, then Python's own answer."""
    seen: set[Path] = set()
    todo = sorted(TRUTH.glob("*.py")) + sorted((ROOT / "orchestrator" / "job" / "twin").glob("truth*.py"))
    reached = []
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(path):
            f = _module_file(name)
            if f is not None:
                reached.append(name)
                todo.append(f)
    assert any(n.startswith("orchestrator.core.schema") for n in reached)  # the walk does follow imports
    assert not [n for n in reached if n.startswith("orchestrator.plan")]
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, orchestrator.job.twin.truth; print([m for m in sys.modules if 'orchestrator.plan' in m])",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == "[]"


def test_every_surface_has_its_constants_and_they_differ():
    assert set(DRAWS) == set(TwinSurface)
    drawn = {s: quirks(s, 0) for s in TwinSurface}
    assert len({repr(q) for q in drawn.values()}) == len(TwinSurface)
    assert quirks("gemm", 0) == quirks(TwinSurface.gemm, 0) != quirks("gemm", 1)


@pytest.fixture(scope="module")
def grid8k():
    """Every legal 8k layout (Megatron's rules, any memory) with the pattern the sweep would send. Full recompute
    included (the rules a Megatron fix lifts, lifted): the truth's memory is the machine's, whichever Megatron."""
    cfg = compose(["+stage=8k", "+stage.lifted_rules=[v4.full_recompute_hash_mhc]"]).cfg
    legal = planner.plan(cfg.model, dataclasses.replace(cfg.hardware, hbm_gb=math.inf), cfg.stage).candidates
    return cfg, legal


def _surfaces(cfg, legal, surface, seed):
    tw = TwinConfig(surface=surface, seed=seed)
    return [
        truth.evaluate(truth.Case(cfg.model, cfg.hardware, cfg.stage, tw, c.layout, c.prediction.layer_pattern))
        for c in legal
    ]


@pytest.mark.long
@pytest.mark.parametrize("surface", list(TwinSurface))
def test_seed_moves_the_optimum(grid8k, surface):
    """twin.seed draws the surface's constants: the fastest layout that fits changes, not only the noise."""
    cfg, legal = grid8k
    best = set()
    for seed in range(4):
        s = _surfaces(cfg, legal, surface, seed)
        fit = [i for i, x in enumerate(s) if max(x.stage_gb) <= cfg.hardware.hbm_gb]
        best.add(legal[min(fit, key=lambda i: s[i].step_s)].key)
        if len(best) > 1:
            return
    pytest.fail(f"surface {surface}: seeds 0-3 share one optimum")


@pytest.mark.long
@pytest.mark.parametrize("surface", list(TwinSurface))
def test_truth_is_not_the_planner_times_a_constant(grid8k, surface):
    """Measured over predicted step time spreads widely across layouts (no global factor explains it), and
    the truth's fastest layout is not the planner's first choice."""
    cfg, legal = grid8k
    s = _surfaces(cfg, legal, surface, 0)
    ratios = [x.step_s / c.prediction.step_time_s for x, c in zip(s, legal, strict=True)]
    assert statistics.pstdev(ratios) / statistics.fmean(ratios) > 0.15
    assert max(ratios) / min(ratios) > 2.0


@pytest.mark.long
def test_memory_surface_errs_per_component(grid8k):
    """On the memory surface the truth/planner memory ratio depends on the recompute set (activations are off
    per component, not by one factor), and some layout the planner calls over HBM fits."""
    cfg, legal = grid8k
    for seed in range(3):
        s = _surfaces(cfg, legal, "memory", seed)
        by_rc: dict[str, list[float]] = {}
        for x, c in zip(s, legal, strict=True):
            by_rc.setdefault("+".join(c.layout.recompute) or "none", []).append(
                max(x.stage_gb) / c.prediction.memory_gb
            )
        medians = {rc: statistics.median(v) for rc, v in by_rc.items()}
        assert max(medians.values()) / min(medians.values()) > 1.3, medians
        pruned_but_fits = [
            c
            for x, c in zip(s, legal, strict=True)
            if c.prediction.memory_gb + cfg.stage.memory_margin_gb > cfg.hardware.hbm_gb >= max(x.stage_gb)
        ]
        if pruned_but_fits:
            return
    pytest.fail("no seed of the memory surface fits a layout the planner prunes")


def _pairs(cfg, legal, surface, seed, module="moe_act"):
    """(with, without) `module` recompute, every other knob equal: (layout, its truth) each."""
    s = _surfaces(cfg, legal, surface, seed)
    by: dict[str, dict[bool, tuple]] = {}
    for c, x in zip(legal, s, strict=True):
        rest = dataclasses.replace(c.layout, recompute=tuple(m for m in c.layout.recompute if m != module))
        by.setdefault(repr(rest), {})[module in c.layout.recompute] = (c, x)
    return [(d[True], d[False]) for d in by.values() if len(d) == 2]


@pytest.mark.long
@pytest.mark.parametrize("surface", ["overcharged", "sibling"])
def test_overcharged_recompute_saves_5_to_10x_less_than_the_planner_charges(grid8k, surface):
    """Issue 48: the planner charged 25-65 GB for dropping moe_act recompute where the truth was 4.7 GB. On these
    surfaces the planner's charge over the truth's is 4-12x on every sibling pair (5-10x, the allocator's reserve
    aside); on `balanced` it is about 1x."""
    cfg, legal = grid8k

    def charges(surf: str) -> list[float]:
        out = []
        for (c1, x1), (c0, x0) in _pairs(cfg, legal, surf, 0):
            true = max(x0.stage_gb) - max(x1.stage_gb)
            if true > 0.1:
                out.append((c0.prediction.memory_gb - c1.prediction.memory_gb) / true)
        return out

    over = charges(surface)
    assert over and min(over) >= 4.0 and max(over) <= 12.0, (min(over), max(over))
    assert statistics.median(charges("balanced")) < 2.0


@pytest.mark.long
def test_sibling_optimum_is_one_recompute_module_from_a_slower_sibling(grid8k):
    """On `sibling`'s held-out seeds (tests/bench/bench_search.py HELDOUT) the fastest layout that fits is
    over-charged by the planner (tens of GB), and its nearest sibling in the recompute knob (every other knob equal)
    also fits and is 1.5-6% slower: measuring the sibling and not the optimum misses the 2% goal. (Not every seed:
    on some the optimum keeps mhc+mla_up_proj and no sibling fits near it.)"""
    cfg, legal = grid8k
    hbm = cfg.hardware.hbm_gb
    for seed in (100, 101):
        s = _surfaces(cfg, legal, "sibling", seed)
        fit = [i for i, x in enumerate(s) if max(x.stage_gb) <= hbm]
        b = min(fit, key=lambda i: s[i].step_s)
        opt = dataclasses.replace(legal[b].layout, recompute=())
        assert legal[b].prediction.memory_gb - max(s[b].stage_gb) >= 10.0, seed
        near = min(
            s[i].step_s / s[b].step_s - 1
            for i in fit
            if i != b and dataclasses.replace(legal[i].layout, recompute=()) == opt
        )
        assert 0.015 <= near <= 0.06, (seed, legal[b].layout.short(), near)


@pytest.mark.long
def test_deterministic_and_surfaces_disagree(grid8k):
    cfg, legal = grid8k
    c = legal[0]
    steps = {}
    for surface in TwinSurface:
        tw = TwinConfig(surface=surface, seed=7)
        case = truth.Case(cfg.model, cfg.hardware, cfg.stage, tw, c.layout, c.prediction.layer_pattern)
        assert truth.evaluate(case) == truth.evaluate(case)
        steps[surface] = truth.evaluate(case).step_s
    assert len(set(steps.values())) == len(steps)


def test_unknown_surface_is_one_error_line():
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "plan", "+stage=smoke", "workload.twin.surface=nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and not proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "workload.twin.surface" in lines[0]
    assert all(s.value in lines[0] for s in TwinSurface)  # names the choices: the fix


@pytest.mark.long
def test_imbalance_surface_slows_one_stage_of_a_flop_balanced_split(grid8k):
    """The planner splits blocks to balance its FLOPs; on the imbalance surface block kinds and the head cost
    differently, so the slowest stage runs well above the mean (it paces every microbatch)."""
    cfg, legal = grid8k
    deep = [i for i, c in enumerate(legal) if c.layout.pp >= 8]
    skew = {}
    for surface in ("balanced", "imbalance"):
        s = _surfaces(cfg, [legal[i] for i in deep], surface, 0)
        skew[surface] = statistics.median(max(x.stage_s) / statistics.fmean(x.stage_s) for x in s)
    assert skew["imbalance"] > 1.15 and skew["imbalance"] > skew["balanced"] + 0.05, skew
