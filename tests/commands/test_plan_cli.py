"""`python -m orchestrator plan`, run as a user runs it: in a subprocess, checking exit codes and output."""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable


@cache
def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "orchestrator", "plan", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def pick(cands, **knobs):
    return [c for c in cands if all(c[k] == v for k, v in knobs.items())]


# The guide's A, B, C: TP1 PP8 EP64 ETP1 b=1 (recompute and dispatcher left open by the guide).
GUIDE = dict(tp=1, pp=8, vpp=1, ep=64, etp=1, mbs=1, dispatcher="alltoall", offload=[])
# They fit only with full recompute, which needs the fix of Megatron-LM PR #6704 (v4.full_recompute_hash_mhc).
RULE = "v4.full_recompute_hash_mhc"
FIXED = f"+stage.lifted_rules=[{RULE}]"


def test_no_stage_lists_the_stages():
    r = cli()
    assert r.returncode == 2
    assert r.stderr.startswith("error: no stage given") and "1k" in r.stderr and "16k" in r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_stage():
    r = cli("+stage=2k")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "error:" in r.stderr and "2k" in r.stderr and "1k" in r.stderr  # names the options


def test_bad_override_type():
    r = cli("+stage=1k", "stage.gpus=lots")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "stage.gpus" in r.stderr


@pytest.mark.long
def test_bad_argv_index():
    r = cli("+stage=1k", "--argv", "100000")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--argv 100000" in lines[0] and "no such candidate" in lines[0]
    neg = cli("+stage=1k", "--argv", "-1")
    assert neg.returncode == 2 and "no such candidate" in neg.stderr and "Traceback" not in neg.stderr


@pytest.mark.long
def test_json_1k_contains_config_a():
    """The default hardware is h200: the memory model puts A at ~100 GB per GPU even with full recompute
    (see tests/plan/test_planner.py::test_config_a_on_1k), so on h100 A is rejected by mem.exceeds_hbm only."""
    r = cli("+stage=1k", "--format", "json", FIXED)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "analytic estimates" in out["note"] and out["lifted_rules"] == [RULE]
    assert (out["stage"], out["model"], out["hardware"]) == ("1k", "dsv4_pro", "h200")
    assert out["raw_count"] >= out["legal_count"] == len(out["candidates"]) > 0
    a = pick(out["candidates"], cp=1, **GUIDE)[0]
    assert (a["D_a"], a["D_e"], a["m"], round(a["bubble"], 3)) == (128, 2, 32, 0.179)
    assert (a["T_group"], a["T_expert"]) == (524288, 8192)
    assert a["layer_pattern"].count("|") == 7 and len(a["key"]) == 32
    assert [c["candidate"] for c in out["candidates"]] == list(range(len(out["candidates"])))  # 0 = best
    assert "rank" not in out["candidates"][0]  # "rank" is a GPU rank, never the planner's order


@pytest.mark.long
def test_json_8k_contains_configs_b_and_c_and_rejects_b_with_vpp():
    r = cli("+stage=8k", "--format", "json", "--show-rejected", FIXED)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    b = pick(out["candidates"], cp=1, **GUIDE)[0]
    c = pick(out["candidates"], cp=4, **GUIDE)[0]
    assert (b["D_a"], b["D_e"], b["m"], round(b["bubble"], 3)) == (1024, 16, 4, 0.636)
    assert (c["D_a"], c["D_e"], c["m"], round(c["bubble"], 3)) == (256, 16, 16, 0.304)
    assert (c["T_group"], c["T_expert"]) == (131072, 2048)
    b_vpp = [
        x
        for x in out["rejected"]
        if {k: x["layout"][k] for k in ("tp", "pp", "vpp", "cp", "ep", "mbs")}
        == dict(tp=1, pp=8, vpp=2, cp=1, ep=64, mbs=1)
    ]
    assert b_vpp and all("mcore.vpp_group_bounds" in x["rules"] for x in b_vpp)
    assert all(x["reasons"] and x["reasons"][0].startswith(x["rules"][0] + ": ") for x in out["rejected"])
    assert out["raw_count"] == len(out["candidates"]) + len(out["rejected"])


@pytest.mark.long
def test_1k_proposes_no_full_recompute_while_the_rule_holds_and_names_it():
    """`plan +stage=1k` on dev d48bd6be0a85 (the default: the rule holds): no full-recompute candidate, the
    header says why and what lifts it, and --show-rejected names the rule with its source."""
    r = cli("+stage=1k", "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["candidates"] and not [c for c in out["candidates"] if "full" in c["recompute"]]
    assert out["lifted_rules"] == [] and "holds until preflight finds" in out["rule_notes"][0]
    lifted = json.loads(cli("+stage=1k", "--format", "json", FIXED).stdout)
    assert [c for c in lifted["candidates"] if "full" in c["recompute"]]
    shown = cli("+stage=1k", "--show-rejected", "--top", "3")
    assert shown.returncode == 0, shown.stderr
    assert RULE in shown.stdout and "recompute.py:95-108" in shown.stdout.replace("\n", "")
    assert f"rule {RULE} holds until preflight finds Megatron-LM PR #6704" in shown.stdout


@pytest.mark.long
def test_table_header_columns_and_rejections():
    r = cli("+stage=8k", "--top", "5", "--show-rejected")
    assert r.returncode == 0, r.stderr
    assert "analytic estimates" in r.stdout.splitlines()[0]
    header = next(line for line in r.stdout.splitlines() if "candidate" in line and "D_a" in line)
    for col in (
        "tp",
        "pp",
        "vpp",
        "cp",
        "ep",
        "etp",
        "mbs",
        "recompute",
        "dispatcher",
        "D_a",
        "D_e",
        " m ",
        "bubble",
        "T_group",
        "T_expert",
        "ep_nodes",
        "routed_weight_gb",
        "heaviest_stage",
        "memory_gb",
        "step_time_s",
        "mfu",
        "layer_pattern",
    ):
        assert col in header, col
    assert "mcore.vpp_group_bounds" in r.stdout and "interleaved VPP needs PP" in r.stdout


@pytest.mark.long
def test_csv_has_the_guide_columns():
    r = cli("+stage=1k", "--format", "csv", "--top", "3")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == 3 and {"D_a", "m", "bubble", "T_group", "layer_pattern", "key"} <= set(rows[0])


@pytest.mark.long
def test_argv_prints_one_flag_per_line():
    r = cli("+stage=1k", "--argv", "0")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.rstrip("\n").splitlines()
    assert len(lines) > 5 and all(line.endswith(" \\") for line in lines[:-1]) and not lines[-1].endswith("\\")
    assert all(line.startswith("--") for line in lines)
    assert any(line.startswith("--hybrid-layer-pattern ") for line in lines)
    assert not any(line.startswith("--moe-enable-deepep") for line in lines)


@pytest.mark.long
def test_impossible_stage_is_one_clear_error():
    """N=1000 GPUs: no EP in the search divides it, so every layout breaks the expert grid."""
    r = cli("+stage=1k", "stage.gpus=1000")
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert (
        "no legal layout that fits" in line and "mcore.expert_grid rejects 5,832" in line and "--show-rejected" in line
    )
    shown = cli("+stage=1k", "stage.gpus=1000", "--format", "json", "--show-rejected")
    assert shown.returncode == 2 and json.loads(shown.stdout)["legal_count"] == 0


@pytest.mark.long
def test_impossible_stage_writes_no_ledger(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    r = subprocess.run(
        [
            PY,
            "-m",
            "orchestrator",
            "sweep",
            "+stage=1k",
            "stage.gpus=1000",
            "cluster=local",
            f"ledger.url={url}",
            f"cluster.folder={tmp_path / 'runs'}",
            "--plain",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and "no legal layout that fits" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "ledger.sqlite").exists() and not (tmp_path / "runs").exists()


@pytest.mark.long
def test_identical_predictions_are_one_row_and_the_table_fits_the_terminal():
    """Issue 21: dispatcher pairs with identical predictions filled half the top 20; tables were forced to
    260 columns. A group is one row listing its candidates and counting the knob values they differ in;
    with $COLUMNS (a terminal's width) every line fits it."""
    from dataclasses import replace

    from orchestrator.commands import plan as P
    from orchestrator.config import compose
    from orchestrator.plan.planner import Planned, plan

    cfg = compose(["+stage=1k"]).cfg
    res = plan(cfg.model, cfg.hardware, cfg.stage, workload=cfg.workload.name, recipe=cfg.workload.recipe)
    # a dispatcher twin with the same prediction beside every candidate: the step model prices the dispatchers'
    # permutation copies apart (steptime.permutation_rows), so a plan's own ties are not guaranteed any more
    cands: list[Planned] = []
    for c in res.candidates:
        twin = replace(c.layout, dispatcher="alltoall", flex_backend=None)
        cands += [c] if c.layout.dispatcher == "alltoall" else [c, Planned(twin, c.prediction)]
    rows = P.grouped(cands, 20, ["dispatcher"])
    pred = [tuple(r[c] for c in P.PREDICTION_COLUMNS) for r in rows]
    assert all(a != b for a, b in itertools.pairwise(pred))  # neighbours differ: no duplicate rows
    listed = [int(i) for r in rows for i in r["candidate"].split(",")]
    assert listed == list(range(len(listed)))  # every candidate, in order, once
    pairs = [r for r in rows if "," in r["candidate"]]
    assert pairs and all(r["dispatcher"].endswith(" dispatchers") for r in pairs if r["dispatcher"][0].isdigit())
    out = _on_a_terminal([PY, "-m", "orchestrator", "plan", "+stage=1k", "--top", "5"], columns=100)
    table = [line for line in out.splitlines() if line.strip() and not line.startswith("#")]
    assert len(table) > 3 and max(len(line) for line in table) <= 100, max(table, key=len)


def _on_a_terminal(argv: list[str], *, columns: int) -> str:
    """What argv prints on a pseudo-terminal `columns` wide (its own size, as a real terminal reports it)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=slave, stderr=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=300) == 0
    text = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)  # rich's colours on a terminal
