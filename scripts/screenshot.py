"""Regenerate the README's report screenshot (docs/report-screenshot.png) from today's code.

    python scripts/screenshot.py                  # twin sweeps of 1k then 8k, the 8k report's first screen
    python scripts/screenshot.py --stage smoke --out /tmp/shot.png   # the quick one its test runs

Why a script: the README's picture and caption went stale (issue 49: from 2026-11-30, describing an old tie
rule) because nothing rebuilt them. This runs the sweeps on the twin in a temporary folder (cluster=local, a
throw-away SQLite ledger: nothing is written to the checkout but `--out`), renders the report as `report`
does, and has Debian's chromium (headless) take the first screen at 1400 x 900 px, the window the report is
laid out for (orchestrator/report/html.py FIRST_SCREEN). tests/report/test_screenshot.py runs it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "report-screenshot.png"
WINDOW = (1400, 900)
# the stages a shot's sweeps run, in order: a promoted stage after the one it promotes from (as the README's tour)
STAGES = {"8k": ("1k", "8k"), "smoke": ("smoke",)}
FAST_TWIN = ("++workload.twin.time_scale=0.000001", "++workload.twin.max_sleep_s=0.001")


def _orchestrator(cwd: Path, *args: str) -> None:
    """One CLI command of this checkout (first on PYTHONPATH, whatever the venv installed); its error on failure."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    run = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "PYTHONPATH": path},
    )
    if run.returncode != 0:
        sys.exit(f"error: `python -m orchestrator {' '.join(args)}` exited {run.returncode}:\n{run.stderr[-2000:]}")


def shoot(page: Path, out: Path, profile: Path) -> None:
    """The first screen of `page` in headless chromium at WINDOW, written to `out` as PNG."""
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("error: chromium not found: install Debian's (apt-get install chromium), then run this again")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"]
    flags += ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
    flags += [f"--user-data-dir={profile}", "--virtual-time-budget=5000", f"--window-size={WINDOW[0]},{WINDOW[1]}"]
    subprocess.run(
        [chromium, *flags, f"--screenshot={out}", page.as_uri()], capture_output=True, timeout=180, check=True
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=sorted(STAGES), default="8k", help="the stage whose report is shot")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the PNG to write (default: {OUT.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    with tempfile.TemporaryDirectory(prefix="report-shot-") as tmp:
        here = Path(tmp)
        common = [f"ledger.url=sqlite:///{here / 'ledger.sqlite'}", f"cluster.folder={here / 'runs'}"]
        for stage in STAGES[args.stage]:
            name = f"{stage}-twin"
            _orchestrator(here, "sweep", f"+stage={stage}", "cluster=local", f"sweep.name={name}", *common, *FAST_TWIN)
        _orchestrator(here, "report", name, *common)
        out.parent.mkdir(parents=True, exist_ok=True)
        shoot(here / "reports" / name / "report.html", out, here / "profile")
    print(f"wrote {out}: the first {WINDOW[0]}x{WINDOW[1]} px of the report of sweep {name} (stage {args.stage})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
