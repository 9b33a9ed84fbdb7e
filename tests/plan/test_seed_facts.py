"""Every number of the tuning guide that the analytic models own, from the real Hydra config.

The model and stage values come from conf/ through orchestrator.config.compose, so a wrong YAML value
fails here too.
"""

import math

import pytest

from orchestrator.config import compose
from orchestrator.plan import moe, pipeline
from orchestrator.plan.flops import step_flops
from orchestrator.plan.layout import Layout, groups
from orchestrator.plan.params import effective_layers, p_expert, param_counts


@pytest.fixture(scope="module")
def k1():
    return compose(["+stage=1k"]).cfg


@pytest.fixture(scope="module")
def k8():
    return compose(["+stage=8k"]).cfg


def guide_layout(cp=1, ep=64):
    """TP1 PP8 CPx EP64 ETP1 MBS1: the guide's configs A, B, C."""
    return Layout(tp=1, pp=8, cp=cp, ep=ep, etp=1, mbs=1)


def test_model_shape_from_conf(k1):
    m = k1.model
    assert (m.num_layers, m.num_experts, m.moe_router_topk, m.hidden_size, m.moe_ffn_hidden_size) == (
        61,
        384,
        6,
        7168,
        3072,
    )
    assert m.moe_shared_expert_intermediate_size == m.moe_ffn_hidden_size  # 1 shared expert
    assert effective_layers(m, k1.stage) == 61


def test_p_expert(k1):
    assert p_expert(k1.model) == 3 * 7168 * 3072 == 66_060_288


def test_total_and_active_parameters_within_10_percent(k1):
    pc = param_counts(k1.model)
    assert pc.total == pytest.approx(1.6e12, rel=0.10)
    assert pc.active == pytest.approx(49e9, rel=0.10)
    assert pc.total == pytest.approx(k1.model.total_params_b * 1e9, rel=0.10)


def test_bf16_weights_of_all_parameters_are_3_2_tb(k1):
    assert k1.model.total_params_b * 1e9 * 2 / 1e12 == pytest.approx(3.2)
    assert param_counts(k1.model).total * 2 / 1e12 == pytest.approx(3.2, rel=0.02)


def test_group_arithmetic_1k_pp8_ep64(k1):
    g = groups(guide_layout(), k1.stage.gpus, k1.stage.global_batch)
    assert (k1.stage.gpus, g.per_stage, g.d_a, g.d_e) == (1024, 128, 128, 2)


@pytest.mark.parametrize("ep,per_rank,d_e,gb", [(32, 12, 4, 12.68), (64, 6, 2, 6.34), (128, 3, 1, 3.17)])
def test_routed_weight_table(k1, ep, per_rank, d_e, gb):
    m = k1.model
    assert moe.experts_per_rank(m.num_experts, ep) == per_rank
    assert groups(guide_layout(ep=ep), 1024, k1.stage.global_batch).d_e == d_e
    assert round(moe.routed_weight_gb(8, m.num_experts, ep, 1, p_expert(m)), 2) == gb


@pytest.mark.parametrize("ep", [32, 64, 128])
def test_ep_candidates_divide_384_experts(k1, ep):
    assert k1.model.num_experts % ep == 0
    assert ep in k1.stage.search.ep
    with pytest.raises(ValueError):
        moe.experts_per_rank(k1.model.num_experts, 5)


def test_tokens_per_update(k1, k8):
    for cfg in (k1, k8):
        s = cfg.stage
        assert (s.global_batch, s.seq_length) == (4096, 8192)
        assert s.global_batch * s.seq_length == 33_554_432
        assert step_flops(cfg.model, s, guide_layout()).tokens == 33_554_432


# config, fixture, GPUs, CP, D_a, D_e, m, bubble, T_group, E[T_expert]
TABLE = [
    ("A", "k1", 1024, 1, 128, 2, 32, 0.179, 524_288, 8192),
    ("B", "k8", 8192, 1, 1024, 16, 4, 0.636, 524_288, 8192),
    ("C", "k8", 8192, 4, 256, 16, 16, 0.304, 131_072, 2048),
]


@pytest.mark.parametrize("name,fx,gpus,cp,d_a,d_e,m,bub,tg,te", TABLE)
def test_configs_a_b_c(request, name, fx, gpus, cp, d_a, d_e, m, bub, tg, te):
    cfg = request.getfixturevalue(fx)
    s, model = cfg.stage, cfg.model
    lay = guide_layout(cp=cp)
    g = groups(lay, s.gpus, s.global_batch)
    assert (s.gpus, g.d_a, g.d_e, g.m) == (gpus, d_a, d_e, m)
    assert pipeline.microbatches(s.global_batch, lay.mbs, g.d_a) == m
    assert s.global_batch == lay.mbs * g.d_a * m  # B = b D_a m
    assert round(pipeline.bubble(lay.pp, m), 3) == bub
    t_group = moe.t_group(lay.ep, lay.mbs, s.seq_length, cp)
    assert t_group == tg
    assert moe.t_expert(model.moe_router_topk, t_group, model.num_experts) == te


def test_bubble_percentages_as_the_guide_prints_them():
    assert [f"{100 * pipeline.bubble(8, m):.1f}%" for m in (32, 4, 16)] == ["17.9%", "63.6%", "30.4%"]


def test_config_b_has_fewer_microbatches_than_pipeline_stages(k8):
    """Why the interleaved schedule (PP <= microbatch group <= m) rejects B: m = 4 < PP = 8."""
    g = groups(guide_layout(), k8.stage.gpus, k8.stage.global_batch)
    assert g.m < 8


def test_cp4_8k_sequence_leaves_2048_rows_per_rank_at_least_d_window(k8):
    s, m = k8.stage, k8.model
    rows = s.seq_length // 4
    assert rows == 2048
    d_window = max(m.csa_window_size, max(8 if r == 4 else r for r in m.csa_compress_ratios))
    assert rows >= d_window


def test_ep64_spans_at_least_8_nodes(k1):
    assert k1.stage.gpus_per_node == 8
    assert moe.min_nodes(64, k1.stage.gpus_per_node) == 8
    assert moe.min_nodes(64, 8) == math.ceil(64 / 8)


def test_61_blocks_do_not_divide_by_8_so_the_split_is_uneven(k1):
    split = pipeline.split_blocks(61, 8)
    assert 61 % 8 and sum(split) == 61 and len(set(split)) > 1
    assert pipeline.count_blocks(pipeline.layer_pattern(k1.model, split)) == split
