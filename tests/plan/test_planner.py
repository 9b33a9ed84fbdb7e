"""The planner: the guide's configs A, B, C come out with the guide's numbers; every legal candidate
obeys the folding identity and the Megatron arithmetic; the pruned walk agrees with evaluate()."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.config import compose
from orchestrator.core.schema import HardwareConfig, ModelConfig, SearchConfig, StageConfig
from orchestrator.plan import pipeline, space
from orchestrator.plan import rules as R
from orchestrator.plan.layout import Layout
from orchestrator.plan.planner import Planned, Rejected, evaluate, plan

# The guide's A, B, C fit only with full recompute, which dev d48bd6be0a85 cannot run with hash layers + mHC
# (v4.full_recompute_hash_mhc): their tests plan as on a checkout with the fix (PR #6704), the rule lifted.
FIXED = (f"+stage.lifted_rules=[{R.FULL_RECOMPUTE_HASH_MHC}]",)


@cache
def cfg(stage: str, hardware: str = "h100", overrides: tuple[str, ...] = FIXED):
    return compose([f"+stage={stage}", f"hardware={hardware}", *overrides]).cfg


@cache
def planned(stage: str, hardware: str = "h100", overrides: tuple[str, ...] = FIXED):
    c = cfg(stage, hardware, overrides)
    return plan(c.model, c.hardware, c.stage)


def find(res, **knobs):
    hits = [p for p in res.candidates if all(getattr(p.layout, k) == v for k, v in knobs.items())]
    assert hits, f"no legal candidate with {knobs}"
    return hits


# The guide fixes TP1 PP8 EP64 ETP1 b=1 for A, B, C; it leaves recompute and dispatcher open.
GUIDE = dict(tp=1, pp=8, vpp=1, etp=1, ep=64, mbs=1, dispatcher="alltoall", offload=())


@pytest.mark.long
def test_config_a_on_1k():
    """A is legal on 1k; on h100 (80 GB) only the memory rule rejects it, so the test plans on h200.

    The memory model puts A's heaviest rank (PP rank 0: 8 blocks, 1F1B keeps 8 microbatches of
    b x S = 8192 tokens alive) at ~136 GB even with full recompute (two 4-stream layer inputs per block),
    ~527 GB without. The guide itself only claims A, B, C satisfy the group and batch arithmetic, not that
    they fit in memory.
    """
    c = cfg("1k")
    on_h100 = evaluate(c.model, c.hardware, c.stage, Layout(pp=8, cp=1, ep=64, recompute=("full",)))
    assert isinstance(on_h100, Rejected) and on_h100.rule_ids == ["mem.exceeds_hbm"]
    a = find(planned("1k", "h200"), cp=1, **GUIDE)[0]
    p = a.prediction
    assert (p.d_a, p.d_e, p.m) == (128, 2, 32)
    assert round(p.bubble, 3) == 0.179
    assert (p.t_group, p.t_expert) == (524288, 8192)
    assert p.experts_per_rank == 6
    assert p.feasible and p.memory_gb + c.stage.memory_margin_gb <= 141.0


@pytest.mark.long
def test_configs_b_and_c_on_8k():
    """C fits an H100 with full recompute; B with FP32 optimizer state does not (~89 GB: full recompute keeps two
    layer inputs per block), so only the memory rule rejects it on h100, while B with the V4 recipe's BF16 main
    grads and moments (~74 GB) fits; B is planned on h200."""
    c8 = cfg("8k")
    b_full = Layout(pp=8, cp=1, ep=64, recompute=("full",))
    on_h100 = evaluate(c8.model, c8.hardware, c8.stage, replace(b_full, optim="fp32"))
    assert isinstance(on_h100, Rejected) and on_h100.rule_ids == ["mem.exceeds_hbm"]
    bf16 = replace(b_full, optim="bf16")  # the V4 recipe's optimizer precision (workload.recipe.optim=[bf16])
    assert isinstance(evaluate(c8.model, c8.hardware, c8.stage, bf16), Planned)
    assert find(planned("8k"), cp=4, **GUIDE, recompute=("full",))[0].prediction.feasible  # C on h100
    b = find(planned("8k", "h200"), cp=1, **GUIDE)[0]
    c = find(planned("8k"), cp=4, **GUIDE)[0]
    assert (b.prediction.d_a, b.prediction.d_e, b.prediction.m) == (1024, 16, 4)
    assert round(b.prediction.bubble, 3) == 0.636
    assert (c.prediction.d_a, c.prediction.d_e, c.prediction.m) == (256, 16, 16)
    assert round(c.prediction.bubble, 3) == 0.304
    assert (c.prediction.t_group, c.prediction.t_expert) == (131072, 2048)
    assert b.prediction.t_group == 524288 and b.prediction.t_expert == 8192


@pytest.mark.long
@pytest.mark.parametrize("stage", ["1k", "8k", "16k"])
def test_no_full_recompute_is_planned_while_the_rule_holds(stage):
    """On dev d48bd6be0a85 (the rule held, the default) no candidate recomputes fully; each full-recompute
    layout is rejected with the rule; lifted (the fix found), the same stage plans them again."""
    held = planned(stage, "h200", ())
    assert held.candidates and not [p for p in held.candidates if "full" in p.layout.recompute]
    full = [r for r in held.rejected if "full" in r.layout.recompute and len(r.layout.recompute) == 1]
    assert full and all(R.FULL_RECOMPUTE_HASH_MHC in r.rule_ids for r in full)
    lifted = planned(stage, "h200")
    assert [p for p in lifted.candidates if "full" in p.layout.recompute]
    held_keys = {p.key for p in held.candidates}
    assert held_keys < {p.key for p in lifted.candidates}  # lifting adds candidates, removes none


def test_config_b_with_vpp_is_rejected_by_the_vpp_rule():
    c = cfg("8k")
    res = evaluate(c.model, c.hardware, c.stage, Layout(pp=8, vpp=2, cp=1, ep=64))
    assert isinstance(res, Rejected)
    assert "mcore.vpp_group_bounds" in res.rule_ids
    listed = [r for r in planned("8k").rejected if r.layout == Layout(pp=8, vpp=2, cp=1, ep=64)]
    assert listed and "mcore.vpp_group_bounds" in listed[0].rule_ids


@pytest.mark.long
def test_candidates_are_ranked_and_complete():
    res = planned("1k")
    times = [(p.prediction.step_time_s, p.prediction.memory_gb) for p in res.candidates]
    assert times == sorted(times)
    assert res.raw_count == len(res.candidates) + len(res.rejected)
    st_ = cfg("1k").stage
    for p in res.candidates[:50]:
        pr = p.prediction
        assert pr.feasible and pr.step_time_s > 0 and 0 < pr.mfu < 1
        assert pr.tokens_per_s == pytest.approx(st_.global_batch * st_.seq_length / pr.step_time_s)
        assert len(pr.memory_by_stage) >= p.layout.pp and max(pr.memory_by_stage) == pytest.approx(pr.memory_gb)
        assert pr.flops_per_step > 0 and pr.step_components and pr.layer_pattern
        assert len(p.key) == 32


def test_memory_factor_only_removes_candidates():
    c = cfg("1k")
    base = planned("1k")
    tight = plan(c.model, c.hardware, c.stage, memory_factor=1.5)
    assert len(tight.candidates) <= len(base.candidates)
    keys = {p.key for p in base.candidates}
    assert {p.key for p in tight.candidates} <= keys
    mem = {r.layout for r in tight.rejected if "mem.exceeds_hbm" in r.rule_ids}
    assert len(mem) >= len(base.candidates) - len(tight.candidates)


@pytest.mark.long
@pytest.mark.parametrize("stage", ["smoke", "8k"])
def test_walk_agrees_with_evaluate_on_every_layout(stage):
    """The pruned knob-by-knob walk and the one-layout check give the same verdict and rule ids."""
    c = cfg(stage)
    res = plan(c.model, c.hardware, c.stage)
    verdict = {p.layout: ("ok", p.key) for p in res.candidates}
    verdict.update({r.layout: ("bad", tuple(r.rule_ids)) for r in res.rejected})
    layouts = list(space.enumerate_layouts(c.stage.search))
    assert len(verdict) == len(layouts) == res.raw_count
    for lay in layouts:
        one = evaluate(c.model, c.hardware, c.stage, lay)
        got = ("ok", one.key) if isinstance(one, Planned) else ("bad", tuple(one.rule_ids))
        assert got == verdict[lay], lay.short()


# ---- properties of every legal candidate, over small random search spaces ----
_search = st.builds(
    SearchConfig,
    tp=st.just([1]),
    pp=st.lists(st.sampled_from([1, 2, 4, 8, 16]), min_size=1, max_size=3, unique=True),
    vpp=st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=2, unique=True),
    cp=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=2, unique=True),
    ep=st.lists(st.sampled_from([8, 16, 32, 48, 64, 96, 128, 256, 384]), min_size=1, max_size=3, unique=True),
    etp=st.lists(st.sampled_from([1, 2]), min_size=1, max_size=2, unique=True),
    mbs=st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=2, unique=True),
    recompute=st.just([[], ["moe_act"]]),
    offload=st.just([[]]),
    dispatcher=st.just(["alltoall", "flex:hybridep"]),
)


@settings(max_examples=30, deadline=None)
@given(search=_search, gpus=st.sampled_from([256, 1024, 2048, 8192]), batch=st.sampled_from([1024, 4096, 6144]))
def test_legal_candidates_obey_the_arithmetic(search, gpus, batch):
    check_arithmetic(search, gpus, batch)


def test_the_arithmetic_check_is_not_vacuous():
    search = SearchConfig(
        tp=[1],
        pp=[4, 8, 16],
        vpp=[1, 2],
        cp=[1, 4],
        ep=[32, 64, 96],
        etp=[1, 2],
        mbs=[1, 2],
        recompute=[[], ["moe_act"]],
        offload=[[]],
        dispatcher=["alltoall"],
    )
    assert check_arithmetic(search, 1024, 4096) > 50


def check_arithmetic(search: SearchConfig, gpus: int, batch: int) -> int:
    """Every legal candidate's group arithmetic and pattern; returns how many there were."""
    model = ModelConfig()
    hw = HardwareConfig(hbm_gb=1e6)  # memory is not what this property is about
    stage = StageConfig(name="prop", gpus=gpus, global_batch=batch, search=search)
    res = plan(model, hw, stage)
    assert res.raw_count == space.raw_count(search) == len(res.candidates) + len(res.rejected)
    for p in res.candidates:
        lay, pr = p.layout, p.prediction
        per_stage = gpus // lay.pp
        assert gpus % lay.pp == 0
        assert per_stage == lay.tp * lay.cp * pr.d_a == lay.etp * lay.ep * pr.d_e  # folding, both grids
        assert model.num_experts % lay.ep == 0
        assert batch % (lay.mbs * pr.d_a) == 0 and pr.m == batch // (lay.mbs * pr.d_a) >= 1
        blocks = pipeline.count_blocks(pr.layer_pattern)
        assert len(blocks) == lay.pp * lay.vpp and sum(blocks) == 61 and min(blocks) >= 1
        if lay.vpp > 1:
            assert lay.pp <= pr.m and pr.m % lay.pp == 0
    return len(res.candidates)


def test_memory_model_ignores_what_the_memo_ignores():
    """plan() shares one memory result across MEMORY_IGNORES; stage_memory must indeed not read them."""
    from orchestrator.plan import memory
    from orchestrator.plan.layout import groups
    from orchestrator.plan.planner import MEMORY_IGNORES

    c = cfg("8k")
    base = Layout(pp=8, cp=4, ep=64, recompute=("full",), dispatcher="flex", flex_backend="deepep")
    split = [8] * 7 + [5]
    ref = memory.stage_memory(c.model, c.hardware, c.stage, base, groups(base, 8192, 4096), split)
    for other in (dict(flex_backend="hybridep"), dict(flex_backend="ncclep"), dict(use_tp_pp_dp_mapping=True)):
        assert set(other) <= set(MEMORY_IGNORES)
        lay = replace(base, **other)
        assert memory.stage_memory(c.model, c.hardware, c.stage, lay, groups(lay, 8192, 4096), split) == ref


def test_h200_keeps_at_least_what_h100_keeps():
    a = {p.layout for p in planned("1k").candidates}
    b = {p.layout for p in planned("1k", "h200").candidates}
    assert a <= b


def test_a_stage_level_violation_rejects_everything_with_its_rule():
    c = cfg("smoke")
    stage = replace(c.stage, deterministic_mode=True)
    res = plan(c.model, c.hardware, stage)
    assert res.candidates == [] and len(res.rejected) == res.raw_count
    assert all("v4.no_deterministic_packed" in r.rule_ids for r in res.rejected)
    assert any(len(r.rules) > 1 for r in res.rejected)  # the other rules are still listed


def test_memory_rejections_carry_the_predicted_memory():
    c = cfg("1k")
    mem = [r for r in planned("1k").rejected if r.rule_ids == ["mem.exceeds_hbm"]]
    assert mem and all(r.memory_gb + c.stage.memory_margin_gb > c.hardware.hbm_gb for r in mem)


def _fingerprint(res) -> tuple:
    return (
        [(p.layout, repr(p.prediction)) for p in res.candidates],
        [(r.layout, r.rule_ids, r.memory_gb) for r in res.rejected],
    )


def test_a_calibrated_plan_after_an_uncalibrated_one_is_the_cold_plan(monkeypatch):
    """The tables one planning problem shares with the next (planner._tables_for: rules, memory, raw step) are
    calibration-free: planning with factors after planning without gives what a cold planner gives."""
    from orchestrator.plan import planner

    c = cfg("smoke")
    factors, mem = {"compute": 1.3, "a2a": 0.7, "bubble": 1.2}, {"activations": 1.4, "states": 0.9}
    monkeypatch.setattr(planner, "_TABLES", type(planner._TABLES)())
    cold = _fingerprint(plan(c.model, c.hardware, c.stage, factors=factors, memory_factor=mem))
    monkeypatch.setattr(planner, "_TABLES", type(planner._TABLES)())
    plan(c.model, c.hardware, c.stage)
    warm = _fingerprint(plan(c.model, c.hardware, c.stage, factors=factors, memory_factor=mem))
    assert len(planner._TABLES) == 1  # the second plan read the first's tables
    assert warm == cold and cold != _fingerprint(plan(c.model, c.hardware, c.stage))


def test_evaluate_after_a_plan_reads_its_walk_and_gives_the_cold_verdict(monkeypatch):
    """evaluate() of a layout the stage's walk passed reuses the walk's leaf (planner._Env.verdict): under a new
    calibration, with and without the HBM rule, it gives what a cold evaluate gives, and its memory under per-term
    factors is memory.scaled_terms' float."""
    from orchestrator.plan import memory, planner

    c = cfg("smoke")
    factors, mem = {"compute": 1.3, "a2a": 0.7}, {"activations": 1.4, "states": 0.9, "activations@*": 1.1}
    monkeypatch.setattr(planner, "_TABLES", type(planner._TABLES)())
    layouts = [p.layout for p in plan(c.model, c.hardware, c.stage).candidates][:20]
    assert layouts

    def verdicts() -> list:
        out = []
        for lay in layouts:
            for check in (True, False):
                res = evaluate(
                    c.model, c.hardware, c.stage, lay, factors=factors, memory_factor=mem, check_memory=check
                )
                out.append((lay, check, res.prediction if isinstance(res, Planned) else res.rule_ids))
        return out

    warm = verdicts()
    assert planner._TABLES[next(iter(planner._TABLES))].walk is not None  # the plan above walked the stage
    monkeypatch.setattr(planner, "_TABLES", type(planner._TABLES)())
    assert verdicts() == warm
    for _, _, pred in warm:
        if not isinstance(pred, list):
            for terms, gb in zip(pred.memory_terms_by_stage, pred.memory_by_stage, strict=True):
                assert gb == memory.scaled_terms(terms, mem, ())  # the same float, not a close one


def test_a_config_changed_in_place_reads_no_stale_table(monkeypatch):
    """The tables are keyed by the configs' contents: a stage whose sequence length changed in place plans anew."""
    from orchestrator.plan import planner

    c = compose(["+stage=smoke"]).cfg
    before = plan(c.model, c.hardware, c.stage)
    c.stage.seq_length //= 2
    after = plan(c.model, c.hardware, c.stage)
    fresh = compose(["+stage=smoke", f"stage.seq_length={c.stage.seq_length}"]).cfg
    monkeypatch.setattr(planner, "_TABLES", type(planner._TABLES)())  # cold: nothing planned before
    assert _fingerprint(after) == _fingerprint(plan(fresh.model, fresh.hardware, fresh.stage))
    assert _fingerprint(after) != _fingerprint(before)
