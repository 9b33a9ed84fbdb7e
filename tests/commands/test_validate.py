"""`python -m orchestrator validate` (orchestrator/commands/validate.py): the published rows load with their
source and release, the JSON has its fields, the calibration reads fit rows only, bad input is one error line."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from orchestrator.commands import validate as V
from orchestrator.config import available

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {
    "source",
    "release",
    "model",
    "system",
    "gpus",
    "layout",
    "measured_tokens_per_gpu",
    "predicted_tokens_per_gpu",
    "error",
    "rank_pct",
    "held_out",
    "measured_tflops_per_gpu",
    "predicted_tflops_per_gpu",
    "calibrated_error",
}


@pytest.mark.long
def test_every_published_row_names_its_source_release_model_and_system():
    data = yaml.safe_load(V.PUBLISHED.read_text())
    assert data["source"]["repository"] == "https://github.com/NVIDIA-NeMo/Megatron-Bridge"
    # the split (fit 26.02 + 25.11, 25.09 held out) and the dropless releases after 26.02, held out too
    assert set(data["fit_releases"]) == {"26.02", "25.11"} and data["held_out_releases"][0] == "25.09"
    assert set(data["held_out_releases"]) >= {"26.02.01", "26.04", "26.04.01", "26.06", "26.06.01", "26.08"}
    rows = V.load_rows()
    assert len(rows) == len(data["rows"]) >= 120
    for r in rows:
        assert r.release in data["fit_releases"] + data["held_out_releases"]
        assert r.file in ("docs/performance-summary-archive.md", "docs/performance-summary.md")
        assert r.source.endswith(f"{r.file}#L{r.line}") and "/blob/067f987df03b/" in r.source
        assert r.file == "docs/performance-summary.md" or r.release != "26.08"  # 26.08 is the current table
        assert r.model in available("model") and r.system in available("hardware")
        assert r.recipe and "@" in r.recipe  # the performance recipe the knobs were read from, and its commit
        assert r.held_out == (r.release not in data["fit_releases"])
        assert r.tokens > 0 and r.tflops > 0
        assert r.cuda_graph_impl in ("none", "local", "transformer_engine", "full_iteration")
        assert not (r.cuda_graph_impl == "full_iteration" and r.cuda_graph_scope)  # Megatron: must be empty
    # every held-out row after 26.02 is dropless (the tables' footnote), so the held-out set is not only token drop
    assert {r.routing for r in rows if r.held_out and r.release != "25.09"} == {"dropless"}
    # the anchor row: DeepSeek-V3 on 1,024 H100, 25.09, TP2 PP8 VP4 EP64, GBS 8192, 4K
    anchor = [r for r in rows if r.model == "dsv3" and r.system == "h100"]
    assert [(r.tp, r.pp, r.vp, r.ep, r.gbs, r.seq, r.gpus, r.release) for r in anchor] == [
        (2, 8, 4, 64, 8192, 4096, 1024, "25.09")
    ]


@pytest.mark.long
def test_a_release_both_fitted_and_held_out_is_refused(tmp_path):
    data = yaml.safe_load(V.PUBLISHED.read_text())
    data["held_out_releases"] = ["25.09", "25.11"]
    bad = tmp_path / "rows.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(V.UserError, match="both fitted and held out"):
        V.load_rows(bad)


@pytest.mark.long
def test_a_release_neither_fitted_nor_held_out_is_refused(tmp_path):
    data = yaml.safe_load(V.PUBLISHED.read_text())
    data["held_out_releases"] = [r for r in data["held_out_releases"] if r != "26.08"]
    bad = tmp_path / "rows.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(V.UserError, match=r"\['26.08'\] are neither fitted nor held out"):
        V.load_rows(bad)


@pytest.mark.long
def test_a_v4_row_in_a_fit_release_is_refused(tmp_path):
    """V4's rows are held out always: a file that moves one into a fit release is one error naming the row."""
    data = yaml.safe_load(V.PUBLISHED.read_text())
    v4 = [r for r in data["rows"] if r["model"].startswith("dsv4")]
    assert v4  # the 26.08 V4-Flash rows
    v4[0]["release"] = data["fit_releases"][0]
    bad = tmp_path / "rows.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(V.UserError, match=rf"line {v4[0]['line']}: {v4[0]['model']} is a V4 model in fit release"):
        V.load_rows(bad)


def test_a_row_with_an_unknown_cuda_graph_impl_is_refused(tmp_path):
    data = yaml.safe_load(V.PUBLISHED.read_text())
    data["rows"][0]["cuda_graph_impl"] = "full"  # a scope value, not an impl
    bad = tmp_path / "rows.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(V.UserError, match="cuda_graph_impl 'full' is not one of none, local"):
        V.load_rows(bad)


@pytest.fixture(scope="module")
def gb200_results():
    """Every GB200 row predicted once (fit and held out)."""
    return [V.predict(r) for r in V.load_rows() if r.system == "gb200"]


@pytest.mark.long
def test_the_held_out_rows_are_never_fitted(gb200_results):
    """Perturbing a 25.09 row's measurement leaves every factor unchanged; perturbing a fit row moves GB200's."""
    base = V.fit_factors(gb200_results)
    held = next(i for i, r in enumerate(gb200_results) if r.row.held_out)
    # the fit row at the median (9 GB200 fit rows): moving it moves the median
    fit = next(
        i
        for i, r in enumerate(gb200_results)
        if not r.row.held_out and r.row.tokens / r.predicted_tokens == base["gb200"]
    )

    def perturbed(i: int) -> dict[str, float]:
        out = list(gb200_results)
        out[i] = replace(out[i], row=replace(out[i].row, tokens=out[i].row.tokens * 10))
        return V.fit_factors(out)

    assert perturbed(held) == base
    assert perturbed(fit)["gb200"] != base["gb200"]
    assert set(base) == {"gb200"}
    ratios = sorted(r.row.tokens / r.predicted_tokens for r in gb200_results if not r.row.held_out)
    assert ratios[0] <= base["gb200"] <= ratios[-1]


@pytest.mark.long
def test_nvidias_layout_is_ranked_among_the_legal_layouts_of_its_row(gb200_results):
    for r in gb200_results:
        assert 0 <= r.rank < r.legal and 0.0 <= r.rank_pct < 1.0
        assert r.legal > 100  # the row's whole space, not the one layout
        if r.reason():
            assert r.reason().startswith(("a rule rejects it", "the planner ranks"))


@pytest.mark.long
def test_validate_json_prints_one_object_per_row_with_the_fields():
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "validate", "--format", "json", "--model", "qwen3_30b_a3b"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    published = [r for r in V.load_rows() if r.model == "qwen3_30b_a3b"]
    assert len(rows) == len(published)
    for obj, row in zip(rows, published):
        assert set(obj) >= FIELDS
        assert obj["measured_tokens_per_gpu"] == row.tokens and obj["held_out"] == row.held_out
        assert obj["error"] == pytest.approx(obj["predicted_tokens_per_gpu"] / row.tokens - 1, abs=1e-3)
        assert 0.0 <= obj["rank_pct"] <= 1.0
        assert obj["layout"].startswith(f"TP{row.tp} PP{row.pp} VPP{row.vp} CP{row.cp} EP{row.ep}")


def test_validate_refuses_overrides_with_one_error_line():
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "validate", "model=dsv3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: validate takes no config overrides")


@pytest.mark.long
def test_validate_groups_gives_each_feature_value_its_rows_median_error(gb200_results):
    """`validate --format groups`: one line per feature, each value with its row count and median signed error."""
    V.calibrate(gb200_results)
    out = V.groups(gb200_results).splitlines()
    by = {line.split()[0]: line for line in out[1:]}
    assert set(by) == set(V.features(gb200_results[0]))
    assert f"gb200: {len(gb200_results)}," in by["system"]
    hybrid = [r for r in gb200_results if r.row.dispatcher == "flex:hybridep"]
    med = sorted(r.error for r in hybrid)[len(hybrid) // 2] if len(hybrid) % 2 else None
    assert f"flex:hybridep: {len(hybrid)}," in by["dispatcher"]
    if med is not None:
        assert f"flex:hybridep: {len(hybrid)}, {med:+.0%} /" in by["dispatcher"]


@pytest.mark.long
def test_held_out_rows_are_reported_per_release(gb200_results):
    """The table's per-release held-out line: each held-out release with its own rows' median |error|, and no
    fit release among them (25.09's token-drop rows and the newer dropless ones are not averaged together)."""
    V.calibrate(gb200_results)
    by = V.held_out_by_release(gb200_results)
    held = [r for r in gb200_results if r.row.held_out]
    assert set(by) == {r.row.release for r in held} and not set(by) & {"26.02", "25.11"}
    assert sum(n for n, _, _ in by.values()) == len(held)
    for rel, (n, u, c) in by.items():
        rs = [r for r in held if r.row.release == rel]
        assert n == len(rs) and min(abs(r.error) for r in rs) <= u <= max(abs(r.error) for r in rs)
        assert min(abs(r.calibrated_error) for r in rs) <= c <= max(abs(r.calibrated_error) for r in rs)


@pytest.mark.long
def test_the_held_out_v4_rows_have_their_own_line(gb200_results):
    """The table's V4 line: the held-out V4-Flash rows alone, their median |error| as the table prints it."""
    V.calibrate(gb200_results)
    v4 = [r for r in gb200_results if r.row.model.startswith("dsv4")]
    assert v4 and all(r.row.held_out and V.is_v4_row(r) for r in v4)
    assert not any(V.is_v4_row(r) for r in gb200_results if r not in v4)
    n, u, c = V.held_out_v4(gb200_results)
    assert (n, u, c) == (len(v4), *V.median_errors(v4))
    line = f"held out, V4 rows ({n}): median |error| uncalibrated / calibrated: {u:.1%} / {c:.1%}"
    assert line in V.table(gb200_results, V.summarise(gb200_results, V.fit_factors(gb200_results)))


@pytest.mark.long
def test_the_recipes_bf16_grad_buffer_fits_nvidias_layouts_in_hbm():
    """Megatron-Bridge's performance recipes train with ddp.grad_reduce_in_fp32 = False (Megatron's
    --grad-reduce-in-bf16: a BF16 grad buffer, the file's grad_reduce_in_bf16). With it NVIDIA's GPT-OSS-120B EP8
    MBS4 layout on 64 B200 (26.04) and Qwen3-30B's PP2 VP24 MBS2 on 16 H100 (25.11) fit their parts, as they ran;
    with Megatron's default FP32 buffer the memory model puts both over HBM."""
    rows = {(r.release, r.model, r.system): r for r in V.load_rows()}
    for key in (("26.04", "gpt_oss_120b", "b200"), ("25.11", "qwen3_30b_a3b", "h100")):
        row = rows[key]
        assert row.grad_reduce_in_bf16
        model, hw = V._model(row.model), V._hardware(row.system)
        stage, recipe = V.row_stage(row, model, hw), V.row_recipe(row)
        assert recipe.grad_reduce_in_bf16

        def fits(rec, row=row, model=model, hw=hw, stage=stage):
            own = V.evaluate(model, hw, stage, row.layout(), check_memory=False, routing_sigma=0.0, recipe=rec)
            assert not isinstance(own, V.Rejected)
            return own.prediction.feasible

        assert fits(recipe), key
        assert not fits(replace(recipe, grad_reduce_in_bf16=False)), key


@pytest.mark.long
def test_the_prices_step_bias_is_the_fit_rows_and_reads_no_held_out_row():
    """stage.budget.price_step_bias and price_step_sd (the whole sweep's price) are what the fit rows say of the
    planner's step, to two figures; a held-out row moved tenfold changes neither."""
    from orchestrator.core.schema import BudgetConfig

    rows = V.load_rows()
    bias, sd = V.step_bias(V.fit_step_ratios(rows))
    assert bias > 1.0  # the planner runs fast on the published rows
    assert (round(bias, 2), round(sd, 2)) == (BudgetConfig.price_step_bias, BudgetConfig.price_step_sd)
    held = next(i for i, r in enumerate(rows) if r.held_out)
    moved = [replace(r, tokens=r.tokens * 10) if i == held else r for i, r in enumerate(rows)]
    assert V.step_bias(V.fit_step_ratios(moved)) == (bias, sd)
