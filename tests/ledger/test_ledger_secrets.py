"""The ledger's PostgreSQL password: never stored, exported or printed; taken from libpq's own places.

The shared test server trusts every local connection, so it cannot tell whether a password was sent. The
libpq tests run a private PostgreSQL with scram-sha-256 authentication (initdb in a temp folder, its own
port), where a role with a password is created and dropped. No initdb here: the test fails when CI is set,
otherwise it is skipped.
"""

from __future__ import annotations

import csv
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PG_DSN
from tests.sweeplib import ROOT, cli, sweep_args

ADMIN_PASSWORD = "admin-Pw-7731"
ROLE, ROLE_PASSWORD, ROLE_DB = "orch_pw", "role-Pw-5521", "orch_pw_db"


def _missing(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def scram_pg() -> Iterator[int]:
    """A private PostgreSQL that checks passwords (scram-sha-256); yields its port on 127.0.0.1."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb")) or [shutil.which("initdb") or ""]
    bindir = Path(found[-1]).parent
    if not found[-1]:
        _missing("no initdb (PostgreSQL server binaries) on this machine")
    as_user: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="orch-scram-"))
    if os.geteuid() == 0:  # initdb refuses root: run the server as the postgres user
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(base, "postgres")
    pwfile = base / "pw"
    pwfile.write_text(ADMIN_PASSWORD + "\n")
    if as_user:
        shutil.chown(pwfile, "postgres")
    port = _free_port()
    data = base / "data"
    pg_ctl = [*as_user, str(bindir / "pg_ctl"), "-D", str(data)]
    try:
        init = subprocess.run(
            [*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "postgres"]
            + ["--auth=scram-sha-256", f"--pwfile={pwfile}"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if init.returncode != 0:
            _missing(f"initdb failed: {init.stderr.strip()[-300:]}")
        opts = f"-p {port} -k {base} -c listen_addresses=127.0.0.1"
        start = subprocess.run(
            [*pg_ctl, "-l", str(base / "log"), "-o", opts, "-w", "start"], capture_output=True, text=True, timeout=300
        )
        if start.returncode != 0:
            _missing(f"pg_ctl start failed: {start.stderr.strip()[-300:]}")
        yield port
    finally:
        subprocess.run([*pg_ctl, "-m", "immediate", "stop"], capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def role(scram_pg: int) -> Iterator[int]:
    """A login role with a password and a database it owns, created and dropped here; yields the port."""
    import psycopg

    admin = psycopg.connect(
        host="127.0.0.1", port=scram_pg, user="postgres", password=ADMIN_PASSWORD, dbname="postgres", autocommit=True
    )
    admin.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{ROLE_PASSWORD}'")
    admin.execute(f"CREATE DATABASE {ROLE_DB} OWNER {ROLE}")
    try:
        yield scram_pg
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {ROLE_DB} WITH (FORCE)")
        admin.execute(f"DROP ROLE IF EXISTS {ROLE}")
        admin.close()


def _env(home: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without any libpq password source, HOME pointing at `home`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGPASSWORD", "PGPASSFILE")}
    return {**env, "HOME": str(home), **extra}


def _orchestrator(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.mark.postgres
def test_libpq_finds_the_password_in_pgpassword_or_pgpass(role, tmp_path):
    url = f"ledger.url=postgresql+psycopg://{ROLE}@127.0.0.1:{role}/{ROLE_DB}"
    home = tmp_path / "home"
    home.mkdir()
    # No password anywhere: the server refuses, and the error is one line
    r = _orchestrator(_env(home), "db", "upgrade", url)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no password supplied" in r.stderr, r.stderr
    # PGPASSWORD
    r = _orchestrator(_env(home, PGPASSWORD=ROLE_PASSWORD), "db", "upgrade", url)
    assert r.returncode == 0 and "upgraded from empty" in r.stdout, r.stderr
    # ~/.pgpass (libpq ignores a file others can read: 0600)
    pgpass = home / ".pgpass"
    pgpass.write_text(f"127.0.0.1:{role}:{ROLE_DB}:{ROLE}:{ROLE_PASSWORD}\n")
    pgpass.chmod(0o600)
    r = _orchestrator(_env(home), "db", "current", url)
    assert r.returncode == 0 and "(head)" in r.stdout, r.stderr
    # A wrong password in the URL: refused by the server, never printed
    wrong = f"ledger.url=postgresql+psycopg://{ROLE}:Wr0ngPw@127.0.0.1:{role}/{ROLE_DB}"
    r = _orchestrator(_env(tmp_path), "db", "current", wrong)
    assert r.returncode == 2 and "password authentication failed" in r.stderr, r.stderr
    assert "Wr0ngPw" not in r.stderr + r.stdout and r.stderr.startswith("error: ")


# Every form libpq / SQLAlchemy take a password in (the secret, how the URL carries it, the masked text stored).
URL_FORMS = {
    "userinfo": ("Plain-Secret-42", "postgres:{}@127.0.0.1:5432/{db}", "postgres:***@127.0.0.1"),
    "raw @": ("Raw@At-Secret-43", "postgres:{}@127.0.0.1:5432/{db}", "postgres:***@127.0.0.1"),
    "query password=": ("Query-Secret-44", "postgres@127.0.0.1:5432/{db}?password={}", "?password=***"),
    "query passfile=": ("/tmp/no-such-pgpass-Secret-45", "postgres@127.0.0.1:5432/{db}?passfile={}", "?passfile=***"),
}


@pytest.fixture(params=list(URL_FORMS))
def pg_url_with_password(request, _pg_ledger_db) -> tuple[str, str, str]:
    """The shared server (trust: any password is accepted) with a password in the URL, schema reset:
    (url, secret, what the stored snapshot holds instead)."""
    import psycopg

    with psycopg.connect(PG_DSN + f" dbname={_pg_ledger_db}", autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    secret, form, stored = URL_FORMS[request.param]
    return "postgresql+psycopg://" + form.format(secret, db=_pg_ledger_db), secret, stored


@pytest.mark.postgres
def test_the_stored_config_and_every_export_mask_the_password(pg_url_with_password, tmp_path):
    pg_url_with_password, secret, masked = pg_url_with_password
    args = [
        a if not a.startswith("ledger.url=") else f"ledger.url='{pg_url_with_password}'"  # quoted: = and ? in it
        for a in sweep_args(tmp_path, "masked", "policy.schedule.round0_size=1", "stage.budget.max_rounds=1")
    ]
    outputs = [cli("sweep", *args, "--plain", timeout=300)]
    assert outputs[0].returncode == 0, outputs[0].stderr[-2000:]
    url = f"ledger.url='{pg_url_with_password}'"
    out_csv = tmp_path / "sweep.csv"
    outputs.append(cli("ledger", "export", "--table", "sweep", "--out", str(out_csv), url))
    outputs.append(cli("ledger", "sweeps", "--format", "json", url))
    outputs.append(cli("status", "masked", url))
    for r in outputs:
        assert r.returncode == 0, r.stderr[-2000:]
        assert secret not in r.stdout + r.stderr
    (row,) = list(csv.DictReader(out_csv.open()))
    assert secret not in out_csv.read_text() and masked in row["config_yaml"]
    assert not any(tail in r.stdout + r.stderr for r in outputs for tail in secret.split("@") if len(tail) > 4)
    import psycopg

    from orchestrator.ledger.engine import parse_url

    dbname = parse_url(pg_url_with_password).database
    with psycopg.connect(PG_DSN + f" dbname={dbname}") as conn:
        stored = conn.execute("SELECT config_yaml FROM sweep").fetchone()[0]
    assert secret not in stored and "***" in stored
