"""Backends are plug-ins (issue 46 item 3): every folder under orchestrator/launch/ registers itself, and a toy
backend registered from this test module alone is checked at compose, recorded in a sweep's provenance, asked by
preflight, picked by name, and runs a sweep that stays bound to it, through the registry (orchestrator/launch/auto),
with no other file touched. The toy runs its jobs as the local launcher does (a subclass under its own kind). And in a
copy of the project, a folder under launch/ plus its conf/cluster YAML is a backend `cluster=<kind>` picks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from orchestrator import preflight
from orchestrator.cli import main
from orchestrator.config import ConfigError, compose
from orchestrator.core.errors import UserError
from orchestrator.core.schema import ClusterConfig, StageConfig
from orchestrator.evidence.ingest import judge
from orchestrator.launch import auto, registry
from orchestrator.launch.local import LocalLauncher
from orchestrator.launch.registry import Answer, Backend, Row
from orchestrator.ledger.ledger import Ledger
from orchestrator.sweep.setup import provenance
from tests.sweeplib import ROOT, UNCUT, ledger_url, sweep_args


class ToyLauncher(LocalLauncher):
    kind = "toy"


def toy_check(cluster: ClusterConfig) -> None:
    if "TOY_REFUSE" in cluster.env:
        raise UserError("cluster.env.TOY_REFUSE is set: the toy backend refuses it; drop it")


def toy_limits(cluster: ClusterConfig, stage: StageConfig, asked: Mapping[str, int]) -> Answer:
    over = {key: f"asks for {t} min > the toy's 20 min" for key, t in asked.items() if t > 20}
    return Answer((Row("toy limits", "warn" if over else "pass", f"{len(over)} over 20 min"),), over)


def toy_refusal(cluster: ClusterConfig, stage: StageConfig) -> str | None:
    return f"stage {stage.name}'s jobs ask for {stage.gpus} GPUs, more than the toy's 64" if stage.gpus > 64 else None


TOY = Backend(
    kind="toy",
    name="the toy executor",
    launcher=ToyLauncher,
    check=toy_check,
    provenance=lambda cluster: {"toy": {"folder": cluster.folder}},
    settings=lambda cluster: Answer((Row("toy settings", "pass", "nothing to pin"),), recorded={"toy": {"ok": 1}}),
    limits=toy_limits,
    refusal=toy_refusal,
)


@pytest.fixture
def toy() -> Iterator[Backend]:
    auto.load()
    registry.register(TOY)
    yield TOY
    registry.BACKENDS.pop(TOY.kind)


def test_every_backend_folder_registers_itself_in_auto_order():
    folders = {p.name for p in (ROOT / "orchestrator" / "launch").iterdir() if (p / "__init__.py").is_file()}
    assert set(auto.kinds()) == folders - {"auto"}
    assert auto.kinds() == ("slurm", "local")  # auto tries Slurm first, then the local executor
    assert auto.for_kind("auto").kind == "slurm" and auto.for_kind("local").kind == "local"
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(Backend(kind="local", name="another", launcher=LocalLauncher))
    with pytest.raises(ValueError, match="cluster.kind=auto picks one"):
        registry.register(Backend(kind="auto", name="auto", launcher=LocalLauncher))


@pytest.mark.long
def test_a_toy_backend_is_checked_recorded_asked_and_picked_through_the_registry(toy, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="the toy backend refuses it"):
        compose(["+stage=smoke", "cluster.kind=toy", "++cluster.env.TOY_REFUSE=1"])
    cfg = compose(["+stage=smoke", "cluster.kind=toy", f"cluster.folder={tmp_path}"]).cfg
    stage = cfg.required_stage()

    launcher, why = auto.make_launcher(cfg.job_cluster())
    assert isinstance(launcher, ToyLauncher) and why == "cluster.kind=toy"
    assert provenance(cfg)["toy"] == {"folder": str(tmp_path)}

    rows, rejected = preflight.cluster_checks(cfg.job_cluster(), stage, {"a": 10, "b": 30})
    assert [(r.name, str(r.status)) for r in rows] == [("toy limits", "warn")] and list(rejected) == ["b"]
    rows, recorded = preflight.settings_checks(cfg.job_cluster())
    assert "toy settings" in [r.name for r in rows] and recorded["toy"] == {"ok": 1}
    assert preflight.stage_refusal(cfg) is None
    big = compose(["+stage=smoke", "cluster.kind=toy", "stage.gpus=128"]).cfg
    assert preflight.stage_refusal(big) == "stage smoke's jobs ask for 128 GPUs, more than the toy's 64"

    with pytest.raises(UserError, match="use auto, slurm, local or toy"):
        auto.make_launcher(ClusterConfig(kind="pbs"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no Slurm: auto falls back past the toy (no auto_order)
    assert auto.make_launcher(ClusterConfig(kind="auto"))[0].kind == "local"


@pytest.mark.long
def test_a_sweep_runs_on_the_toy_backend_and_stays_bound_to_it(toy, tmp_path, capsys):
    args = sweep_args(
        tmp_path, "toyrun", "cluster.kind=toy", "policy.schedule.round0_size=2", "stage.budget.max_rounds=1", UNCUT
    )
    assert main(["sweep", *args, "--plain"]) == 0, capsys.readouterr().err
    assert "cluster: toy (cluster.kind=toy)" in capsys.readouterr().out
    with Ledger.open(ledger_url(tmp_path), create=False) as led:
        sweep = led.get_sweep("toyrun")
        assert sweep is not None and sweep.provenance["launcher"] == "toy"
        assert sweep.provenance["toy"] == {"folder": str(tmp_path / "runs")}
        jobs = [a for c in led.candidates("toyrun") for a in led.attempts(c.id) if a.job_id]
    assert len(jobs) >= 2
    folder = Path(jobs[0].job_dir)
    assert json.loads((folder / "job-exit.json").read_text())["launcher"] == "toy"  # the job's own record
    assert judge(folder).launcher == "toy"  # `ledger ingest` would bind a rebuilt sweep to the toy
    assert main(["resume", "toyrun", f"ledger.url={ledger_url(tmp_path)}", "--plain"]) == 0
    assert "cluster: toy (bound to the sweep)" in capsys.readouterr().out


TOY_FOLDER = '''"""A toy backend: the local executor's processes under another kind."""

from orchestrator.launch.local.launcher import LocalLauncher
from orchestrator.launch.registry import Backend, register


class ToyLauncher(LocalLauncher):
    kind = "toy"


BACKEND = register(Backend(kind="toy", name="the toy executor", launcher=ToyLauncher))
'''
PICK = """
import json
from orchestrator.config import compose
from orchestrator.launch import auto
cfg = compose(["+stage=smoke", "cluster=toy"]).cfg
launcher, why = auto.make_launcher(cfg.job_cluster())
print(json.dumps([list(auto.kinds()), cfg.cluster.kind, launcher.kind, why]))
"""


def test_a_new_backend_is_one_folder_and_its_config_group(tmp_path):
    """In a copy of the project, the two files a new backend adds, launch/toy/__init__.py and conf/cluster/toy.yaml,
    are all it takes: the registry finds the folder, `cluster=toy` composes and picks it."""
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "orchestrator", tmp_path / "orchestrator", ignore=skip)
    shutil.copytree(ROOT / "conf", tmp_path / "conf", ignore=skip)
    (tmp_path / "orchestrator" / "launch" / "toy").mkdir()
    (tmp_path / "orchestrator" / "launch" / "toy" / "__init__.py").write_text(TOY_FOLDER)
    (tmp_path / "conf" / "cluster" / "toy.yaml").write_text("kind: toy\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", PICK], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    kinds, kind, picked, why = json.loads(out.stdout.strip().splitlines()[-1])
    assert kinds == ["slurm", "local", "toy"] and (kind, picked, why) == ("toy", "toy", "cluster.kind=toy")
