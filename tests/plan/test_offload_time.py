"""The step model's offload term (orchestrator/plan/steptime.py "offload"): the host copies of fine-grained activation
offload, each charged only beyond the compute of the pass it runs under, over the hardware group's host link."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.config import compose
from orchestrator.core.schema import HardwareConfig, StageConfig
from orchestrator.plan import flops, memory, moe, params, pipeline, steptime
from orchestrator.plan.layout import Layout, groups
from orchestrator.search.compose import MEASURED

CFG = compose(["+stage=1k"]).cfg
MODEL, STAGE = CFG.model, CFG.required_stage()
H200 = compose(["+stage=1k", "hardware=h200"]).cfg.hardware
GB200 = compose(["+stage=1k", "hardware=gb200"]).cfg.hardware
# a 1k layout of the planner's (PP16 CP4 EP32, HybridEP) offloading every V4 module it may: enough bytes per
# microbatch that on PCIe the copies outlast a pass
SIBLING = Layout(tp=1, pp=16, cp=4, ep=32, mbs=1, dispatcher="flex", flex_backend="hybridep")
HEAVY = dataclasses.replace(SIBLING, offload=("attn_norm", "attn_proj", "core_attn", "expert_fc1", "mlp_norm"))


def predict(lay: Layout, hw: HardwareConfig, stage: StageConfig = STAGE):
    g = groups(lay, stage.gpus, stage.global_batch)
    costs, first, last = flops.block_costs(MODEL, stage.seq_length, params.effective_layers(MODEL, stage))
    bps = pipeline.split_blocks(len(costs), lay.pp * lay.vpp, costs, first, last)
    ep_nodes, cp_nodes = moe.min_nodes(lay.ep, stage.gpus_per_node), moe.min_nodes(lay.cp, stage.gpus_per_node)
    st = steptime.step_time(MODEL, hw, stage, lay, g, bps, ep_nodes, cp_nodes)
    return g, memory.stage_memory(MODEL, hw, stage, lay, g, bps), st


def test_without_offload_the_component_is_zero():
    for lay in (SIBLING, dataclasses.replace(SIBLING, recompute=("moe_act",)), dataclasses.replace(SIBLING, pp=8)):
        for hw in (H200, GB200):
            st = predict(lay, hw)[2]
            assert st.components["offload"] == 0.0 and st.total_s > 0


def test_offload_of_what_recompute_already_drops_moves_nothing():
    """memory.offloaded_elems is the difference of the one activation accounting: a recomputed tensor is not saved,
    so offloading it copies nothing; full recompute keeps only layer inputs."""
    assert memory.offloaded_elems(MODEL, 4, True, ("moe_act",), ("moe_act",)) == (0.0, 0.0)
    assert memory.offloaded_elems(MODEL, 4, True, ("full",), ("core_attn", "expert_fc1")) == (0.0, 0.0)
    dense, expert = memory.offloaded_elems(MODEL, 4, True, (), ("core_attn", "expert_fc1"))
    assert dense > 0 and expert > 0


def test_on_h200_offload_is_slower_than_its_sibling_by_the_exposed_copies():
    """The H200's PCIe Gen5 link: the offload layout's step is its sibling's plus the copy time beyond each pass's
    compute (and the bubble that longer stage time stretches); the bytes are what the memory model says offload
    frees, per microbatch in flight."""
    g, mem_sib, sib = predict(SIBLING, H200)
    _, mem_off, off = predict(HEAVY, H200)
    assert sib.components["offload"] == 0.0
    exposed = off.components["offload"]
    assert exposed > 0
    assert off.slowest_stage == sib.slowest_stage
    for c in steptime.COMPONENTS:
        if c not in ("offload", "bubble"):
            assert off.components[c] == pytest.approx(sib.components[c], rel=1e-12), c
    f = pipeline.bubble(HEAVY.pp, g.m, HEAVY.vpp)
    assert off.total_s - sib.total_s == pytest.approx(exposed / (1 - f), rel=1e-9)
    # the same bytes from the memory model: activations freed on the slowest rank over its microbatches in flight
    r = off.slowest_stage
    freed = (mem_sib[r].activations - mem_off[r].activations) * memory.GB / memory.in_flight(r, HEAVY.pp, 1, g.m)
    copy_s = freed / (H200.host_link_gb_s * 1e9 * H200.host_link_efficiency)
    compute_mb = sib.components["compute"] / g.m
    expected = max(0.0, copy_s - compute_mb / 3) + max(0.0, copy_s - 2 * compute_mb / 3)
    assert exposed == pytest.approx(g.m * expected, rel=1e-9)


def test_c2c_exposes_less_than_pcie_for_the_same_layout():
    """GB200's NVLink-C2C (450 GB/s a direction) against the H200's PCIe Gen5 (64): less exposed, both on the real
    parts and on an H200 given only the C2C link."""
    h200 = predict(HEAVY, H200)[2].components["offload"]
    assert h200 > 0
    assert predict(HEAVY, GB200)[2].components["offload"] < h200
    c2c = dataclasses.replace(H200, host_link_gb_s=GB200.host_link_gb_s)
    assert predict(HEAVY, c2c)[2].components["offload"] < h200
    assert GB200.host_link_gb_s > H200.host_link_gb_s == HardwareConfig().host_link_gb_s


def test_exposed_copy_rule():
    """max(0, copy - forward) + max(0, copy - backward), forward a third of the compute."""
    assert steptime.offload_exposed(0.0, 3.0) == 0.0
    assert steptime.offload_exposed(1.0, 3.0) == 0.0  # under the forward (1 s) and the backward (2 s)
    assert steptime.offload_exposed(1.5, 3.0) == pytest.approx(0.5)
    assert steptime.offload_exposed(3.0, 3.0) == pytest.approx(2.0 + 1.0)


def test_the_probe_times_the_offload_copies():
    """A one-GPU rank probe runs the last rank's copies over its own host link: probe_s carries them, and the probe
    composition (search/compose.py) counts them as measured."""
    slow = dataclasses.replace(H200, host_link_gb_s=1.0)  # every rank's copies exposed, the last one's too
    sib, off = predict(SIBLING, slow)[2], predict(HEAVY, slow)[2]
    assert off.probe_s > sib.probe_s
    assert "offload" in MEASURED
