"""`--help` imports no heavy module (issue 21 item 4): a command registers its NAME, HELP and flags with light
imports only, and imports the ledger (SQLAlchemy), Hydra/OmegaConf, matplotlib and numpy inside run(). Checked
in a fresh interpreter's sys.modules, not by a duration (that is tests/bench/bench_cli_help.py's)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("sqlalchemy", "alembic", "matplotlib", "hydra", "omegaconf", "numpy")
PROBE = """
import contextlib, io, json, sys
from orchestrator import cli
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    cli.main(sys.argv[1:])
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def _loaded(*args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("args", [("--help",), ("best", "--help"), ("sweep", "--help"), ("report", "--help")])
def test_help_imports_no_heavy_module(args):
    assert not set(HEAVY) & _loaded(*args), sorted(set(HEAVY) & _loaded(*args))


@pytest.mark.long
def test_the_check_sees_a_heavy_import():
    """The probe can fail: a command that composes a config loads Hydra and OmegaConf."""
    assert {"hydra", "omegaconf"} <= _loaded("plan", "+stage=smoke", "--format", "json")


def test_without_its_dependencies_one_line_names_the_venv(tmp_path):
    """A Python without the venv's packages (site-packages off the path): one `error:` line naming
    `source .venv/bin/activate`, exit 2, no traceback."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys, runpy; sys.path[:] = [p for p in sys.path if 'site-packages' not in p]; "
        f"sys.path.insert(0, {str(root)!r}); runpy.run_module('orchestrator', run_name='__main__', alter_sys=True)"
    )
    for args in ([], ["best"]):
        out = subprocess.run([sys.executable, "-I", "-c", code, *args], capture_output=True, text=True, cwd=tmp_path)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), out.stderr
        assert "source .venv/bin/activate" in lines[0] and "omegaconf" in lines[0], lines


@pytest.mark.long
def test_best_from_another_folder_says_where_it_looked_and_both_fixes(tmp_path):
    out = subprocess.run([sys.executable, "-m", "orchestrator", "best"], capture_output=True, text=True, cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: no ledger at"), out.stderr
    assert str(tmp_path / "ledger.sqlite") in lines[0] and "ledger.url=" in lines[0] and "cd to the project" in lines[0]
