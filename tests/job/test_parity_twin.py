"""The correctness gate on the twin, slice stage (4-block V4-Pro, 64 GPUs): a CP2 candidate against its CP1
reference agrees within the declared tolerance; with an injected numerical divergence for CP2
(twin.diverge_when) it fails, and the verdict names the step."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from orchestrator import runspec
from orchestrator.config import compose
from orchestrator.evidence import parity
from orchestrator.evidence.collect import collect
from orchestrator.job.entry import run_task
from orchestrator.job.twin import curves
from orchestrator.plan import planner
from orchestrator.plan.layout import Layout
from orchestrator.sweep.finalists import reference_layout

FAST = ["++workload.twin.time_scale=0.00001", "++workload.twin.max_sleep_s=0.001"]
CANDIDATE = Layout(tp=1, pp=1, vpp=1, cp=2, ep=32, etp=1, mbs=1)


def _pair(tmp_path: Path, *extra: str):
    """Run candidate and reference parity jobs; return (cfg, candidate result, reference result)."""
    cfg = compose(["+stage=slice", "cluster=local", f"cluster.folder={tmp_path}", *FAST, *extra]).cfg
    ref = reference_layout(cfg, CANDIDATE)
    assert ref.cp == 1 and ref.ep == CANDIDATE.ep  # only the reference knobs change
    out = []
    for name, lay in (("candidate", CANDIDATE), ("reference", ref)):
        pl = planner.evaluate(cfg.model, cfg.hardware, cfg.stage, lay, workload="twin")
        assert isinstance(pl, planner.Planned), pl
        spec = runspec.parity_spec(cfg, pl, sweep="parity", attempt=1, job_dir=tmp_path / name)
        assert spec.window == (0, cfg.parity.steps) and spec.stage == cfg.stage  # the stage is not rewritten
        run_task(spec)
        res = collect(spec.job_dir, slurm_state="COMPLETED", exit_code=0)
        assert res.ok and len(res.lm_loss) == cfg.parity.steps == len(res.grad_norm), res.failure_detail
        out.append(res)
    return cfg, out[0], out[1]


def _verdict(cfg, mine, ref) -> parity.Parity:
    p = cfg.parity
    return parity.compare(
        mine.lm_loss,
        ref.lm_loss,
        mine.grad_norm,
        ref.grad_norm,
        steps=p.steps,
        loss_rtol=p.loss_rtol,
        grad_norm_rtol=p.grad_norm_rtol,
    )


@pytest.mark.long
def test_cp2_matches_its_cp1_reference(tmp_path):
    cfg, mine, ref = _pair(tmp_path)
    v = _verdict(cfg, mine, ref)
    assert v.passed and v.steps == cfg.parity.steps, v.detail
    # not bit-identical (layout noise, as on the packed path) but well inside the tolerance
    assert 0 < v.max_loss_diff < cfg.parity.loss_rtol / 5
    assert 0 < v.max_grad_norm_diff < cfg.parity.grad_norm_rtol / 5


def test_injected_divergence_fails_the_gate_and_names_the_step(tmp_path):
    cfg, mine, ref = _pair(tmp_path, "++workload.twin.diverge_when={cp: 2}")
    v = _verdict(cfg, mine, ref)
    assert not v.passed
    assert "lm loss differs" in v.detail and f"at step {cfg.parity.steps}" in v.detail, v.detail
    assert v.max_loss_diff > cfg.parity.loss_rtol and v.max_grad_norm_diff > cfg.parity.grad_norm_rtol
    rel = [a / b - 1 for a, b in zip(mine.lm_loss, ref.lm_loss)]
    assert rel[-1] > rel[len(rel) // 2] > rel[0]  # the drift grows with the iteration


def test_loss_curve_is_shared_across_layouts_and_drifts_only_when_asked():
    a = [curves.loss_curve(3, it, vocab_size=129280, layout_tag="A") for it in range(1, 41)]
    b = [curves.loss_curve(3, it, vocab_size=129280, layout_tag="B") for it in range(1, 41)]
    other_seed = curves.loss_curve(4, 5, vocab_size=129280, layout_tag="A")
    for (la, ga), (lb, gb) in zip(a, b):
        assert la == pytest.approx(lb, rel=2 * curves.LAYOUT_NOISE) and ga == pytest.approx(
            gb, rel=2 * curves.LAYOUT_NOISE
        )
    assert a[0][0] > a[-1][0]  # training: the loss goes down
    assert other_seed != a[4]
    d = [curves.loss_curve(3, it, vocab_size=129280, layout_tag="A", drift_scale=0.05) for it in range(1, 41)]
    rel = [x[0] / y[0] - 1 for x, y in zip(d, a)]
    assert all(r2 > r1 > 0 for r1, r2 in itertools.pairwise(rel)) and rel[-1] < 0.05
    assert curves.diverges(Layout(cp=4, ep=8), {"cp": 4}) and not curves.diverges(Layout(cp=2), {"cp": 4})
    assert not curves.diverges(Layout(cp=4), {})
