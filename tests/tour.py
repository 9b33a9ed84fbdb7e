"""README.md's tour, run once per pytest worker and shared: the tour test checks each line's outcome, and the
probe conformance test holds the rank probes its 1k and 8k sweeps launched against Megatron-LM dev. Both are in
the xdist group `readme-tour` (one worker, one run of the tour's sweeps, where each test ran a pair of its own)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GROUP = "readme-tour"  # the xdist group of every test that reads the shared run


def tour_commands(text: str) -> list[str]:
    """The command lines of the marked block (one command a line, comments and all)."""
    found = re.search(r"<!-- tour\b[^>]*-->\s*```bash\n(.*?)```\s*<!-- /tour -->", text, re.S)
    assert found, "README.md has no tour block (<!-- tour ... --> ```bash ... ``` <!-- /tour -->)"
    return [line for line in found[1].splitlines() if line.strip() and not line.lstrip().startswith("#")]


@dataclass
class Step:
    cmd: str
    returncode: int
    stdout: str
    stderr: str
    after: list[str]  # the folder's top-level names once the line ended (what it wrote)


@dataclass
class TourRun:
    """The tour's lines in order, run in `folder`, up to and including the first that failed."""

    folder: Path
    steps: list[Step] = field(default_factory=list)

    @property
    def failed(self) -> Step | None:
        return next((s for s in self.steps if s.returncode != 0), None)

    def require_complete(self) -> None:
        bad = self.failed
        assert bad is None, f"`{bad.cmd}` exited {bad.returncode}:\n{bad.stdout[-2000:]}\n{bad.stderr[-3000:]}"


def run_tour(folder: Path) -> TourRun:
    """Every line through bash unchanged, in `folder` (fresh and empty), with the venv's bin first on PATH (what
    `source .venv/bin/activate` does) and no PYTHONPATH (the project importable from the venv alone). Later lines
    read what earlier ones wrote, so the run stops at the first line that fails."""
    venv_bin = Path(sys.executable).parent  # `make test` runs pytest with .venv/bin/python
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["VIRTUAL_ENV"] = str(venv_bin.parent)
    env.pop("PYTHONPATH", None)
    run = TourRun(folder)
    for cmd in tour_commands(README.read_text()):
        r = subprocess.run(["bash", "-c", cmd], cwd=folder, env=env, capture_output=True, text=True, timeout=900)
        run.steps.append(Step(cmd, r.returncode, r.stdout, r.stderr, sorted(p.name for p in folder.iterdir())))
        if r.returncode != 0:
            break
    return run
