"""`make services-down` (`services.sh down --undo`) undoes what `make test` did to the host (issue 13).

Run for real, but in a private mount namespace (unshare -m) where /etc/hosts and /etc/slurm are this test's
own files, with stand-ins for apt-get and mysql on PATH that record their arguments: the shared cluster of
this machine and its packages are never touched. Needs root and unshare (as `make test` has); under CI a
missing one is a failure, not a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TAG = "# orch-slurm-local"


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    if not _can_unshare():
        if os.environ.get("CI"):
            pytest.fail("CI: this test needs root and `unshare -m` (a private mount namespace)")
        pytest.skip("needs root and `unshare -m`")
    return tmp_path


def test_services_down_undo_removes_what_up_added(sandbox: Path):
    state = sandbox / "orch-slurm"
    (state / "etc").mkdir(parents=True)
    (state / "run").mkdir()
    etc_slurm = sandbox / "etc-slurm"
    etc_slurm.mkdir()
    for f in ("slurm.conf", "gres.conf", "slurmdbd.conf"):
        (state / "etc" / f).write_text("# test\n")
        (etc_slurm / f).symlink_to(state / "etc" / f)
    hosts = sandbox / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n::1 localhost\n127.0.0.1 n1 n2 n3 n4 {TAG}\n")
    installed = sandbox / "installed-packages"
    installed.write_text("slurmctld\nmunge\nslurmctld\n")
    (sandbox / "installed-packages.chromium").touch()
    fake = sandbox / "bin"
    fake.mkdir()
    calls = sandbox / "calls.log"
    for tool in ("apt-get", "mysql"):
        script = fake / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >>{calls}\ncat >/dev/null 2>&1 </dev/null\n')
        script.chmod(0o755)
    inner = (
        f"mount --bind {hosts} /etc/hosts && mount --bind {etc_slurm} /etc/slurm && "
        f"bash {ROOT}/tests/cluster/services.sh down --undo"
    )
    env = {
        **os.environ,
        "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}",
        "ORCH_SLURM_DIR": str(state),
        "ORCH_INSTALLED_LIST": str(installed),
    }
    host_hosts = Path("/etc/hosts").read_text()
    host_slurm = sorted(os.listdir("/etc/slurm")) if Path("/etc/slurm").is_dir() else None
    r = subprocess.run(["unshare", "-m", "bash", "-c", inner], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert hosts.read_text() == "127.0.0.1 localhost\n::1 localhost\n"  # only our line went
    assert list(etc_slurm.iterdir()) == []  # the links went
    assert not state.exists() and not installed.exists()
    assert not (sandbox / "installed-packages.chromium").exists()
    log = calls.read_text().splitlines()
    assert "apt-get remove -y -qq munge slurmctld" in log, log  # what up installed, once each, nothing else
    assert "apt-get remove -y -qq chromium" in log, log
    assert any(line.startswith("mysql") and "DROP DATABASE IF EXISTS slurm_acct_db" in line for line in log), log
    # The host itself is as it was: its /etc/hosts and /etc/slurm were never the ones changed.
    assert Path("/etc/hosts").read_text() == host_hosts
    assert sorted(os.listdir("/etc/slurm")) == host_slurm if host_slurm is not None else not Path("/etc/slurm").exists()
