"""Engines and schema versions: SQLite pragmas, PostgreSQL URLs, Alembic upgrade/current/history.

Why BEGIN IMMEDIATE: pysqlite opens transactions lazily and a reader that later writes fails with
"database is locked" when another writer got there first (optuna#820). The ledger's write sessions
ask for `sqlite_begin="IMMEDIATE"`, which takes the write lock up front and waits `busy_timeout`
for it; read sessions keep a deferred BEGIN so readers never block writers under WAL.
"""

from __future__ import annotations

import fcntl
import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, DBAPIError, NoSuchModuleError

from orchestrator.core.redact import redact
from orchestrator.ledger.errors import LedgerError

if TYPE_CHECKING:  # alembic is imported only to migrate or to read a ledger not at HEAD (HEAD below)
    from alembic.config import Config
    from alembic.script import ScriptDirectory

log = logging.getLogger("db")
HERE = Path(__file__).resolve().parent
SUPPORTED = ("sqlite", "postgresql")
# The revision orchestrator/ledger/migrations ends at. A ledger stored at it opens without importing alembic (and
# mako and pygments with it) in every CLI process; tests/ledger/test_db_migrations.py holds it equal to alembic's
# own head, so a new migration that forgets it fails there.
HEAD = "0013"
VERSION_TABLE = "alembic_version"  # alembic's default, which migrations/env.py keeps
ENV_PREFIX = "env:"


def parse_url(url: str | URL) -> URL:
    """A SQLAlchemy URL; `env:VAR` reads it from the environment (no password in a file or argv)."""
    if isinstance(url, URL):
        return url
    if url.startswith(ENV_PREFIX):
        var = url[len(ENV_PREFIX) :]
        if not os.environ.get(var):
            raise LedgerError(f"ledger URL variable {var} is not set; export {var}=postgresql+psycopg://...")
        url = os.environ[var]
    try:
        parsed = make_url(_raw_at_encoded(url))
    except ArgumentError:
        raise LedgerError("ledger.url is not a database URL; expected e.g. sqlite:///./ledger.sqlite") from None
    except ValueError:  # make_url's int(port)
        raise LedgerError(
            "ledger.url has a port that is not a number; expected e.g. postgresql+psycopg://user@host:5432/db"
        ) from None
    if parsed.get_backend_name() not in SUPPORTED:
        raise LedgerError(f"ledger backend '{parsed.get_backend_name()}' is not supported; use one of {SUPPORTED}")
    return parsed


def _raw_at_encoded(url: str) -> str:
    """`user:p@ss@host` as libpq reads it, with the userinfo ending at the last `@`: SQLAlchemy ends it at the
    first, so the password's tail would become the host (and be quoted in every connection error)."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if not sep or netloc.count("@") < 2:
        return url
    userinfo, _, host = netloc.rpartition("@")
    return f"{scheme}://{userinfo.replace('@', '%40')}@{host}{slash}{path}"


def mask(url: str | URL) -> str:
    """The URL with its password replaced by ***; used in every message and log line."""
    try:
        return redact(parse_url(url).render_as_string(hide_password=True))  # and the query's password=, passfile=
    except LedgerError:
        return "<invalid ledger URL>"


@dataclass(frozen=True)
class SqliteTarget:
    """What sqlite3 opens for a URL, as SQLAlchemy hands it over: the file (None: an in-memory database) and, when
    it can hold no ledger, why, in words that end with the fix ('' for a plain read-write file)."""

    path: Path | None
    problem: str = ""


# pysqlite's own arguments (SQLAlchemy passes them to sqlite3.connect, never to SQLite): every other query
# parameter is a SQLite URI parameter (https://www.sqlite.org/uri.html), read only with uri=true.
_PYSQLITE_ARGS = ("uri", "timeout", "isolation_level", "detect_types", "check_same_thread", "cached_statements")


def sqlite_target(url: URL) -> SqliteTarget | None:
    """The file a SQLite URL opens (None: not SQLite), resolved as sqlite3 will: SQLAlchemy's own
    `create_connect_args` gives the filename and whether it is a URI, and SQLite reads a URI's path and
    parameters only when that filename starts with `file:`; otherwise the whole string, `?mode=ro` and all, is
    the name of a file. Why: `sqlite:///file::memory:?cache=shared&uri=true` passed the in-memory check (its
    database is not `:memory:`) and a sweep ran all its jobs into a database that vanished at exit, and
    `sqlite:////x/ro.sqlite?mode=ro&uri=true` wrote a ledger named `ro.sqlite?mode=ro`."""
    if url.get_backend_name() != "sqlite":
        return None
    shown = unquote(mask(url))  # as typed: `file::memory:`, not `file%3A%3Amemory%3A`
    try:
        with warnings.catch_warnings():  # SQLAlchemy warns about URI parameters without uri=true: refused below
            warnings.simplefilter("ignore")
            args, opts = url.get_dialect()().create_connect_args(url)
    except ArgumentError:  # a user, password, host or port: SQLite opens local files only
        return SqliteTarget(
            None,
            f"ledger.url {shown} is not a SQLite URL: it takes a path only, e.g. "
            "ledger.url=sqlite:////ABSOLUTE/PATH/ledger.sqlite",
        )
    filename = str(args[0]) if args else ":memory:"
    memory = SqliteTarget(
        None,
        f"ledger.url {shown} is an in-memory database: the sweep's results would vanish when it exits, and "
        "status, resume and the jobs' lease keeper would each see an empty one; give a file, e.g. "
        "ledger.url=sqlite:///./ledger.sqlite",
    )
    if not opts.get("uri"):
        ignored = sorted(k for k in url.query if k not in _PYSQLITE_ARGS)
        if url.query.get("mode") == "memory" or filename in ("", ":memory:"):
            return memory
        path = Path(filename)
        if ignored:
            return SqliteTarget(
                path,
                f"ledger.url {shown} has SQLite URI parameter(s) {', '.join(ignored)} that SQLite ignores without "
                f"uri=true (it would open {path} read-write); drop them: ledger.url=sqlite:///{path}",
            )
        return SqliteTarget(path)
    if not filename.startswith("file:"):  # SQLite opens the whole string as a file name
        path = Path(filename).absolute()
        if "?" in filename:
            plain = Path(filename.split("?", 1)[0]).absolute()
            return SqliteTarget(
                path,
                f"ledger.url {shown} opens a file literally named '{path.name}' (with uri=true SQLite reads URI "
                f"parameters only after file:, as in sqlite:///file:{plain}?uri=true); a ledger is a plain "
                f"read-write file: ledger.url=sqlite:///{plain}",
            )
        return SqliteTarget(path)
    return _uri_target(filename, shown, memory)


def _uri_target(uri: str, shown: str, memory: SqliteTarget) -> SqliteTarget:
    """A `file:` URI as SQLite reads it: `file:[//localhost]PATH[?PARAMS][#...]`, PATH and PARAMS %-decoded."""
    rest = uri[len("file:") :].split("#", 1)[0]
    where, _, query = rest.partition("?")
    if where.startswith("//"):
        host, slash, tail = where[2:].partition("/")
        if host not in ("", "localhost"):
            return SqliteTarget(
                None, f"ledger.url {shown} names the host '{host}': SQLite opens local files only; give a path"
            )
        where = slash + tail
    params = {k.lower(): v for k, v in parse_qsl(query, keep_blank_values=True)}
    name = unquote(where)
    if name in ("", ":memory:") or params.get("mode") == "memory" or params.get("vfs") == "memdb":
        return memory
    path = Path(name).absolute()
    plain = f"ledger.url=sqlite:///{path}"
    if params.get("mode") == "ro" or _truthy(params.get("immutable")):
        how = "mode=ro" if params.get("mode") == "ro" else "immutable=1"
        return SqliteTarget(
            path,
            f"ledger.url {shown} opens the ledger read-only ({how}): a sweep writes every launch and result to it "
            f"and every command takes its locks in its -wal and -shm files; drop {how}: {plain}",
        )
    if _truthy(params.get("nolock")) or params.get("vfs") == "unix-none":
        return SqliteTarget(
            path,
            f"ledger.url {shown} opens the ledger without file locks: two processes (a driver and its lease "
            f"keeper, `status`, another sweep) would write over each other; drop it: {plain}",
        )
    return SqliteTarget(path)


def _truthy(value: str | None) -> bool:
    """SQLite's reading of a boolean URI parameter (sqlite3_uri_boolean): 1, yes, true, on."""
    return value is not None and value.strip().lower() in ("1", "yes", "true", "on")


def sqlite_path(url: URL) -> Path | None:
    """The file a SQLite URL opens (None: PostgreSQL, or a database that is no file): what the ledger's file
    checks, its WAL and its migration lock name, whatever form the URL takes."""
    target = sqlite_target(url)
    return None if target is None else target.path


def sqlite_file(url: URL, *, create: bool, create_dir: bool = False) -> Path | None:
    """The SQLite file a URL names (None: not SQLite), checked before anything opens it: an in-memory
    database, a read-only one (a URI's mode=ro, or a file or folder this user cannot write), a URL that opens
    a file other than the one it seems to name, and anything but a regular file are refused, before any launch
    or write (a ledger outlives the process that writes it, and every command writes its locks).

    Only a command that may create a ledger passes `create` (sqlite3 would make any missing file), and
    then only in an existing folder unless `create_dir`: a typo'd path is an error, not a new tree."""
    target = sqlite_target(url)
    if target is None:
        return None
    if target.problem or target.path is None:
        raise LedgerError(target.problem)
    path = target.path
    if path.exists() or path.is_symlink():
        if not path.is_file():
            raise LedgerError(f"{mask(url)} is not a regular file; point ledger.url at a .sqlite file")
        _check_writable(url, path)
        return path
    if not create:
        raise LedgerError(  # where it looked (a relative URL is read from the current folder) and both fixes
            f"no ledger at {mask(url)}: looked for {path.resolve()} (from {Path.cwd()}); cd to the project folder "
            "the sweep ran in, or pass ledger.url=sqlite:////ABSOLUTE/PATH/ledger.sqlite (no ledger yet: run a "
            "sweep or `python -m orchestrator db upgrade`)"
        )
    if not path.parent.is_dir():
        if not create_dir:
            raise LedgerError(
                f"the folder {path.parent} of ledger.url {mask(url)} does not exist: fix the path, create the "
                "folder, or add ledger.create_dir=true"
            )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(f"cannot create the ledger folder {path.parent}: {exc.strerror}") from None
    _check_writable(url, path)
    return path


def _check_writable(url: URL, path: Path) -> None:
    """The file (when it exists) and its folder must be writable: SQLite creates and removes the -wal and -shm
    files beside it as connections come and go, and a reader too takes its locks there."""
    for what, where in (("file", path), ("folder", path.parent)):
        if where.exists() and not os.access(where, os.W_OK):
            raise LedgerError(
                f"the ledger {what} {where} of {mask(url)} is read-only for this user (or on a read-only file "
                "system): every command writes the ledger's locks beside it; make it writable or copy the ledger "
                "to a writable folder and point ledger.url there"
            )


def scrub(message: str, url: URL) -> str:
    """Remove the password from a driver message, in case the driver echoed it (from the userinfo or the
    query), and any other secret the message quotes."""
    query = [v for k, v in url.query.items() if k.lower() in ("password", "passfile")]
    known = [str(url.password or ""), *(x for v in query for x in ((v,) if isinstance(v, str) else v))]
    return redact(message, known=known)


LOCKED, CONNECTION, FULL, NO_SCHEMA = "locked", "connection", "full", "no schema"
_PG_LOCKED = ("55P03", "57014")  # lock_not_available (lock_timeout), query_canceled (statement_timeout)
_PG_CONNECTION = ("57P01", "57P02", "57P03")  # the server shut the session down, or is starting / stopping


def failure_kind(exc: DBAPIError) -> str:
    """What a driver error says happened, so the line that stops a process names its real cause: LOCKED (a lock
    held past the wait: SQLite's busy timeout, PostgreSQL's lock or statement timeout), CONNECTION (the server
    connection lost or refused), FULL (no room for the database), NO_SCHEMA (the ledger's tables are gone), or
    '' for anything else. Read from the driver's error code (sqlite3's name, PostgreSQL's SQLSTATE), its text
    where it has no code."""
    orig = exc.orig
    name = str(getattr(orig, "sqlite_errorname", "") or "")
    state = str(getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "")
    said = str(orig if orig is not None else exc).lower()
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or state in _PG_LOCKED or "database is locked" in said:
        return LOCKED
    if name.startswith("SQLITE_FULL") or state == "53100" or "disk is full" in said:
        return FULL
    if "no such table" in said or state == "42P01":
        return NO_SCHEMA
    from_psycopg = type(orig).__module__.split(".")[0] in ("psycopg", "psycopg2")
    if (
        exc.connection_invalidated
        or state.startswith("08")
        or state in _PG_CONNECTION
        or (from_psycopg and not state and type(orig).__name__ in ("OperationalError", "InterfaceError"))
    ):
        return CONNECTION
    return ""


def first_line(exc: DBAPIError, url: URL) -> str:
    """The driver's own first line of an error, any secret it quotes masked."""
    return scrub(str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc), url)


def make_engine(
    url: str | URL, *, echo: bool = False, busy_timeout_ms: int = 30000, lock_timeout_ms: int | None = None
) -> Engine:
    """`lock_timeout_ms` (PostgreSQL): a statement waiting longer for a lock, or running longer than twice
    that, fails instead of blocking (the lease keeper's renewals); SQLite waits `busy_timeout_ms`."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, echo=echo, busy_timeout_ms=busy_timeout_ms)
    args: dict[str, Any] = {"connect_timeout": 10}
    if lock_timeout_ms is not None:
        args["connect_timeout"] = max(2, int(lock_timeout_ms / 1000) + 1)
        args["options"] = f"-c lock_timeout={int(lock_timeout_ms)} -c statement_timeout={2 * int(lock_timeout_ms)}"
    try:
        return create_engine(parsed, echo=echo, pool_pre_ping=True, connect_args=args)
    except NoSuchModuleError as exc:
        raise LedgerError(f"no driver for {mask(parsed)}: {exc}; install the 'postgres' extra") from None


def _sqlite_engine(url: URL, *, echo: bool, busy_timeout_ms: int) -> Engine:
    engine = create_engine(url, echo=echo, connect_args={"timeout": busy_timeout_ms / 1000})
    on_disk = sqlite_path(url) is not None

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: object) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (see module docstring)
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")  # first: the next pragma may wait
        if on_disk:
            _enter_wal(cur, busy_timeout_ms)
            cur.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; safe with WAL
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {'IMMEDIATE' if mode == 'IMMEDIATE' else 'DEFERRED'}")

    return engine


def _enter_wal(cur: Any, busy_timeout_ms: int) -> None:
    """PRAGMA journal_mode=WAL, retried within the busy timeout: on a fresh file, while another connection
    switches it or holds its first lock, SQLite answers 'database is locked' at once, without calling the
    busy handler (https://www.sqlite.org/wal.html#activating_and_configuring_wal_mode), so eight
    orchestrators opening one new ledger would otherwise fail where they should wait."""
    import sqlite3
    import time

    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def write_engine(engine: Engine) -> Engine:
    """The same pool, but every transaction starts with BEGIN IMMEDIATE on SQLite."""
    return engine.execution_options(sqlite_begin="IMMEDIATE")


# ---- Alembic ---------------------------------------------------------------------------------


def alembic_config(engine: Engine | None = None, connection: Connection | None = None) -> Config:
    """Config for orchestrator/ledger/alembic.ini; the engine travels in attributes so no URL goes through ini
    parsing."""
    from alembic.config import Config

    cfg = Config(str(HERE / "alembic.ini"))
    cfg.set_main_option("script_location", str(HERE / "migrations"))
    cfg.attributes["engine"] = engine
    cfg.attributes["connection"] = connection
    return cfg


def script_directory() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision(script: ScriptDirectory | None = None) -> str:
    head = (script or script_directory()).get_current_head()
    if head is None:  # only a broken install ships orchestrator/ledger/migrations without its versions
        raise LedgerError(f"no schema revision under {HERE / 'migrations'}; reinstall the orchestrator")
    return head


@dataclass
class SchemaState:
    current: str | None  # None: no alembic_version (fresh database)
    head: str
    has_tables: bool

    @property
    def fresh(self) -> bool:
        return self.current is None

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head


def schema_state(engine: Engine) -> SchemaState:
    """Read the database's revision; raise LedgerError when it is newer than this code. A ledger at HEAD is read
    with one SELECT; any other revision (or none) is checked against alembic's scripts."""
    with connect(engine) as conn:
        try:
            names = inspect(conn).get_table_names()
            if VERSION_TABLE in names:
                stored = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
                if stored == [HEAD]:
                    return SchemaState(current=HEAD, head=HEAD, has_tables=True)
            from alembic.runtime.migration import MigrationContext

            heads = MigrationContext.configure(conn).get_current_heads()
            has_tables = bool(names)
        except DatabaseError as exc:  # "file is not a database", "database disk image is malformed"
            detail = scrub(str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc), engine.url)
            raise LedgerError(
                f"the ledger at {mask(engine.url)} cannot be read ({detail}): restore it from a backup or point "
                "ledger.url at another ledger"
            ) from None
    script = script_directory()
    current = heads[0] if heads else None
    known = {r.revision for r in script.walk_revisions()}
    if current is not None and current not in known:
        raise LedgerError(
            f"the ledger at {mask(engine.url)} is at schema revision {current}, newer than this code "
            f"(head {head_revision(script)}); upgrade the orchestrator or point ledger.url elsewhere"
        )
    return SchemaState(current=current, head=head_revision(script), has_tables=has_tables)


@contextmanager
def connect(engine: Engine) -> Iterator[Connection]:
    """A connection, turning 'cannot connect' into one LedgerError with the masked URL."""
    try:
        conn = engine.connect()
    except DBAPIError as exc:
        detail = scrub(str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc), engine.url)
        raise LedgerError(f"cannot reach the ledger at {mask(engine.url)}: {detail}") from None
    with conn:
        yield conn


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    """Serialise concurrent upgrades: a file lock for SQLite, an advisory lock for PostgreSQL."""
    if engine.dialect.name == "sqlite":
        db = sqlite_path(engine.url)
        if db is None:
            yield
            return
        with open(f"{db}.migrate-lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
        return
    with connect(engine) as conn:
        conn.execute(text("SELECT pg_advisory_lock(7463310001)"))
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(7463310001)"))
            conn.commit()


def upgrade(engine: Engine, revision: str = "head") -> SchemaState:
    """Upgrade to `revision` under a lock, so eight processes opening a fresh file do it once."""
    from alembic import command
    from alembic.util import CommandError

    with _migration_lock(engine):
        state = schema_state(engine)
        if state.current != revision and not (revision == "head" and state.up_to_date):
            if state.fresh and state.has_tables:
                raise LedgerError(f"{mask(engine.url)} has tables but no ledger schema revision; use an empty database")
            try:
                with connect(engine) as conn:
                    command.upgrade(alembic_config(engine, conn), revision)
                    conn.commit()
            except CommandError as exc:
                raise LedgerError(f"cannot upgrade {mask(engine.url)} to {revision}: {exc}") from None
            log.info("ledger %s upgraded to %s", mask(engine.url), revision)
        return schema_state(engine)


def history() -> list[str]:
    """One line per revision, oldest first: 'rev <- down: message'."""
    out: list[str] = []
    for rev in reversed(list(script_directory().walk_revisions())):
        head = " (head)" if rev.is_head else ""
        out.append(f"{rev.revision}{head} <- {rev.down_revision or 'base'}: {rev.doc}")
    return out
