"""A real-workload sweep runs preflight once before round 0: a failure refuses to launch, --skip-preflight is
recorded in the ledger, and the candidates preflight rejected are never proposed."""

from __future__ import annotations

import pytest

from orchestrator import cli, history
from orchestrator import preflight as pf
from orchestrator.config import compose
from orchestrator.core.errors import UserError
from orchestrator.core.states import EventKind
from orchestrator.job.preflight import Check, CheckStatus
from orchestrator.ledger.ledger import Ledger
from orchestrator.sweep.setup import preflight_gate
from orchestrator.sweep.view import View


@pytest.fixture
def real(tmp_path):
    cfg = compose(["+stage=smoke", "workload=megatron", "cluster=local", f"cluster.folder={tmp_path}"]).cfg
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'ledger.sqlite'}", create=True)
    sweep = ledger.create_or_get_sweep(
        "s", stage="smoke", config_yaml="", model="tiny", hardware="h200", workload="megatron", provenance={}
    )
    yield cfg, ledger, sweep
    ledger.close()


def test_failing_preflight_refuses_and_is_recorded(real, monkeypatch):
    cfg, ledger, _ = real
    bad = pf.Outcome(checks=[Check("torch + CUDA", CheckStatus.FAIL, "no GPU", "use a GPU node")], folder="f")
    monkeypatch.setattr(pf, "run", lambda cfg: bad)
    with pytest.raises(UserError, match="--skip-preflight"):
        preflight_gate(ledger, cfg, "s", skip=False, view=View(live=False))
    (event,) = ledger.events("s", kind=EventKind.PREFLIGHT)
    assert event.data["ok"] is False and event.data["checks"][0]["name"] == "torch + CUDA"
    assert not ledger.candidates("s")


def test_passing_preflight_rejects_candidates_once(real, monkeypatch):
    cfg, ledger, sweep = real
    calls = []
    good = pf.Outcome(checks=[Check("Python", CheckStatus.PASS, "3.12")], rejected={"abc": "AssertionError: no"})
    monkeypatch.setattr(pf, "run", lambda cfg: calls.append(1) or good)
    preflight_gate(ledger, cfg, "s", skip=False, view=View(live=False))
    preflight_gate(ledger, cfg, "s", skip=False, view=View(live=False))  # once per sweep
    assert calls == [1]
    assert "abc" in history.known_keys(ledger, sweep)  # the policy never proposes a known key


def test_skip_is_recorded_and_the_twin_needs_no_preflight(real, monkeypatch):
    cfg, ledger, _ = real
    monkeypatch.setattr(pf, "run", lambda cfg: pytest.fail("preflight must not run"))
    preflight_gate(ledger, cfg, "s", skip=True, view=View(live=False))
    (event,) = ledger.events("s", kind=EventKind.PREFLIGHT)
    assert event.data == {"ok": True, "skipped": True} and "--skip-preflight" in event.message
    twin = compose(["+stage=smoke"]).cfg
    preflight_gate(ledger, twin, "s", skip=False, view=View(live=False))


@pytest.mark.long
def test_sweep_command_stops_before_round_zero(tmp_path, capsys):
    """On this CPU machine (no Megatron checkout at the default path) preflight-lite refuses the local sweep:
    exit 2, nothing launched, no ledger written (tests/commands/test_preflight_lite.py has the details)."""
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    rc = cli.main(
        [
            "sweep",
            "+stage=smoke",
            "workload=megatron",
            "cluster=local",
            f"cluster.folder={tmp_path / 'runs'}",
            f"ledger.url={url}",
            "sweep.name=pf",
            "--plain",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "error: workload=megatron cannot run on this host (cluster=local)" in err, err
    assert not (tmp_path / "l.sqlite").exists() and not (tmp_path / "runs").exists()


class Said:
    """A view that keeps what the sweep said."""

    def __init__(self):
        self.lines: list[str] = []

    def event(self, text: str) -> None:
        self.lines.append(text)


RULE = "v4.full_recompute_hash_mhc"


@pytest.mark.long
def test_preflight_evidence_lifts_a_rule_and_beats_the_configuration(real, monkeypatch):
    """The stage's lifted rules come from the passed preflight's evidence (the node's checkout carries the fix),
    recorded in the ledger, re-applied on resume; a lift the configuration asks for without evidence is
    overruled, and the output says which and why."""
    cfg, ledger, _ = real
    good = pf.Outcome(
        checks=[Check("Megatron fix", CheckStatus.PASS, "found")],
        lifted=[RULE],
        megatron={"commit": "abc123", "tested_commit": "d48bd6be0a85"},
    )
    monkeypatch.setattr(pf, "run", lambda cfg: good)
    said = Said()
    preflight_gate(ledger, cfg, "s", skip=False, view=said)
    assert cfg.stage.lifted_rules == [RULE]
    assert any(f"rule {RULE} lifted" in line and "#6704" in line for line in said.lines), said.lines
    assert ledger.get_sweep("s").provenance["megatron"]["commit"] == "abc123"  # the node's commit, recorded
    resumed = compose(["+stage=smoke", "workload=megatron", "cluster=local"]).cfg
    preflight_gate(ledger, resumed, "s", skip=False, view=Said())  # the event's evidence, not a second job
    assert resumed.stage.lifted_rules == [RULE]


@pytest.mark.long
def test_a_configured_lift_without_the_fix_is_overruled(real, monkeypatch):
    cfg, ledger, _ = real
    cfg.stage.lifted_rules = [RULE]  # the user claims the fix; the node's checkout does not have it
    monkeypatch.setattr(pf, "run", lambda cfg: pf.Outcome(checks=[Check("Python", CheckStatus.PASS, "3.12")]))
    said = Said()
    preflight_gate(ledger, cfg, "s", skip=False, view=said)
    assert cfg.stage.lifted_rules == []
    assert any("replaced by preflight's evidence" in line for line in said.lines), said.lines
    ledger.create_or_get_sweep(
        "skip", stage="smoke", config_yaml="", model="tiny", hardware="h200", workload="megatron", provenance={}
    )
    skipped = compose(["+stage=smoke", "workload=megatron", f"+stage.lifted_rules=[{RULE}]"]).cfg
    preflight_gate(ledger, skipped, "skip", skip=True, view=Said())  # no preflight: no evidence, the rule holds
    assert skipped.stage.lifted_rules == []
