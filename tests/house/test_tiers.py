"""The two test tiers (issue 46 item 5): `make check` runs what needs no service, `make test` everything.

`make check` selects by marker, so a marker forgotten would put a Slurm or PostgreSQL test in the tier that has
neither. tests/conftest.py turns that into a failure naming the marker; here a probe suite run under
ORCH_TEST_TIER=check (as `make check` runs it) shows each way in is caught, even when the test swallowed the
error, and that a test that only asks whether Slurm is here is told "no" and passes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBES = """
import subprocess

import psycopg
import pytest

from orchestrator.launch.slurm.reach import slurm_available


def test_sbatch_swallowed():
    subprocess.run(["sbatch", "--wrap=true"], capture_output=True)


def test_squeue_from_a_shell():
    subprocess.run("squeue -h || true", shell=True, capture_output=True)


def test_cluster_fixture(slurm_cluster):
    pass


def test_postgres_swallowed():
    try:
        psycopg.connect("host=127.0.0.1 port=5432 user=postgres connect_timeout=1").close()
    except psycopg.OperationalError:
        pass


def test_postgres_elsewhere_is_not_ours():
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect("host=127.0.0.1 port=1 user=postgres connect_timeout=1")


def test_asking_whether_slurm_is_here():
    ok, why = slurm_available()
    assert not ok and "sbatch --version failed" in why, why


@pytest.mark.slurm
def test_marked_slurm_is_deselected():
    raise AssertionError("make check must deselect a test marked slurm")
"""

# the suite's own hooks and fixtures, and its markers (pyproject.toml is not this folder's ini file)
CONFTEST = """
pytest_plugins = ["tests.conftest"]


def pytest_configure(config):
    for name in ("slurm", "postgres", "chromium"):
        config.addinivalue_line("markers", name + ": as in pyproject.toml")
"""


@pytest.mark.long
def test_check_tier_fails_a_test_that_reaches_a_service_without_its_marker(tmp_path):
    """While another suite's serial Slurm lane holds the cluster (its lock, in the probe suite's temporary folder),
    the check tier waits for nothing: before, its unmarked `slurm_cluster` test queued behind `make test`'s lane."""
    import fcntl

    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_probes.py").write_text(PROBES)
    (tmp := tmp_path / "tmp").mkdir()
    env = {**os.environ, "ORCH_TEST_TIER": "check", "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    env.pop("ORCH_TRIPWIRE_BIN", None)  # this pytest (maybe itself under make check) must not lend its own
    env.pop("ORCH_TRIPWIRE_LOG", None)
    with open(tmp / "orch-slurm-lanes.lock", "a") as held:  # tests/conftest.py's _ClusterLock, held as the serial lane
        fcntl.flock(held, fcntl.LOCK_EX)
        r = subprocess.run(
            [sys.executable, "-m", "pytest", str(tmp_path), "-p", "no:cacheprovider", "-p", "no:xdist", "-rA", "-q"]
            + ["-m", "not slurm and not postgres and not chromium", "--rootdir", str(tmp_path)]
            + ["--junitxml", str(tmp_path / "check.xml")],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    out = r.stdout + r.stderr
    outcome = {name: state for state, name in re.findall(r"^(PASSED|FAILED|ERROR) test_probes\.py::(\w+)", out, re.M)}
    assert outcome == {
        "test_sbatch_swallowed": "ERROR",
        "test_squeue_from_a_shell": "ERROR",
        "test_cluster_fixture": "ERROR",
        "test_postgres_swallowed": "ERROR",
        "test_postgres_elsewhere_is_not_ours": "PASSED",
        "test_asking_whether_slurm_is_here": "PASSED",
    }, out[-4000:]
    assert "1 deselected" in out, out[-2000:]
    said = r"error: test_probes\.py::{} .*not marked `{}`: add @pytest\.mark\.{}"
    for name, marker in [
        ("test_sbatch_swallowed", "slurm"),
        ("test_squeue_from_a_shell", "slurm"),
        ("test_cluster_fixture", "slurm"),
        ("test_postgres_swallowed", "postgres"),
    ]:
        assert re.search(said.format(name, marker, marker), out), (name, out[-4000:])
    assert r.returncode == 1, out[-2000:]
    # what `make bench` reads of such a run (tests/bench/bench_suite.py): the same outcomes, each test's time
    from tests.bench.bench_suite import read

    run = read(tmp_path / "check.xml", "check")
    assert {c.nodeid.rsplit("::", 1)[1]: c.outcome for c in run.cases} == {
        name: "error" if state == "ERROR" else "passed" for name, state in outcome.items()
    }
    assert run.wall_s > 0 and all(c.seconds >= 0 for c in run.cases)


def test_cluster_lock_lets_shared_lanes_share_and_a_waiting_serial_one_go_first(tmp_path):
    """The hold a Slurm lane takes (tests/conftest.py): shared lanes hold the cluster together; a serial test
    waits for them, and while it waits no new shared lane gets in (it would otherwise wait for ever)."""
    import fcntl
    import threading

    from tests.conftest import _ClusterLock
    from tests.sweeplib import wait_for

    def free(path: Path, how: int) -> bool:
        with open(path, "a") as f:
            try:
                fcntl.flock(f, how | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

    first, second, serial = (_ClusterLock(str(tmp_path)) for _ in range(3))
    first.enter(shared=True)
    second.enter(shared=True)  # returns: two shared lanes at once
    assert not free(first.main, fcntl.LOCK_EX) and free(first.main, fcntl.LOCK_SH)
    got = threading.Event()
    waiter = threading.Thread(target=lambda: (serial.enter(shared=False), got.set()), daemon=True)
    waiter.start()
    wait_for(lambda: not free(first.gate, fcntl.LOCK_EX), 60, "the serial lane to queue at the gate")
    assert not got.is_set()  # it waits for both shared lanes
    first.leave()
    assert not got.is_set()
    second.leave()
    assert got.wait(60), "the serial lane never got the cluster"
    waiter.join(60)
    assert not free(first.main, fcntl.LOCK_SH) and free(first.gate, fcntl.LOCK_EX)  # held alone; gate open
    serial.leave()
    assert free(first.main, fcntl.LOCK_EX)


def test_slurm_lanes_group_by_mark():
    """Serial by default; `slurm(shared=True)` is a lane per module; a test without Slurm is in none."""
    from tests.conftest import _slurm_lane

    class Item:
        def __init__(self, mark, fixtures=()):
            self.keywords = {"slurm": mark} if mark is not None else {}
            self.fixturenames, self.path, self._mark = fixtures, Path("tests/launch/test_x.py"), mark

        def get_closest_marker(self, name):
            return self._mark if name == "slurm" else None

    import pytest

    assert _slurm_lane(Item(pytest.mark.slurm.mark)) == "slurm"
    assert _slurm_lane(Item(pytest.mark.slurm(shared=True).mark)) == "slurm-test_x"
    assert _slurm_lane(Item(None, ("slurm_cluster",))) == "slurm"
    assert _slurm_lane(Item(None, ("tmp_path",))) is None


def test_bench_suite_sums_each_slurm_lane():
    from tests.bench.bench_suite import Case, Run, lanes

    cases = (
        Case("tests.launch.test_cluster::test_a@slurm", 10.0, "passed"),
        Case("tests.launch.test_cluster::test_b@slurm", 5.0, "passed"),
        Case("tests.launch.test_launch_slurm::test_c@slurm-test_launch_slurm", 7.0, "failure"),
        Case("tests.core.test_x::test_d", 1.0, "passed"),
    )
    run = Run("test", 30.0, "2026-01-01T00:00:00", cases)
    assert lanes(run) == {"slurm": 15.0, "slurm-test_launch_slurm": 7.0}
    assert run.count("passed") == 3 and run.count("failure") == 1


def test_bench_suite_names_the_check_tiers_long_tests_and_only_there():
    from tests.bench.bench_suite import LONG_S, Case, Run, unmarked_long

    cases = (Case("tests.a::test_slow", LONG_S + 1, "passed"), Case("tests.a::test_fast", LONG_S / 2, "passed"))
    assert [c.nodeid for c in unmarked_long(Run("check", 9.0, "2026-01-01T00:00:00", cases))] == ["tests.a::test_slow"]
    assert unmarked_long(Run("test", 9.0, "2026-01-01T00:00:00", cases)) == []  # make test runs the long ones


def test_make_check_deselects_the_long_marker_and_pyproject_declares_it():
    """The fast tier's filter: the services' markers and `long` (its tests run in `make test` only)."""
    makefile = (ROOT / "Makefile").read_text()
    line = next(ln for ln in makefile.splitlines() if ln.startswith("CHECK_MARKERS :="))
    assert {"not slurm", "not postgres", "not chromium", "not long"} <= {
        p.strip() for p in line.split(":=")[1].split(" and ")
    }
    assert '-m "$(CHECK_MARKERS)"' in makefile
    assert '"long: ' in (ROOT / "pyproject.toml").read_text()
