"""Shared pytest fixtures.

`smoke`: the smoke stage's config (fast twin) and its feasible candidates, for tests that build job specs.

`ledger_url`: every ledger test runs twice, against a SQLite file and against the real PostgreSQL on
127.0.0.1:5432 (user postgres, trust). One database per test session (orch_test_<pid>: one per xdist
worker), emptied before each test and dropped at the end. PostgreSQL unreachable: the test fails when CI is
set (CI must prove both engines), otherwise it is skipped.

`make check` is the fast tier: it deselects the `slurm`, `postgres` and `chromium` tests and the `long` ones (end
to end, seconds to minutes each: `make test` runs them) and sets ORCH_TEST_TIER=check. Then a test that reaches
Slurm or PostgreSQL anyway (its marker forgotten) fails, naming the marker: the `slurm_cluster` and PostgreSQL
fixtures refuse, `sbatch`/`squeue`/`sacct`/... on PATH are tripwires (`sbatch --version` answers "no Slurm
here", so `cluster=auto` picks the local executor), and an in-process psycopg connection to port 5432 is refused.

`make test` runs the suite on several pytest-xdist workers (`--dist loadgroup`). The tests of the one local
Slurm cluster (marked `slurm`) run in lanes. By default a test is in the serial lane: one xdist group ("slurm"),
holding the cluster to itself (`_ClusterLock`, exclusive) while it runs, because it drains nodes, fills all 4
nodes, kills daemons, or reads the whole queue. A test marked `slurm(shared=True)` promises to use at most
one node's worth (8 GPUs, 8 CPUs) at any time, to leave node states alone and to read only its own jobs:
its module is a lane of its own (group "slurm-<module>"), held shared, so shared lanes run beside each other
on other workers. With at most `TEST_WORKERS` (3) lanes at once, their jobs always fit in the 4 nodes, and
nothing they do waits behind a whole-cluster job. Outside Slurm, the tests of a module that share a
module-scoped fixture are one group too ("module-<module>"): one worker sets the fixture up once.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

PG_DSN = "host=127.0.0.1 port=5432 user=postgres connect_timeout=5"

# `make check` sets it: the tier that needs neither Slurm nor PostgreSQL nor chromium (see the module docstring).
CHECK_TIER = os.environ.get("ORCH_TEST_TIER") == "check"
SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scancel", "scontrol", "srun", "salloc", "sinfo", "sacctmgr", "sstat")
_TRIPWIRE = r"""#!/bin/sh
# make check's stand-in for `{name}` (tests/conftest.py): Slurm is not part of that tier.
if [ "{name}" = sbatch ] && [ "$1" = --version ]; then echo "sbatch: no Slurm under make check" >&2; exit 1; fi
[ -n "$ORCH_TRIPWIRE_LOG" ] && printf '%s\n' "{name} $*" >>"$ORCH_TRIPWIRE_LOG"
echo "error: \`{name} $*\` under make check: this test needs Slurm; mark it @pytest.mark.slurm" >&2
exit 1
"""


def _missing_marker(nodeid: str, what: str, marker: str) -> str:
    return (
        f"error: {nodeid} {what} but is not marked `{marker}`: add @pytest.mark.{marker} "
        f"(`make check` deselects it, `make test` runs it)"
    )


def pytest_configure(config) -> None:
    """Under `make check`, put the Slurm tripwires first on PATH, once (xdist workers inherit the PATH)."""
    if not CHECK_TIER or os.environ.get("ORCH_TRIPWIRE_BIN"):
        return
    bin_dir = Path(tempfile.mkdtemp(prefix="orch-check-tripwires-"))
    for name in SLURM_COMMANDS:
        (bin_dir / name).write_text(_TRIPWIRE.format(name=name))
        (bin_dir / name).chmod(0o755)
    os.environ["ORCH_TRIPWIRE_BIN"] = str(bin_dir)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    config._orch_tripwire_bin = bin_dir


def pytest_unconfigure(config) -> None:
    bin_dir = getattr(config, "_orch_tripwire_bin", None)
    if bin_dir is not None:
        shutil.rmtree(bin_dir, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Each Slurm test goes to its lane's xdist group (see the module docstring). First of the hook's
    implementations: xdist's own (on each worker) reads the `xdist_group` marks into the node ids its
    scheduler groups by, and a mark added after it groups nothing (the driver test and the 4-node test then
    ran at once on two workers, and the driver's job waited behind the 4-node job until its time ran out)."""
    for item in items:
        lane = _slurm_lane(item) or _module_fixture_lane(item)
        if lane is not None:
            item.add_marker(pytest.mark.xdist_group(lane))


def _module_fixture_lane(item) -> str | None:
    """The group "module-<module>" for a test that uses a module-scoped fixture (a sweep run, every row predicted): a
    module fixture is set up once per worker, so its tests on one worker pay for it once, not once per worker
    (test_validate's rows were predicted twice, 65 s each). None otherwise, and for an explicit group."""
    if item.get_closest_marker("xdist_group") is not None:
        return None
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}) or {}
    if any(d and d[-1].scope == "module" for d in defs.values()):
        return f"module-{item.path.stem}"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """A test asking for the cluster without the `slurm` marker fails, in every tier, before any fixture:
    unmarked, `make check` would select it, and it would not be in a Slurm lane."""
    if "slurm_cluster" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slurm") is None:
        pytest.fail(_missing_marker(item.nodeid, "uses the local Slurm cluster", "slurm"), pytrace=False)


def _uses_slurm(item) -> bool:
    return "slurm" in item.keywords or "slurm_cluster" in getattr(item, "fixturenames", ())


def _slurm_lane(item) -> str | None:
    """The lane "slurm" (the one serial lane, the cluster to itself) or "slurm-<module>" (`slurm(shared=True)`: a
    lane of its own, beside other shared lanes); None for a test that does not use Slurm."""
    if not _uses_slurm(item):
        return None
    mark = item.get_closest_marker("slurm")
    return f"slurm-{item.path.stem}" if mark is not None and mark.kwargs.get("shared") else "slurm"


class _ClusterLock:
    """A fair readers-writer lock over the one cluster, across xdist workers (and pytest sessions): shared
    lanes hold it shared, the serial lane exclusive. flock(2) on two files: everyone queues on the gate, so a
    waiting writer stops new readers (no starvation); a worker that dies lets go with its file descriptors."""

    def __init__(self, folder: str) -> None:
        self.gate, self.main = Path(folder) / "orch-slurm-lanes.gate", Path(folder) / "orch-slurm-lanes.lock"
        self.held = None

    def enter(self, shared: bool) -> None:
        import fcntl

        if self.held is not None:
            return
        with open(self.gate, "a") as gate:
            fcntl.flock(gate, fcntl.LOCK_EX)
            held = open(self.main, "a")  # noqa: SIM115 - held until leave()
            fcntl.flock(held, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        self.held = held

    def leave(self) -> None:
        if self.held is not None:
            self.held.close()  # closing the last descriptor releases the flock
            self.held = None


_CLUSTER_LOCK = _ClusterLock(tempfile.gettempdir())


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A Slurm test waits for its lane's hold on the cluster before anything of it starts (before its
    fixtures, and before pytest-timeout's clock: the wait is not the test's time), and lets go after its
    teardown. A shared lane keeps its hold while the next test is of the same module (test_launch_slurm.py's
    module-scoped job still runs); the serial lane lets go after each test, so the shared lanes waiting get
    in between two serial tests instead of after all of them. Under `make check` nothing waits: no test there may
    reach the cluster (one asking for it fails in its set-up), and the hold is the other suite's, if one runs here
    (`tests/house/test_tiers.py`'s probe suite waited out a running `make test`'s serial lane)."""
    lane = None if CHECK_TIER else _slurm_lane(item)
    if lane is not None:
        _CLUSTER_LOCK.enter(shared=lane != "slurm")
    yield
    keep = lane not in (None, "slurm") and nextitem is not None and _slurm_lane(nextitem) == lane
    if lane is not None and not (keep and nextitem.module is item.module):
        _CLUSTER_LOCK.leave()


def _local_pg(conninfo: str, kwargs: dict) -> bool:
    """Whether a psycopg connection would go to this host's PostgreSQL (port 5432 by default)."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(conninfo, **kwargs)
    host = str(params.get("host") or os.environ.get("PGHOST") or "localhost")
    port = str(params.get("port") or os.environ.get("PGPORT") or "5432")
    return port == "5432" and (host in ("localhost", "127.0.0.1", "::1") or host.startswith("/"))


@pytest.fixture(autouse=True)
def _check_tier_tripwires(request, monkeypatch):
    """Under `make check`: a test that called a Slurm command (it or any process it started) or opened a
    connection to this host's PostgreSQL without its marker fails, even when it swallowed the error."""
    if not CHECK_TIER:
        yield
        return
    log = Path(os.environ["ORCH_TRIPWIRE_BIN"]) / f"calls-{os.getpid()}"
    monkeypatch.setenv("ORCH_TRIPWIRE_LOG", str(log))
    seen = log.stat().st_size if log.exists() else 0
    if "postgres" not in request.keywords:
        import psycopg

        real = psycopg.Connection.connect

        def refuse(cls, conninfo: str = "", **kwargs):
            if _local_pg(conninfo, kwargs):
                with open(log, "a") as f:
                    f.write("psycopg.connect to PostgreSQL on port 5432\n")
                raise psycopg.OperationalError("PostgreSQL under make check: mark the test @pytest.mark.postgres")
            return real(conninfo, **kwargs)

        monkeypatch.setattr(psycopg.Connection, "connect", classmethod(refuse))
        monkeypatch.setattr(psycopg, "connect", psycopg.Connection.connect)
    yield
    calls = log.read_text()[seen:].split("\n") if log.exists() else []
    calls = [c for c in calls if c]
    if calls:
        marker = "postgres" if calls[0].startswith("psycopg") else "slurm"
        pytest.fail(_missing_marker(request.node.nodeid, f"ran `{calls[0]}`", marker), pytrace=False)


def _megatron_modules() -> dict:
    return {k: m for k, m in sys.modules.items() if k == "megatron" or k.startswith("megatron.")}


@pytest.fixture(autouse=True)
def _installed_megatron_after_each_test():
    """A test that runs the node preflight in-process imports Megatron from a checkout put first on sys.path
    (on a node that is its own process). Left in sys.modules, that checkout's code would be every later test's
    Megatron on this worker, so which Megatron a test saw would depend on the order tests ran in: after such a
    test, sys.path and the modules of the installed megatron-core are restored."""
    path, before = list(sys.path), _megatron_modules()
    yield
    installed = sysconfig.get_paths()["purelib"]
    foreign = [
        k for k, m in _megatron_modules().items() if not str(getattr(m, "__file__", "") or "").startswith(installed)
    ]
    if foreign:
        sys.path[:] = path
        for k in _megatron_modules():
            if before.get(k) is not sys.modules[k]:
                del sys.modules[k]
        sys.modules.update(before)


@pytest.fixture(scope="session")
def _pg_ledger_db():
    if CHECK_TIER:
        pytest.fail("error: PostgreSQL under make check: mark its tests @pytest.mark.postgres", pytrace=False)
    try:
        import psycopg

        admin = psycopg.connect(PG_DSN + " dbname=postgres", autocommit=True)
    except Exception as exc:  # noqa: BLE001 - any failure means "no PostgreSQL here"
        msg = f"PostgreSQL on 127.0.0.1:5432 is unreachable ({type(exc).__name__}: {str(exc).strip()[:200]})"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    name = f"orch_test_{os.getpid()}"
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def ledger_url(request, tmp_path) -> str:
    """A SQLAlchemy URL of an empty ledger database (no schema yet)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    import psycopg

    name = request.getfixturevalue("_pg_ledger_db")
    with psycopg.connect(PG_DSN + f" dbname={name}", autocommit=True) as conn:
        # a previous test's leaked connection must not block the reset
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


@pytest.fixture(scope="module")
def smoke():
    """(config, feasible candidates best predicted first) of the smoke stage, with a twin that does not sleep."""
    from orchestrator.config import compose
    from orchestrator.plan import planner

    cfg = compose(["+stage=smoke"]).cfg
    cfg.workload.twin.time_scale = 1e-6
    cfg.workload.twin.max_sleep_s = 0.001
    plan = planner.plan(cfg.model, cfg.hardware, cfg.stage, workload=cfg.workload.name)
    assert plan.candidates, "smoke stage must have feasible candidates"
    return cfg, plan.candidates


SLURM_LOCAL = os.path.join(os.path.dirname(__file__), "cluster", "slurm_local.sh")


@pytest.fixture(scope="session")
def slurm_cluster() -> dict:
    """The local 4-node Slurm cluster (tests/cluster/slurm_local.sh), started if it is not up. Only for tests
    marked `slurm` (`pytest_runtest_setup` fails an unmarked one before it is started); never under `make check`.

    Cannot start: the test fails when CI is set (CI must run the Slurm tests), otherwise it is skipped.
    """
    if CHECK_TIER:
        pytest.fail("error: the local Slurm cluster under make check: mark its tests @pytest.mark.slurm", pytrace=False)
    import subprocess

    def script(action: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", SLURM_LOCAL, action], capture_output=True, text=True, timeout=600)

    if script("status").returncode != 0:
        up = script("up")
        if up.returncode != 0:
            msg = f"local Slurm cluster cannot start: {(up.stderr or up.stdout).strip()[-400:]}"
            if os.environ.get("CI"):
                pytest.fail(msg)
            pytest.skip(msg)
    return {"nodes": ["n1", "n2", "n3", "n4"], "gpus_per_node": 8, "conf": "/etc/slurm/slurm.conf"}


@pytest.fixture(scope="session")
def readme_tour(tmp_path_factory):
    """README.md's tour, run once per worker (tests/tour.py): its tests are in the xdist group tour.GROUP."""
    from tests.tour import run_tour

    return run_tour(tmp_path_factory.mktemp("readme-tour"))
