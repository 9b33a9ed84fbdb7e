"""Shared pytest fixtures.

`smoke`: the smoke stage's config (fast twin) and its feasible candidates, for tests that build job specs.

`ledger_url`: every ledger test runs twice, against a SQLite file and against the real PostgreSQL on
127.0.0.1:5432 (user postgres, trust). One database per test session (orch_test_<pid>: one per xdist
worker), emptied before each test and dropped at the end. PostgreSQL unreachable: the test fails when CI is
set (CI must prove both engines), otherwise it is skipped.

`make test` runs the suite on several pytest-xdist workers (`--dist loadgroup`). Every test that uses the one
local Slurm cluster (marked `slurm` or asking for `slurm_cluster`) is put in one group, so they run one after
another on one worker: they drain nodes, count sbatch and sacct calls, and check that nothing is left pending.
"""

from __future__ import annotations

import os
import sys
import sysconfig

import pytest

PG_DSN = "host=127.0.0.1 port=5432 user=postgres connect_timeout=5"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """The tests of the shared Slurm cluster go to one xdist worker (see the module docstring). First of the
    hook's implementations: xdist's own (on each worker) reads the `xdist_group` marks into the node ids its
    scheduler groups by, and a mark added after it groups nothing (the driver test and the 4-node test then
    ran at once on two workers, and the driver's job waited behind the 4-node job until its time ran out)."""
    for item in items:
        if _uses_slurm(item):
            item.add_marker(pytest.mark.xdist_group("slurm"))


def _uses_slurm(item) -> bool:
    return "slurm" in item.keywords or "slurm_cluster" in getattr(item, "fixturenames", ())


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
    """The local 4-node Slurm cluster (tests/cluster/slurm_local.sh), started if it is not up.

    Cannot start: the test fails when CI is set (CI must run the Slurm tests), otherwise it is skipped.
    """
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
