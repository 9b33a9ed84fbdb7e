"""scripts/screenshot.py: the README's report screenshot is rebuilt from today's report by a script (issue 49:
the picture and its caption were from 2026-11-30 and described an old tie rule)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_the_readme_shows_the_screenshot_and_names_the_script_that_makes_it():
    text = README.read_text()
    assert "![report](docs/report-screenshot.png)" in text and (ROOT / "docs" / "report-screenshot.png").is_file()
    assert "`python scripts/screenshot.py`" in text
    assert "p50-p95 spread" not in text  # the old tie rule; today's: the two p50s' 95% intervals overlap
    assert "95% intervals overlap" in text


@pytest.mark.chromium
def test_the_script_writes_the_first_screen_of_a_report(tmp_path):
    if shutil.which("chromium") is None:
        msg = "Debian's chromium is not installed (tests/cluster/services.sh installs it)"
        pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)
    out = tmp_path / "shot.png"
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "screenshot.py"), "--stage", "smoke", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (1400, 900)
    assert len(data) > 20_000  # a rendered page, not a blank window
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shot.png"]  # the sweeps' folder went with them
