"""Per-term checks of the step model against kernel-level public tables (tests/fixtures/kernel_tables.json).

Each row's kernel alone is predicted by the planner's own term (orchestrator/plan/steptime.py) on the tables'
hardware and compared with what the table measured: signed error = predicted / measured - 1, as `validate` signs
it (positive: the planner expects the kernel faster than it ran, i.e. optimistic). The tests hold the transcription
and hold docs/validate.md to the errors computed here, so the page cannot drift; they do not assert that the planner
is accurate at the kernel level.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.core.schema import HardwareConfig
from orchestrator.plan.flops import peak_tflops
from orchestrator.plan.steptime import (
    EXPERT_GEMM_HALF_TOKENS,
    GEMM_HALF_K,
    _remote_copies,
    expert_efficiency,
    short_k_efficiency,
)

ROOT = Path(__file__).resolve().parents[2]
TABLES = json.loads((ROOT / "tests" / "fixtures" / "kernel_tables.json").read_text())
DOC = (ROOT / "docs" / "validate.md").read_text()
SECTION = "## Per-term checks against kernel-level tables"
# The dense table's M = 64 / 128 rows are decode shapes; a training microbatch gives a GPU thousands of tokens, and
# the planner's dense term has no M in it, so only the training-size rows are compared.
TRAINING_M = 1024


def h800() -> HardwareConfig:
    """The tables' GPU: the schema's H100 defaults (same die and peaks) with the fixture's NVLink."""
    hw = TABLES["planner_hardware"]
    return HardwareConfig(name=hw["name"], nvlink_gb_s=hw["nvlink_gb_s"])


def gemm_tflops(hw: HardwareConfig, tokens_per_expert: float | None, k: int) -> float:
    """The planner's achieved FP8 TFLOP/s of one forward GEMM: peak x gemm_efficiency x the short-K curve at its
    reduction width K (x the expert curve for a grouped GEMM)."""
    eff = hw.gemm_efficiency * (expert_efficiency(tokens_per_expert) if tokens_per_expert is not None else 1.0)
    return peak_tflops(hw, "fp8") * eff * short_k_efficiency(k)


def fitted_half_k() -> float:
    """GEMM_HALF_K's fit: the K0 of plateau x K / (K + K0) through the dense table's training-size rows, least
    squares in log TFLOP/s with the plateau free (its best value for each K0 is the mean log residual)."""
    rows = [r for r in TABLES["tables"]["deepgemm_dense"]["rows"] if r["m"] >= TRAINING_M]

    def loss(k0: float) -> float:
        res = [math.log(r["tflops"]) - math.log(r["k"] / (r["k"] + k0)) for r in rows]
        mean = statistics.fmean(res)
        return sum((x - mean) ** 2 for x in res)

    lo, hi = 1.0, 10_000.0  # golden-section search: the loss is unimodal in K0 over the table's K range
    g = (math.sqrt(5) - 1) / 2
    for _ in range(200):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        lo, hi = (lo, b) if loss(a) < loss(b) else (a, hi)
    return (lo + hi) / 2


def a2a_gb_s(hw: HardwareConfig, ep: int, topk: int, gpus_per_node: int) -> float:
    """The bandwidth the planner's a2a term gives DeepEP's kernel (dispatcher flex), in the table's own bytes.

    The planner's seconds per token-byte: max(remote / NIC, local / NVLink) / a2a_efficiency, the copies from
    `_remote_copies`. DeepEP's bytes: inside a node every copy a rank receives (self included); across nodes a token
    once per node it goes to, its own node included, whose share the planner counts free: nodes / (nodes - 1) x its
    remote copies. Both sides count the same copies, so the ratio is the bandwidth error on the wire too."""
    nodes = max(1, ep // gpus_per_node)
    remote, local = _remote_copies("flex", topk, ep, nodes)
    seconds = max(remote / hw.nic_gb_s, local / hw.nvlink_gb_s) / hw.a2a_efficiency
    logical = local if nodes == 1 else remote * nodes / (nodes - 1)
    return logical / seconds


@dataclass(frozen=True)
class Check:
    """One row: what it is, what it measured and what the planner's term predicts."""

    label: str
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0


def _gemm_checks(name: str, grouped: bool) -> list[Check]:
    hw = h800()
    out = []
    for r in TABLES["tables"][name]["rows"]:
        if grouped:
            label = f"{r['groups']}x M {r['m_per_group']}, N {r['n']}, K {r['k']}"
            out.append(Check(label, r["tflops"], gemm_tflops(hw, r["m_per_group"], r["k"])))
        elif r["m"] >= TRAINING_M:
            out.append(Check(f"M {r['m']}, N {r['n']}, K {r['k']}", r["tflops"], gemm_tflops(hw, None, r["k"])))
    return out


def _a2a_checks() -> list[Check]:
    hw, table = h800(), TABLES["tables"]["deepep_normal"]
    s = table["setting"]
    return [
        Check(f"{r['type']} EP{r['ep']} {r['kernel']}", r["gb_s"], a2a_gb_s(hw, r["ep"], s["topk"], s["gpus_per_node"]))
        for r in table["rows"]
    ]


CHECKS: dict[str, tuple[str, Callable[[], list[Check]]]] = {
    "deepgemm_dense": ("DeepGEMM dense GEMM, FP8 (M >= 1,024 rows)", lambda: _gemm_checks("deepgemm_dense", False)),
    "deepgemm_grouped_contiguous": (
        "DeepGEMM grouped GEMM, contiguous, FP8",
        lambda: _gemm_checks("deepgemm_grouped_contiguous", True),
    ),
    "deepgemm_grouped_masked": (
        "DeepGEMM grouped GEMM, masked, FP8",
        lambda: _gemm_checks("deepgemm_grouped_masked", True),
    ),
    "deepep_normal": ("DeepEP normal dispatch/combine", _a2a_checks),
}


def summary_line(name: str) -> str:
    """The page's row for one table: rows compared, median |error|, worst row, sign."""
    title, checks = CHECKS[name][0], CHECKS[name][1]()
    worst = max(checks, key=lambda c: abs(c.error))
    over = sum(c.error > 0 for c in checks)
    med = statistics.median(abs(c.error) for c in checks)
    return (
        f"| {title} | {len(checks)} | {med:.1%} | {worst.error:+.1%} ({worst.label}) | "
        f"{over} optimistic, {len(checks) - over} pessimistic |"
    )


def row_lines(name: str) -> list[str]:
    """The page's per-row lines: measured, predicted, signed error."""
    return [f"| {c.label} | {c.measured:g} | {c.predicted:.0f} | {c.error:+.1%} |" for c in CHECKS[name][1]()]


def implied_lines() -> list[str]:
    """What the tables put in the planner's constants' places, each from named rows (the page's last table)."""
    hw = h800()
    peak = peak_tflops(hw, "fp8")
    rows = {
        (r["m_per_group"], r["n"]): r["tflops"]
        for t in ("contiguous", "masked")
        for r in TABLES["tables"][f"deepgemm_grouped_{t}"]["rows"]
    }

    def span(values: list[float]) -> str:
        lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
        return lo if lo == hi else f"{lo}-{hi}"

    lines = []
    for n, k in ((4096, 7168), (7168, 2048)):
        plateau = rows[(8192, n)]
        half = 256 * (plateau / rows[(256, n)] - 1)  # T / (T + H) = measured(256) / plateau at T = 256
        lines.append(
            f"| grouped GEMM N {n}, K {k} | gemm_efficiency {hw.gemm_efficiency:g}, EXPERT_GEMM_HALF_TOKENS "
            f"{EXPERT_GEMM_HALF_TOKENS:g} | {plateau / peak:.2f} of the FP8 peak at M 8192, half-point {half:.0f} |"
        )
    lines.append(
        f"| dense GEMM, short K | GEMM_HALF_K {GEMM_HALF_K:g} (x K / (K + GEMM_HALF_K)) | "
        f"K0 {fitted_half_k():.0f} through the M 4,096 rows |"
    )
    ep = {(r["ep"], r["kernel"]): r["gb_s"] for r in TABLES["tables"]["deepep_normal"]["rows"]}
    nvl = [ep[(8, kern)] / hw.nvlink_gb_s for kern in ("dispatch", "combine")]
    lines.append(
        f"| DeepEP intranode EP8 | a2a_efficiency {hw.a2a_efficiency:g} of NVLink {hw.nvlink_gb_s:g} GB/s | "
        f"{span(nvl)} |"
    )
    for e in (16, 32, 64):
        nodes = e // 8
        wire = [ep[(e, kern)] * (nodes - 1) / nodes / hw.nic_gb_s for kern in ("dispatch", "combine")]
        lines.append(
            f"| DeepEP internode EP{e} ({nodes} nodes) | a2a_efficiency {hw.a2a_efficiency:g} of the NIC "
            f"{hw.nic_gb_s:g} GB/s | {span(wire)} on the wire |"
        )
    return lines


def test_the_transcription():
    t = TABLES["tables"]
    assert [len(t[n]["rows"]) for n in CHECKS] == [18, 4, 6, 8]
    for name in ("deepgemm_dense", "deepgemm_grouped_contiguous", "deepgemm_grouped_masked"):
        src = t[name]["source"]
        assert (src["repo"], src["commit"], src["file"]) == (
            "deepseek-ai/DeepGEMM",
            "327ec92f6977e7fee022cb76a8f273b75483c3d8",
            "README.md",
        )
        assert "H800" in t[name]["hardware"]
    src = t["deepep_normal"]["source"]
    assert (src["repo"], src["file"]) == ("deepseek-ai/DeepEP", "docs/legacy.md")
    assert t["deepgemm_dense"]["rows"][15] == {"m": 4096, "n": 7168, "k": 16384, "tflops": 1520}
    assert t["deepgemm_grouped_contiguous"]["rows"][0]["tflops"] == 1346
    assert t["deepgemm_grouped_masked"]["rows"][-1] == {
        "groups": 4,
        "m_per_group": 256,
        "n": 7168,
        "k": 2048,
        "tflops": 815,
    }
    assert [(r["ep"], r["gb_s"]) for r in t["deepep_normal"]["rows"] if r["kernel"] == "dispatch"] == [
        (8, 153),
        (16, 43),
        (32, 58),
        (64, 51),
    ]


def test_the_tables_hardware_is_the_h100_die_with_h800_nvlink():
    hw = h800()
    assert peak_tflops(hw, "fp8") == 1979.0 and hw.nic_gb_s == 50.0
    assert hw.nvlink_gb_s == 200.0 < HardwareConfig().nvlink_gb_s


@pytest.mark.parametrize("name", list(CHECKS))
def test_the_page_states_what_the_check_computes(name):
    section = DOC.split(SECTION, 1)[1]
    assert summary_line(name) in section, summary_line(name)
    for line in row_lines(name):
        assert line in section, line
    assert TABLES["tables"][name]["source"]["commit"][:8] in section


def test_the_page_states_the_constants_the_tables_imply():
    section = DOC.split(SECTION, 1)[1]
    for line in implied_lines():
        assert line in section, line


def test_the_short_k_constant_is_the_dense_tables_fit():
    """GEMM_HALF_K is the dense table's K0, rounded to 10."""
    assert round(fitted_half_k(), -1) == GEMM_HALF_K


def test_internode_bandwidth_counts_the_local_node_as_deepep_does():
    """The conversion the a2a check rests on: at 4 nodes the planner's NIC-bound term, in DeepEP's bytes, is
    nodes / (nodes - 1) x NIC x a2a_efficiency; a planner with every copy crossing would read lower."""
    hw = h800()
    assert a2a_gb_s(hw, 32, 8, 8) == pytest.approx(4 / 3 * hw.nic_gb_s * hw.a2a_efficiency)
    assert a2a_gb_s(hw, 8, 8, 8) == pytest.approx(hw.nvlink_gb_s * hw.a2a_efficiency)
