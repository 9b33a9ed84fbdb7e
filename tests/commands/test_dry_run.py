"""`sweep --dry-run` and `--cfg` (issue 21): the price before the spend, nothing launched, nothing written."""

from __future__ import annotations

import re

import pytest
import yaml

from orchestrator.config import compose
from orchestrator.core import cost
from orchestrator.sweep.preview import preview
from tests.sweeplib import cli, ledger_url, sweep_args


@pytest.mark.long
def test_dry_run_prints_budget_and_cluster_days_and_launches_nothing(tmp_path):
    args = ["+stage=1k", f"ledger.url={ledger_url(tmp_path)}", f"cluster.folder={tmp_path / 'runs'}"]
    args.append("stage.budget.price_samples=0")  # the whole sweep's price: its own test below
    got = cli("sweep", *args, "--dry-run", timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    cfg = compose(args).cfg
    budget = cfg.stage.budget.max_gpu_hours
    days = cost.cluster_hours(budget, cfg.stage.gpus) / 24
    line = re.search(r"^budget: ([\d,]+) GPU-hours = ([\d.]+) days of the stage's 1,024 GPUs", got.stdout, re.M)
    assert line, got.stdout
    assert float(line[1].replace(",", "")) == budget and float(line[2]) == round(days, 1)
    assert "config: stage 1k N=1,024 GPUs = 128 nodes x 8" in got.stdout
    layouts = re.findall(
        r"^  \d+\. (TP\d+ .+?)  \w+, predicted step [\d.]+ s, ([\d,]+) GPU-hours(?:; (saves|loads) the seed)?$",
        got.stdout,
        re.M,
    )
    assert layouts, got.stdout
    # probe-led (policy.schedule.probe_led): round 0 rank-probes every layout, one GPU per probed rank, so nothing
    # saves or loads the seed yet; round 1 is priced as round 0's own layouts at scale, the first saving the seed
    assert all(re.search(rf"{re.escape(lay)}  probe, ", got.stdout) for lay, *_ in layouts)
    assert [seed for *_, seed in layouts] == [""] * len(layouts)
    pv = preview(cfg)
    first = pv.next_at_scale
    assert first and first[0].seed_save and all(p.after_seed for p in first[1:])
    assert len(first) == cfg.policy.schedule.round0_size and all(p.fidelity == "full" for p in first)
    nxt = re.search(
        r"^after round 0: .* at most (\d+) at scale \(the first saves the seed\): about ([\d,]+) GPU", got.stdout, re.M
    )
    assert nxt and int(nxt[1]) == len(first), got.stdout
    assert float(nxt[2].replace(",", "")) == round(sum(p.est_gpu_hours for p in first))
    assert sum(p.est_gpu_hours for p in pv.proposals) < 0.01 * float(nxt[2].replace(",", ""))  # probes are cheap
    layouts = [(lay, h) for lay, h, _ in layouts]
    # the driver's round 0 on an empty ledger: the same layouts, costed by core/cost
    assert [lay for lay, _ in layouts] == [p.layout.short() for p in pv.proposals]
    assert [float(h.replace(",", "")) for _, h in layouts] == [round(p.est_gpu_hours) for p in pv.proposals]
    assert "nothing launched" in got.stdout
    assert not (tmp_path / "ledger.sqlite").exists() and not (tmp_path / "runs").exists()


@pytest.mark.long
def test_dry_run_prints_the_whole_sweeps_simulated_price(tmp_path):
    args = ["+stage=1k", "stage.budget.max_runs=6", "stage.budget.max_rounds=3", "stage.budget.price_samples=2"]
    args += [f"ledger.url={ledger_url(tmp_path)}", f"cluster.folder={tmp_path / 'runs'}"]
    got = cli("sweep", *args, "--dry-run", timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]
    line = re.search(
        r"^whole sweep \(simulated: the policy run on 2 surfaces drawn from the planner's predictions and error "
        r"bands\): expected total ([\d,]+) GPU-h \(90%: ([\d,]+)-([\d,]+)\), ([\d.,]+) cluster-hours on 1,024 GPUs$",
        got.stdout,
        re.M,
    )
    assert line, got.stdout
    mean, lo, hi = (float(line[i].replace(",", "")) for i in (1, 2, 3))
    assert lo <= mean <= hi and mean > 0
    composed = compose(args)
    assert preview(composed.cfg, composed.to_yaml(), samples=2).whole.line() == line[0]  # seeded: the same figures
    assert not (tmp_path / "ledger.sqlite").exists() and not (tmp_path / "runs").exists()


@pytest.mark.long
def test_dry_run_at_8k_prices_the_parity_gate_on_by_default(tmp_path):
    """Issue 49 item 4: the finalists' correctness gate is on at 8k without a word from the user, and the price
    says what it launches: each of the top finalists and its CP1 reference (one the model allows at 8k), each
    start-up + parity.steps iterations at its predicted step (core/cost)."""
    from orchestrator.sweep import finalists

    args = ["+stage=8k", f"ledger.url={ledger_url(tmp_path)}", f"cluster.folder={tmp_path / 'runs'}"]
    args.append("stage.budget.price_samples=0")  # the whole sweep's price: its own tests below
    got = cli("sweep", *args, "--dry-run", timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    line = re.search(
        r"^parity gate: top (\d+) finalist\(s\) beside a cp=1 reference, (\d+) steps: (\d+) launch\(es\), "
        r"predicted ([\d,]+) GPU-hours \(round 0's best at scale; parity.enabled=false skips it\)$",
        got.stdout,
        re.M,
    )
    assert line, got.stdout
    cfg = compose(args).cfg
    assert cfg.parity.enabled and int(line[1]) == cfg.policy.search.promote_top_k and int(line[2]) == cfg.parity.steps
    top = preview(cfg).next_at_scale[: cfg.policy.search.promote_top_k]  # the schedule's order: the best rated first
    jobs = {}
    for p in top:  # each finalist at its predicted step, and its reference (a shared one once)
        ref, why = finalists.reference(cfg, p.layout, lambda: finalists.stage_layouts(cfg))
        assert ref is not None and ref.layout.cp == 1 < p.layout.cp, why
        jobs[p.key] = p.predicted_step_s
        jobs[ref.key] = ref.prediction.step_time_s
    assert int(line[3]) == len(jobs) > len(top)
    st = cfg.stage
    hours = sum(cost.launch_gpu_hours(st.gpus, st.budget.startup_s, s, cfg.parity.steps) for s in jobs.values())
    assert float(line[4].replace(",", "")) == round(hours) > 0
    off = cli("sweep", *args, "parity.enabled=false", "--dry-run", timeout=300)
    assert "parity gate: off (parity.enabled=false)" in off.stdout, off.stdout


@pytest.mark.long
def test_cfg_prints_the_resolved_config_as_yaml_with_overrides_applied(tmp_path):
    got = cli("sweep", "+stage=1k", "stage.gpus=512", "hardware=gb200", "--cfg", timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    cfg = yaml.safe_load(got.stdout)
    assert cfg["stage"]["gpus"] == 512 and cfg["hardware"]["name"] == "gb200"
    assert cfg["stage"]["budget"]["max_gpu_hours"] == 220000.0


@pytest.mark.long
def test_a_plain_8k_dry_run_prices_the_whole_sweep(tmp_path):
    """Issue 48's check, as a user types it: `sweep +stage=8k --dry-run` with no price setting prints the whole
    sweep's expected total and 90% range (the schema's default samples, the 1k source simulated first on each)."""
    assert compose(["+stage=8k"]).cfg.stage.budget.price_samples > 0  # the default prices; no override below
    got = cli("sweep", "+stage=8k", "--dry-run", timeout=1800)
    assert got.returncode == 0, got.stderr[-2000:]
    priced = [x for x in got.stdout.splitlines() if x.startswith("whole sweep (simulated")]
    assert len(priced) == 1, got.stdout[-3000:]
    found = re.findall(
        r"expected total ([\d.,]+) GPU-h \(90%: ([\d.,]+)-([\d.,]+)\), ([\d.,]+) cluster-hours on 8,192", priced[0]
    )
    assert found, priced[0]
    mean, lo, hi, hours = (float(x.replace(",", "")) for x in found[0])
    assert 0 < lo < mean < hi and hours > 0


@pytest.mark.long
def test_a_real_sweep_starts_with_the_same_block(tmp_path):
    args = sweep_args(
        tmp_path, "priced", "stage.budget.max_runs=2", "policy.schedule.round0_size=2", "stage.budget.price_samples=2"
    )
    dry = cli("sweep", *args, "--dry-run")
    assert dry.returncode == 0, dry.stderr[-2000:]
    real = cli("sweep", *args, "--plain")
    assert real.returncode == 0, real.stderr[-2000:]
    block = dry.stdout.splitlines()[:-1]  # all but the dry run's last line
    priced = [x for x in block if x.startswith("whole sweep (simulated")]
    assert len(priced) == 1 and block[-1] == priced[0], block
    # the sweep says round 0's block first, then (once it knows the sweep is new and the cluster can run it, the
    # cluster's line said) the same whole-sweep price, before it submits anything
    lines = real.stdout.splitlines()
    assert lines[: len(block) - 1] == block[:-1]
    assert lines.index(priced[0]) < next(n for n, line in enumerate(lines) if line.startswith("submitted "))
    mean, lo, hi = (
        float(x.replace(",", ""))
        for x in re.findall(r"total ([\d.,]+) GPU-h \(90%: ([\d.,e-]+)-([\d.,e-]+)\)", priced[0])[0]
    )
    # status keeps it (the sweep's provenance) and says the spend against it
    status = cli("status", "priced", f"ledger.url={ledger_url(tmp_path)}")
    assert status.returncode == 0, status.stderr[-2000:]
    spent = re.search(r"^  price: spent ([\d.,e-]+) GPU-h of an expected ([\d.,e-]+) \(90%: ", status.stdout, re.M)
    assert spent, status.stdout
    assert float(spent[2].replace(",", "")) == mean and lo <= mean <= hi
