"""The rank probes a sweep launches, held against Megatron-LM dev's own run-time code on CPU (not a mock): dev's
P2PCommunicator and alltoall token dispatcher under torch's fake backend, configured from each probe's own argv
(dev's parse_args, validate_args, TransformerConfig), with the probe mode as the job installs it
(orchestrator/job/probe_mode.py) and without it. The harness is tests/job/probe_conformance.py; the tree is dev at
the tested commit, exported from a local mirror (tests/megatron_env.megatron_tree).

With the mode: every received pipeline tensor has the sender's shape and finite values, and every local expert
receives the balanced k x T_group / E tokens. Without it dev fails as a real probe does: the shape received is
unwritten (zeros, or garbage that overflows `torch.empty` at p2p_communication.py:331), and the experts receive EP
copies of the rank's own routing."""

from __future__ import annotations

import json
import os

import pytest

from orchestrator.config import compose
from orchestrator.core.megatron import TESTED_COMMIT
from orchestrator.core.states import Fidelity
from orchestrator.job import probe_mode
from orchestrator.plan import probe
from orchestrator.plan.layout import Layout
from orchestrator.runspec import build_spec
from orchestrator.search.env import PlanEnv
from orchestrator.sweep.preview import preview
from tests import tour
from tests.megatron_env import DEV, MIRROR, megatron_tree, mirror_has, run_in_tree

# The heaviest integration tests of the suite (the README tour's two sweeps, then dev's code on every probed rank):
# on a loaded 2-core CI machine they outlasted the suite's 900 s per-test limit (it guards against hangs, not speed).
pytestmark = pytest.mark.timeout(2400)


def tree():
    if os.environ.get("CI") and not mirror_has(DEV):
        pytest.fail(f"CI must hold rank probes to Megatron-LM dev: no mirror at {MIRROR} (MEGATRON_LM_GIT)")
    return megatron_tree(DEV)


def spec_case(spec, rank: int, mode: str, key: str) -> dict:
    """A harness case: the probe job's argv and environment as the job gets them (its JobSpec), one rank."""
    env = {k: v for k, v in spec.env.items() if not k.startswith("ORCH_")}
    return {"key": key, "argv": spec.argv, "world": spec.n_gpus, "rank": rank, "mode": mode, "env": env}


def round0_cases(stage: str, mode: str) -> list[dict]:
    """Every probed rank of every round-0 rank probe of a fresh sweep of `stage` (the dry run's round 0)."""
    cfg = compose([f"+stage={stage}", "cluster=local"]).cfg
    env = PlanEnv(cfg.model, cfg.hardware, cfg.stage, cfg.workload.name)
    cases = []
    for i, p in enumerate(preview(cfg).proposals):
        if p.fidelity != Fidelity.PROBE:
            continue
        planned = env.evaluate_unchecked(p.layout, None, 1.0)
        spec = build_spec(
            cfg,
            planned,
            sweep="c",
            attempt=1,
            job_dir="/nonexistent",
            window=(0, 5),
            fidelity=Fidelity.PROBE,
            probe_ranks=p.probe_ranks,
        )
        assert spec.env.get(probe.MODE_ENV) == cfg.workload.probe_mode  # runspec turns the mode on for a probe
        for r in spec.probe_ranks:
            cases.append(spec_case(spec, r, mode, f"{stage} #{i} {p.layout.short()} rank {r} {mode}"))
    return cases


def run_cases(cases: list[dict], tmp_path, name: str) -> dict:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cases))
    out = run_in_tree(tree(), "tests.job.probe_conformance", str(path), timeout=1800)
    print(f"probe conformance {name}: Megatron from {out['megatron']} (commit {out['commit']}), torch {out['torch']}")
    assert out["commit"].startswith(TESTED_COMMIT), out["commit"]  # dev at the tested commit, not the wheel
    assert "/megatron/core/" in out["megatron"] and "site-packages" not in out["megatron"], out["megatron"]
    return out["cases"]


def faithful(result: dict) -> list[str]:
    """What a case got wrong with the mode on ([] when the rank computes as in the real job)."""
    wrong = []
    if "error" in result:
        return [result["error"]]
    for side, got in result.get("pipeline", {}).items():
        if side not in ("forward", "backward"):
            continue
        if got.get("error") or got.get("got") != got.get("want") or not got.get("finite"):
            wrong.append(f"{side}: {got}")
    e = result.get("experts")
    if e is not None and not (
        e.get("per_expert_all_balanced")
        and e.get("received_finite")
        and e.get("combined_shape_ok")
        and e.get("grad_finite")
    ):
        wrong.append(f"experts: {e}")
    if result.get("mode", {}).get("mode") != probe.MODE:
        wrong.append(f"mode not installed: {result.get('mode')}")
    return wrong


@pytest.mark.long
@pytest.mark.xdist_group(tour.GROUP)  # the README tour's run (tests/tour.py), shared with its own test
def test_every_pp_probe_of_the_tours_1k_and_8k_sweeps_runs_on_dev_as_its_job_installs_it(readme_tour, tmp_path):
    """The probe jobs the README tour's default 1k and 8k twin sweeps launched (8k promotes the 1k winners), read
    back from their folders: argv, environment (the mode as the job installs it: probe_mode.from_env) and ranks
    from job.json; the mode each ran with from its sidecars. The finalists' parity jobs are full-window jobs, no
    probes; the tour's slice sweep is left out."""
    from orchestrator.core.spec import JobSpec

    readme_tour.require_complete()
    runs = readme_tour.folder / "runs"
    cases, folders = [], []
    for path in sorted(runs.rglob("job.json")):
        if path.relative_to(runs).parts[0].split("-")[0] not in ("1k", "8k"):
            continue
        spec = JobSpec.load(path)
        if not spec.probe_ranks or Layout.from_dict(spec.layout).pp == 1:
            continue
        folders.append(path.parent)
        mode, _ = probe_mode.from_env(spec.env)
        for r in spec.probe_ranks:
            cases.append(spec_case(spec, r, mode or probe.OFF, f"{path.parent.relative_to(runs)} r{r}"))
        said = {ln for p in path.parent.glob("rank-*.out") for ln in p.read_text().splitlines() if "probe mode" in ln}
        assert said and all(ln.startswith(probe.mode_line(probe.MODE)) for ln in said), (path.parent, said)
        sidecars = [json.loads(p.read_text()) for p in path.parent.glob("sidecar-rank-*.json")]  # none after an OOM
        assert all(s["probe_mode"]["mode"] == probe.MODE for s in sidecars), path.parent
    assert {f.relative_to(runs).parts[0].split("-")[0] for f in folders} == {"1k", "8k"}, folders
    results = run_cases(cases, tmp_path, "sweeps")
    bad = {k: w for k, r in results.items() if (w := faithful(r))}
    assert not bad, bad
    assert all(r["pipeline"]["variable_seq_lengths"] for r in results.values())  # dev would exchange shapes


@pytest.mark.long
@pytest.mark.parametrize("stage", ["16k"])  # 1k and 8k: every probe their sweeps launch, above
def test_round0_probes_run_on_dev_with_the_probe_mode(stage, tmp_path):
    cases = round0_cases(stage, probe.MODE)
    assert cases
    results = run_cases(cases, tmp_path, stage)
    piped = [k for k, r in results.items() if r.get("pipeline")]
    assert piped, "every stage's round 0 has PP > 1 layouts"
    bad = {k: w for k, r in results.items() if (w := faithful(r))}
    assert not bad, bad
    for r in results.values():  # the mode acted where the rank has a neighbour stage and remote experts
        counts = r["mode"]["counts"]
        assert counts.get("static_shapes", 0) >= (1 if r.get("pipeline") else 0), r
        assert counts.get("dispatches_balanced", 0) >= (1 if r.get("experts") else 0), r


@pytest.mark.long
def test_without_the_mode_dev_fails_as_a_real_probe_does(tmp_path):
    """The guard guards something: the same argv, no mode, dev's own code."""
    cases = [c for c in round0_cases("1k", probe.OFF)][:4]  # one PP>1 layout's first and last stage, and another's
    results = run_cases(cases, tmp_path, "1k-off")
    shapes, experts = [], []
    for key, r in results.items():
        for side, got in r.get("pipeline", {}).items():
            if side in ("forward", "backward"):
                shapes.append(got.get("error") or (got["got"] != got["want"] and f"received {got['got']}"))
        if r.get("experts"):
            experts.append(r["experts"]["per_expert_all_balanced"])
        assert r.get("mode") is None, key
    assert shapes and all(shapes), results  # every receive got an unwritten shape: zeros, or an overflow
    assert any("Storage size calculation overflowed" in s or "[0, 0, 0]" in s for s in shapes), shapes
    assert experts and not any(experts), results  # EP copies of the rank's own routing, not balanced
