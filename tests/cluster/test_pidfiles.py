"""The local cluster script trusts a pidfile only while its pid is still the daemon it names.

A CI run on a machine whose /tmp outlived its daemons failed with n1 and n4 `unk*`: their pidfiles held
pids the kernel had given to other processes, so `up` skipped starting those slurmds. Here the script's
own `pid_alive` is run against a stand-in named `slurmd` and against a stranger holding the same pid.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("slurm_local.sh")


def pid_alive(pidfile: Path) -> bool:
    """Run the script's pid_alive (only that function, not the script's commands) on PIDFILE."""
    body = subprocess.run(
        ["sed", "-n", "/^pid_alive()/,/^}/p", str(SCRIPT)], check=True, capture_output=True, text=True
    ).stdout
    assert body.startswith("pid_alive()"), "slurm_local.sh has no pid_alive function"
    return subprocess.run(["bash", "-c", f'{body}\npid_alive "$1"', "_", str(pidfile)]).returncode == 0


@pytest.fixture
def fake_slurmd(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose name is `slurmd` and whose arguments are `-N n1`, like the script starts n1's."""
    exe = tmp_path / "slurmd"
    exe.write_text("#!/bin/bash\nread -r _\n")  # waits on stdin until killed
    exe.chmod(0o755)
    proc = subprocess.Popen([str(exe), "-N", "n1"], stdin=subprocess.PIPE)
    yield proc
    proc.kill()
    proc.wait()


def test_a_pidfile_passes_only_for_the_daemon_it_names(tmp_path: Path, fake_slurmd: subprocess.Popen[bytes]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for name in ("slurmd-n1", "slurmd-n2", "slurmctld"):
        (run / f"{name}.pid").write_text(f"{fake_slurmd.pid}\n")
    assert pid_alive(run / "slurmd-n1.pid")
    assert not pid_alive(run / "slurmd-n2.pid"), "n1's slurmd passed for n2's"
    assert not pid_alive(run / "slurmctld.pid"), "a slurmd passed for slurmctld"


def test_a_pid_reused_by_a_stranger_or_gone_does_not_pass(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["sleep", "600"])
    try:
        (tmp_path / "slurmd-n1.pid").write_text(f"{stranger.pid}\n")
        assert not pid_alive(tmp_path / "slurmd-n1.pid"), "a reused pid passed for slurmd n1"
    finally:
        stranger.kill()
        stranger.wait()
    assert not pid_alive(tmp_path / "slurmd-n1.pid"), "a dead pid passed"
    assert not pid_alive(tmp_path / "missing.pid")
