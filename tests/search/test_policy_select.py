"""One-factor neighbours, diversity, measured best, convergence and promotion mapping (pure)."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.core.schema import PolicyConfig, SearchConfig, SearcherConfig, StageConfig
from orchestrator.core.states import Fidelity
from orchestrator.plan.layout import Layout, groups
from orchestrator.search import make_policy, policy_names
from orchestrator.search.promote import bubble, promoted_layouts
from orchestrator.search.select import best_measured, changed_knob, diverse_top, measured_rank, round_robin
from orchestrator.search.types import Observation

BASE = Layout(tp=1, pp=8, vpp=1, cp=1, ep=64, mbs=1)


def obs(key, step, *, p99=None, peak=None, rnd=0, lay=BASE, fc=None):
    return Observation(
        key=key,
        layout=lay,
        raw_components={"compute": 1.0},
        raw_step_s=1.0,
        raw_memory_gb=10.0,
        step_s=step,
        p99_s=p99,
        peak_gb=peak,
        failure_class=fc,
        round=rnd,
        hbm_gb=80.0,
    )


def test_changed_knob_is_exactly_one_group():
    assert changed_knob(BASE, replace(BASE, ep=32)) == "ep"
    assert changed_knob(BASE, replace(BASE, pp=4, vpp=2)) == "pp"  # PP/VPP move together
    assert changed_knob(BASE, replace(BASE, dispatcher="flex", flex_backend="deepep")) == "dispatcher"
    assert changed_knob(BASE, replace(BASE, ep=32, cp=2)) is None
    assert changed_knob(BASE, BASE) is None
    assert changed_knob(BASE, replace(BASE, tp=2)) is None  # not a searched knob group


def test_diverse_top_covers_each_value_before_repeating():
    ranked = [
        replace(BASE, ep=64, cp=1),
        replace(BASE, ep=64, cp=1, mbs=2),
        replace(BASE, ep=64, cp=2),
        replace(BASE, ep=32, cp=1),
        replace(BASE, ep=128, pp=4),
    ]
    got = diverse_top(ranked, 4, layout_of=lambda x: x)
    assert got[0] == ranked[0]
    assert {lay.ep for lay in got} == {32, 64, 128} and {lay.cp for lay in got} == {1, 2}
    assert ranked[1] not in got  # the duplicate of the best adds no new knob value


def test_measured_best_uses_measurements_and_tie_breaks():
    rows = [
        obs("a", 1.00, p99=1.3, peak=60),
        obs("b", 1.00, p99=1.2, peak=70),
        obs("c", 1.00, p99=1.2, peak=50),
        obs("d", None, fc="OOM"),
        obs("e", 1.5),
    ]
    assert [r.key for r in measured_rank(rows)] == ["c", "b", "a", "e"]
    assert best_measured(rows).key == "c"
    assert best_measured([obs("x", None, fc="CRASH")]) is None


def test_round_robin_interleaves_and_dedupes():
    assert round_robin([["a", "b", "c"], ["a", "d"], ["e"]], 4, key=str) == ["a", "d", "e", "b"]


def test_convergence_needs_two_rounds_without_gain_or_near_tie():
    pol = make_policy(PolicyConfig(search=SearcherConfig(converge_gain=0.01)))
    assert not pol.converged([obs("a", 10, rnd=0), obs("b", 9, rnd=1), obs("c", 8.5, rnd=2)], 2)
    assert not pol.converged([obs("a", 10, rnd=0), obs("b", 10.5, rnd=1)], 2)
    assert pol.converged([obs("a", 10, rnd=0), obs("b", 10.5, rnd=1), obs("c", 10.2, rnd=2)], 2)
    assert not pol.converged([obs("a", 10, rnd=0), obs("b", 10.5, rnd=1), obs("c", 9.0, rnd=2)], 2)
    # one round: round 1 without a gain ends it, round 1 with one does not
    assert pol.converged([obs("a", 10, rnd=0), obs("b", 10.5, rnd=1)], 1)
    assert not pol.converged([obs("a", 10, rnd=0), obs("b", 9.0, rnd=1)], 1)
    assert not pol.converged([obs("a", 10, rnd=0)], 1)  # round 0 alone never converges


def test_a_near_tie_measured_at_full_window_holds_convergence_a_round():
    """A round whose full-window measurement lands within converge_gain of the best (a near-tie, better or not)
    opens a neighbourhood the next round explores: it is not a stale round. A screened one ranks, never decides."""
    pol = make_policy(PolicyConfig(search=SearcherConfig(converge_gain=0.01)))
    stale = [obs("a", 10, rnd=0), obs("b", 10.5, rnd=1)]
    for near in (10.08, 9.95):
        assert not pol.converged([*stale, obs("c", near, rnd=2)], 2)
        assert pol.stale_rounds([*stale, obs("c", near, rnd=2)]) == 0
    screened = replace(obs("c", 10.08, rnd=2), fidelity=Fidelity.SCREEN)
    assert pol.converged([*stale, screened], 2)
    assert pol.stale_rounds([*stale, obs("c", 10.08, rnd=2), obs("d", 10.5, rnd=3)]) == 1
    assert pol.converged_reason(2) == "converged: no gain > 1% over the best, nor a near-tie within 1%, for 2 rounds"


def test_registry_names_both_policies():
    assert {"calibrated_neighbours", "predicted_topk"} <= set(policy_names())


def _stage(name, gpus, vpp=(1,)):
    return StageConfig(
        name=name,
        gpus=gpus,
        global_batch=4096,
        seq_length=8192,
        search=SearchConfig(cp=[1, 2, 4, 8], ep=[32, 64, 128], vpp=list(vpp)),
    )


def test_promotion_keeps_b_restores_m_with_cp_and_widens_ep():
    src, dst = _stage("1k", 1024), _stage("8k", 8192)
    a = Layout(tp=1, pp=8, cp=1, ep=64, mbs=1)  # the guide's config A: D_a = 128, m = 32
    out = promoted_layouts(a, src, dst)
    cp_variant = out[0]  # no VPP in the search: CP is the only way to restore m
    assert cp_variant.cp == 8 and groups(cp_variant, 8192, 4096).m == 32  # m restored
    assert out[1].ep == 128 and out[1].cp == 8  # EP widened
    assert out[2] == a  # config B: D_a = 1024, m = 4 (the bubble balloons: last)
    assert groups(out[2], 8192, 4096).m == 4
    assert all(groups(lay, 8192, 4096).legal for lay in out)


def test_promotion_restores_the_bubble_with_vpp_and_the_least_cp():
    # At 8x the GPUs and the same B, m falls 8x. CP8 restores m; VPP4 x CP2 restores the bubble (p-1)/(v x m)
    # with a quarter of the CP, which is what wins where GEMM efficiency falls with the tokens per micro-batch
    # (the twin's gemm surface at 8k: PP8 VPP4 CP2 beat every CP8 layout; main never measured it).
    src, dst = _stage("1k", 1024), _stage("8k", 8192, vpp=(1, 2, 4))
    a = Layout(tp=1, pp=8, cp=1, ep=32, mbs=1, recompute=("full",))  # bubble 7/32 at 1k
    out = promoted_layouts(a, src, dst)
    assert out[0] == replace(a, vpp=4, cp=2)  # bubble 7/(4 x 8): the source's, with CP2
    assert bubble(out[0], 8192, 4096) == bubble(a, 1024, 4096)
    assert replace(a, cp=8) in out  # the CP variant is still offered
    # a rule that rejects VPP4 x CP2 (memory, layer split) leaves the slot to the next least CP
    no_cp2 = promoted_layouts(a, src, dst, feasible=lambda lay: lay.cp != 2)
    assert no_cp2[0] == replace(a, vpp=2, cp=4) and all(lay.cp != 2 for lay in no_cp2)
    # no VPP keeps a PP16 source's bubble 15/256 (VPP2 x CP8 at 8k: 15/128): the smallest bubble VPP reaches
    deep = Layout(tp=1, pp=16, cp=4, ep=32, mbs=1)
    out = promoted_layouts(deep, src, _stage("8k", 8192, vpp=(1, 2)))
    assert out[0] == replace(deep, vpp=2, cp=8) and replace(deep, cp=8) in out


def test_oom_dominance_prunes_layouts_needing_more_memory():
    from orchestrator.search.select import needs_more_memory, oom_dominated

    oom = replace(BASE, pp=4, ep=32, mbs=1, recompute=("moe_act",))
    assert needs_more_memory(replace(oom, mbs=2), oom)
    assert needs_more_memory(replace(oom, pp=2, recompute=()), oom)
    assert needs_more_memory(replace(oom, dispatcher="flex", flex_backend="deepep"), oom)
    assert not needs_more_memory(replace(oom, ep=64), oom)  # more EP shards: less memory per GPU
    assert not needs_more_memory(replace(oom, recompute=("full",)), oom)
    assert not needs_more_memory(replace(oom, recompute=("mla_up_proj",)), oom)  # selective sets: unordered
    # another VPP is another number of microbatch-chunks in flight, more or less (schedules.py:906, :913-914)
    interleaved = replace(oom, pp=4, vpp=2)
    assert needs_more_memory(replace(interleaved, mbs=2), interleaved)
    assert not needs_more_memory(replace(interleaved, vpp=4), interleaved)
    assert not needs_more_memory(replace(interleaved, vpp=1), interleaved)
    assert not oom_dominated(replace(interleaved, vpp=4), [obs("i", None, lay=interleaved, fc="OOM")])
    rows = [obs("o", None, lay=oom, fc="OOM"), obs("c", None, lay=replace(oom, pp=1), fc="CRASH")]
    assert oom_dominated(replace(oom, mbs=2), rows)
    assert not oom_dominated(replace(oom, pp=8), rows)


def test_knob_effects_are_measured_one_factor_ratios_where_the_coupled_knobs_agree():
    from orchestrator.search.policies import effect_key, knob_effects

    a = obs("a", 10.0, lay=BASE)
    b = obs("b", 12.0, lay=replace(BASE, ep=32))
    c = obs("c", 9.0, lay=replace(BASE, ep=32, cp=2))  # two knobs from a: no pair with a
    hybrid = dict(dispatcher="flex", flex_backend="hybridep")
    d = obs("d", 15.0, lay=replace(BASE, **hybrid))  # HybridEP measured slow at EP64
    eff = knob_effects([a, b, c, d, obs("e", None, lay=replace(BASE, mbs=2), fc="OOM")])
    assert eff[effect_key(BASE, b.layout)] == [1.2]
    assert eff[effect_key(b.layout, BASE)] == [10.0 / 12.0]
    assert eff[effect_key(b.layout, c.layout)] == [0.75]
    assert eff[effect_key(BASE, d.layout)] == [1.5]
    # the dispatcher's effect depends on the EP group (moves.COUPLED): EP64's says nothing of EP32's
    assert effect_key(b.layout, replace(b.layout, **hybrid)) not in eff
    # CP's is coupled with PP only: the EP32 pair's CP effect holds at EP64 with the same PP
    assert effect_key(BASE, replace(BASE, cp=2)) == effect_key(b.layout, c.layout)
    assert len(eff) == 6  # a<->b, b<->c, a<->d: nothing from the OOM, nothing across two knobs
