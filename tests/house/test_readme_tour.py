"""README.md's tour runs exactly as written (issue 13): every line of the block between `<!-- tour` and
`<!-- /tour -->` goes through bash unchanged, in a fresh empty folder, with the venv's bin first on PATH (what
`source .venv/bin/activate` does), and must exit 0. The twin stands in for Megatron; cluster=local is in the
tour's own lines, so the Slurm cluster of this machine is not used."""

from __future__ import annotations

import pytest

from tests.tour import GROUP, README, tour_commands


def test_the_tour_block_is_marked_and_shows_the_decision():
    cmds = tour_commands(README.read_text())
    assert all(c.startswith("python -m orchestrator ") for c in cmds), cmds
    verbs = [c.split()[3] for c in cmds]
    assert {"plan", "sweep", "best", "report"} <= set(verbs), verbs
    assert any("--flags" in c for c in cmds) and any("--argv 0" in c for c in cmds)
    # run from the checkout, a line that writes a file of its own (`> plan-8k.json`) leaves it there (issue 49)
    assert not [c for c in cmds if ">" in c.split("#")[0]], "a tour line redirects into a file in the checkout"


@pytest.mark.long
@pytest.mark.xdist_group(GROUP)  # the tour's run is shared with tests/job/test_probe_conformance.py
@pytest.mark.timeout(2400)  # the tour's 1k and 8k sweeps took 388 s of the 900 s limit on a loaded CI machine
def test_every_tour_command_runs_as_written(readme_tour):
    """The whole tour in order (later lines read what earlier ones wrote), each exit 0."""
    readme_tour.require_complete()
    assert [s.cmd for s in readme_tour.steps] == tour_commands(README.read_text())
    tmp_path = readme_tour.folder
    for step in readme_tour.steps:
        cmd, out, err = step.cmd, step.stdout, step.stderr
        if "--dry-run" in cmd:  # the price before the spend, and nothing written
            assert "GPU-hours" in out and "days of the stage's" in out, out[-2000:]
            assert "ledger.sqlite" not in step.after, step.after
        elif " sweep " in cmd:  # a sweep ends by saying what to do next
            assert "best layout (measured, simulated)" in out and "the report" in out, out[-2000:]
        if cmd.split("#")[0].strip() == "python -m orchestrator best":
            assert "best of sweep 1k-dsv4_pro-h200" in err, err
        if "--flags" in cmd:
            assert "--expert-model-parallel-size" in out, out
    assert (tmp_path / "reports" / "8k-dsv4_pro-h200" / "report.html").is_file()
