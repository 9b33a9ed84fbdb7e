"""`export --mlflow` / `export --wandb` (issue 49 item 3): each measured run in MLflow (a local store) and in
Weights & Biases (offline run folders, read back from wandb's own records) with its layout as params, p50/p95/p99,
peak memory, token drop, tokens/s and MFU as metrics, its evidence bundle as an artifact and a `simulated` tag;
exporting again adds no run; without the library, one `error:` line naming the extra and nothing written."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core import metrics
from orchestrator.ledger import queries
from orchestrator.ledger.ledger import Ledger
from orchestrator.report import tracking
from orchestrator.report.tensorboard import PEAK_GB
from tests.report.test_report import _fill, _result

ROOT = Path(__file__).resolve().parents[2]
WANT = {"step_p50_s", "step_p95_s", "step_p99_s", PEAK_GB, "token_drop_fraction", "tokens_per_s", "mfu"}


@pytest.fixture
def ledger(tmp_path):
    """_fill's two sweeps, plus a measured (not simulated) result for s2's one candidate, its latest."""
    with Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}") as led:
        _fill(led)
        child = led.evidence.measured(sweep="s2")[0]
        a = led.new_attempt(child.candidate_id, job_id="3000", job_dir="/tmp/m", simulated=False)
        led.update_attempt(a.id, state="COMPLETED", exit_code=0)
        real = _result(0.65, random.Random(3), peak=40)
        led.evidence.record_result(a.id, {**real, "simulated": False})
        yield led


def _truth(ledger: Ledger, sweep: str) -> dict[int, dict]:
    cols = ["candidate_id", "pp", "ep", "cp", "step_p50_s", "step_p95_s", "peak_reserved_gb", "peak_allocated_gb"]
    return {r["candidate_id"]: r for r in queries.compare(ledger, sweep=sweep, columns=cols) if r["step_p50_s"]}


@pytest.mark.long
def test_mlflow_runs_carry_params_metrics_tags_and_the_evidence(ledger, tmp_path):
    pytest.importorskip("mlflow", reason="the optional `track` extra is not installed")
    from mlflow.tracking import MlflowClient

    truth = _truth(ledger, "s1")
    out = tracking.to_mlflow(tracking.runs(ledger, "s1"), str(tmp_path / "ml"), "layouts")
    assert out.written == len(truth) == 7 and out.unchanged == 0  # the OOM candidate has no measurement
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("layouts")
    got = client.search_runs([exp.experiment_id])
    assert len(got) == 7
    best = queries.best(ledger, sweep="s1")
    for run in got:
        tags, params, values = run.data.tags, run.data.params, run.data.metrics
        cid = int(tags[tracking.CANDIDATE_TAG].split("/")[1])
        row = truth[cid]
        assert (params["pp"], params["ep"], params["cp"]) == (str(row["pp"]), str(row["ep"]), str(row["cp"]))
        assert set(values) >= WANT
        assert values["step_p50_s"] == pytest.approx(row["step_p50_s"])
        assert values["step_p95_s"] == pytest.approx(row["step_p95_s"])
        assert values[PEAK_GB] == pytest.approx(metrics.peak_gb(row))
        assert tags["simulated"] == "true" and tags["fidelity"] == "full" and tags["status"] == "done"
        assert tags["best"] == str(cid == best["candidate_id"]).lower()
        arts = [a.path for a in client.list_artifacts(run.info.run_id, tracking.EVIDENCE)]
        assert arts == [f"{tracking.EVIDENCE}/bundle.json"]
        bundle = json.loads(Path(client.download_artifacts(run.info.run_id, arts[0], str(tmp_path))).read_text())
        assert bundle["simulated"] is True and "parity" in bundle["rows"]
    parity = {r.data.tags["parity"] for r in got}
    assert "failed" in parity and "not run" in parity  # candidate 0's injected divergence; the others had none


@pytest.mark.long
def test_mlflow_export_twice_adds_no_run_and_a_newer_result_updates_its_run(ledger, tmp_path):
    pytest.importorskip("mlflow", reason="the optional `track` extra is not installed")
    from mlflow.tracking import MlflowClient

    target = str(tmp_path / "ml")
    first = tracking.to_mlflow(tracking.runs(ledger, "s2"), target, "layouts")
    again = tracking.to_mlflow(tracking.runs(ledger, "s2"), target, "layouts")
    assert (first.written, first.unchanged, again.written, again.unchanged) == (1, 0, 0, 1)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}")
    exp_id = client.get_experiment_by_name("layouts").experiment_id
    (run,) = client.search_runs([exp_id])
    assert run.data.tags["simulated"] == "false"  # s2's latest result was measured, not simulated
    # a newer result of the same candidate: the same run, its result tag and metrics updated
    child = ledger.evidence.measured(sweep="s2")[0]
    a = ledger.new_attempt(child.candidate_id, job_id="3001", job_dir="/tmp/n", simulated=True)
    ledger.update_attempt(a.id, state="COMPLETED", exit_code=0)
    ledger.evidence.record_result(a.id, _result(0.5, random.Random(4), peak=30))
    third = tracking.to_mlflow(tracking.runs(ledger, "s2"), target, "layouts")
    (after,) = client.search_runs([exp_id])
    assert third.written == 1 and after.info.run_id == run.info.run_id
    assert after.data.tags[tracking.RESULT_TAG] != run.data.tags[tracking.RESULT_TAG]
    assert after.data.tags["simulated"] == "true"


@pytest.mark.long
def test_wandb_offline_runs_carry_params_metrics_tags_and_the_evidence(ledger, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the optional `track` extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    truth = _truth(ledger, "s1")
    out = tracking.to_wandb(tracking.runs(ledger, "s1"), "layouts", tmp_path)
    folders = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert out.written == len(folders) == len(truth) == 7 and out.where == str(tmp_path / "wandb")
    for folder in folders:
        run = tracking.read_offline(folder)
        cid = int(run.config[tracking.CANDIDATE_TAG].split("/")[1])
        row = truth[cid]
        assert run.project == "layouts" and run.run_id == f"s1-c{cid}"
        assert (run.config["pp"], run.config["ep"], run.config["cp"]) == (row["pp"], row["ep"], row["cp"])
        assert set(run.summary) >= WANT and run.summary["step_p50_s"] == pytest.approx(row["step_p50_s"])
        assert run.history and run.history[0]["step_p99_s"] == run.summary["step_p99_s"]
        assert "simulated=true" in run.tags and run.config["simulated"] == "true"
        assert run.artifacts == [{"name": f"evidence-s1-c{cid}", "type": "evidence", "files": ["bundle.json"]}]
    again = tracking.to_wandb(tracking.runs(ledger, "s1"), "layouts", tmp_path)
    assert again.written == 0 and again.unchanged == 7
    assert sorted((tmp_path / "wandb").glob("offline-run-*")) == folders


@pytest.mark.long
def test_export_through_the_cli_to_both(ledger, tmp_path):
    """`export --mlflow DIR --wandb --project P` as a user runs it (offline W&B), twice."""
    pytest.importorskip("mlflow", reason="the optional `track` extra is not installed")
    pytest.importorskip("wandb", reason="the optional `track` extra is not installed")
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wb"), "WANDB_SILENT": "true"}
    args = ["export", "--mlflow", str(tmp_path / "ml"), "--wandb", "--project", "p", "--sweep", "s2"]
    url = f"ledger.url=sqlite:///{tmp_path / 'l.sqlite'}"
    first = _cli(*args, url, env=env)
    assert first.returncode == 0, first.stderr
    assert "sweep s2: MLflow 1 run(s) written, 0 unchanged" in first.stdout
    assert "sweep s2: W&B 1 run(s) written, 0 unchanged" in first.stdout
    assert "mlflow ui --backend-store-uri sqlite:///" in first.stdout and "wandb sync" in first.stdout
    second = _cli(*args, url, env=env)
    assert second.returncode == 0 and "MLflow 0 run(s) written, 1 unchanged" in second.stdout, second.stderr
    assert len(list((tmp_path / "wb" / "wandb").glob("offline-run-*"))) == 1


def _cli(*args: str, env: dict[str, str] | None = None, probe: str = "") -> subprocess.CompletedProcess:
    import os

    code = f"{probe}\nimport sys; from orchestrator import cli; raise SystemExit(cli.main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.long
@pytest.mark.parametrize(
    ("flag", "module", "words"),
    [("--mlflow", "mlflow", "MLflow export needs mlflow"), ("--wandb", "wandb", "Weights & Biases export needs")],
)
def test_without_the_library_one_error_line_names_the_extra(tmp_path, flag, module, words):
    probe = f"import sys; sys.modules[{module!r}] = None; sys.modules[{module + '.tracking'!r}] = None"
    args = ["export", flag, *([str(tmp_path / "ml")] if flag == "--mlflow" else [])]
    out = _cli(*args, f"ledger.url=sqlite:///{tmp_path / 'l.sqlite'}", probe=probe)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {words}"), out
    assert "dsv4-orchestrator[track]" in lines[0]
    assert not (tmp_path / "ml").exists() and not (tmp_path / "l.sqlite").exists()  # nothing written, not even opened


@pytest.mark.long
def test_an_unreachable_destination_is_one_error_line_with_a_fix(ledger, tmp_path):
    """A tracking server that does not answer, and online W&B without a key: one `error:` line each, exit 2."""
    pytest.importorskip("mlflow", reason="the optional `track` extra is not installed")
    pytest.importorskip("wandb", reason="the optional `track` extra is not installed")
    url = f"ledger.url=sqlite:///{tmp_path / 'l.sqlite'}"
    down = _cli("export", "--mlflow", "http://127.0.0.1:9", "--sweep", "s1", url)  # port 9: nothing listens
    lines = down.stderr.strip().splitlines()
    assert down.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: MLflow at http://127.0.0.1:9")
    assert "--mlflow DIR" in lines[0]
    home = tmp_path / "home"  # no ~/.netrc, no wandb settings: no key anywhere
    home.mkdir()
    env = {"HOME": str(home), "WANDB_API_KEY": "", "WANDB_MODE": "online", "WANDB_DIR": str(tmp_path / "wb")}
    nokey = _cli("export", "--wandb", "--sweep", "s1", url, env=env)
    lines = nokey.stderr.strip().splitlines()
    assert nokey.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: Weights & Biases refused"), lines
    assert "WANDB_MODE=offline" in lines[0] and "WANDB_API_KEY" in lines[0]


def test_run_ids_are_safe_and_never_shared_by_two_sweeps():
    def run(sweep: str) -> tracking.TrackedRun:
        return tracking.TrackedRun(sweep, 7, 1, 0, "c7", {}, {}, {})

    assert run("s1").run_id == "s1-c7"
    odd, other = run("a.b/c'd"), run("a_b_c_d")
    assert re.fullmatch(r"[A-Za-z0-9_-]+", odd.run_id) and odd.run_id != other.run_id
    assert re.fullmatch(r"[0-9a-f]{16}", odd.ident) and odd.ident != other.ident
