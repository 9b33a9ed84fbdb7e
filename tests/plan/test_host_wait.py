"""The dropless dispatcher's host wait per MoE layer (steptime.MOE_HOST_WAIT_S, steptime.host_wait): each constant
re-derived from the public measurements that size it, and the wait charged only where Megatron's code waits."""

import dataclasses

import pytest

from orchestrator.commands.validate import load_rows
from orchestrator.plan import steptime
from orchestrator.plan.layout import Layout
from tests.plan.test_models import predict


def _row(release: str, line: int):
    return next(r for r in load_rows() if r.release == release and r.line == line)


def _step_s(tokens_per_gpu_s: float, gbs: int, seq: int, gpus: int) -> float:
    return gbs * seq / gpus / tokens_per_gpu_s


def test_the_alltoall_wait_is_nvidias_dropless_and_token_drop_pair():
    """Qwen3-30B-A3B on 8 B200, EP8 MBS1, GBS 512, 4K: dropless with per-layer router graphs (25.11) against token
    drop with whole-layer graphs (25.09), the same layout: the step's difference over 64 microbatches x 48 MoE
    layers (Megatron-Bridge docs/performance-summary-archive.md, the rows' lines)."""
    dropless, padded = _row("25.11", 582), _row("25.09", 621)
    assert (dropless.model, dropless.system, dropless.gpus, dropless.ep, dropless.mbs) == (
        padded.model, padded.system, padded.gpus, padded.ep, padded.mbs,
    )  # fmt: skip
    assert dropless.capacity_factor is None and padded.capacity_factor == 1.0
    m = dropless.gbs // (dropless.mbs * dropless.gpus)  # TP1 PP1: data-parallel over all 8 GPUs
    diff = _step_s(dropless.tokens, dropless.gbs, dropless.seq, dropless.gpus) - _step_s(
        padded.tokens, padded.gbs, padded.seq, padded.gpus
    )
    assert diff / (m * 48) == pytest.approx(steptime.MOE_HOST_WAIT_S["alltoall"], rel=0.01)


def test_the_flex_wait_is_the_gb200_guides_remaining_ten_percent():
    """NVIDIA's DeepSeek-V3 GB200 guide (Megatron-LM eb0783b6, docs/discussions/deepseek-v3-gb200-optimization/
    deepseek-v3-gb200-optimization.md): 970 TFLOP/s per GPU on 256 GB200 (:208-224), TP1 PP8 VPP4 EP32 MBS1 GBS
    2048 at 4K (:42), 8 MoE layers on a middle rank (the layout Et|(tt|)*30L: 4 stages of 2 layers), and removing
    the tokens-per-expert sync to graph the whole step worth "at least a 10% additional performance gain" (:228).
    FLOPs per token: NVIDIA's own count, read off a published DeepSeek-V3 row's TFLOP/s over its tokens/s."""
    row = _row("26.02", 508)
    assert row.model == "dsv3" and row.system == "gb200"
    flops_per_token = row.tflops * 1e12 / row.tokens
    step = 2048 * 4096 / 256 * flops_per_token / 970e12
    m, moe_layers = 2048 // (1 * 256 // 8), 8
    wait = step * (1 - 1 / 1.10) / (m * moe_layers)
    assert wait == pytest.approx(steptime.MOE_HOST_WAIT_S["flex"], rel=0.01)


def test_the_wait_is_charged_where_megatron_waits(monkeypatch):
    """Per dropless MoE layer and microbatch on the slowest rank (its a2a component), twice when the MoE layer is
    recomputed; nothing with a capacity factor, with NCCL-EP's fixed receive buffer, or with one CUDA graph per
    step."""
    base = Layout(pp=8, ep=64, cp=4)
    again = dataclasses.replace(base, recompute=("moe",))
    with_wait = [predict(lay)[3].components["a2a"] for lay in (base, again)]
    wait = steptime.MOE_HOST_WAIT_S["alltoall"]
    monkeypatch.setitem(steptime.MOE_HOST_WAIT_S, "alltoall", 0.0)
    without = [predict(lay)[3].components["a2a"] for lay in (base, again)]
    g = predict(base)[0]
    layers = (with_wait[0] - without[0]) / (g.m * wait)  # MoE layers on the slowest rank
    assert layers == pytest.approx(round(layers)) and round(layers) >= 1
    assert with_wait[1] - without[1] == pytest.approx(2 * (with_wait[0] - without[0]))
    flex = dataclasses.replace(base, dispatcher="flex", flex_backend="hybridep")
    ncclep = dataclasses.replace(base, dispatcher="flex", flex_backend="ncclep")
    assert steptime.host_wait(flex, False) == steptime.MOE_HOST_WAIT_S["flex"]
    assert steptime.host_wait(ncclep, False) == 0.0
    assert steptime.host_wait(dataclasses.replace(flex, capacity_factor=1.0), False) == 0.0
    assert steptime.host_wait(flex, True, full_graph=True) == 0.0
    assert steptime.host_wait(flex, True) == 2 * steptime.MOE_HOST_WAIT_S["flex"]
