"""Opening a store: the engine, SQLite's pragmas, and migrations to the newest schema.

SQLite runs WAL with `synchronous=FULL`: the WAL is synced at every commit, so a job the API
accepted (a 201) survives a power loss; NORMAL could lose the last commits.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from gpupool.errors import StoreUnavailable

MIGRATIONS = Path(__file__).with_name("migrations")
READ_ONLY = "gpupool_read_only"
CONNECT_TIMEOUT = 10
"""Seconds a PostgreSQL connection may take to be made."""


DATABASE = "gpupool.db"
"""The SQLite store's file in the data directory."""


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite:///{data_dir / DATABASE}"


def masked(url: str) -> str:
    """`url` with its password replaced by `***`, also when it does not parse."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (SQLAlchemyError, ValueError):
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def _reason(error: BaseException) -> str:
    """What went wrong, on one line: the driver's message when there is one."""
    cause = getattr(error, "orig", None) or error
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    return " ".join(lines) or type(cause).__name__


def open_engine(url: str) -> Engine:
    """An engine for `url` that has connected once: a store that cannot be reached (refused,
    an unknown host, a login refused, a SQLite file in a missing folder, not a store URL)
    raises StoreUnavailable naming the URL, password masked, and the reason on one line."""
    where = masked(url)
    try:
        parsed = make_url(url)
    except (SQLAlchemyError, ValueError):
        raise StoreUnavailable(
            f"cannot open the store {where}: not a store URL (sqlite:///PATH or postgresql://USER@HOST/DB)"
        ) from None
    backend = parsed.drivername.split("+")[0]
    if backend not in ("sqlite", "postgresql"):
        raise StoreUnavailable(f"cannot open the store {where}: not a sqlite or postgresql URL")
    if backend == "sqlite" and parsed.database not in (None, "", ":memory:"):
        folder = Path(parsed.database).expanduser().parent
        if not folder.is_dir():
            raise StoreUnavailable(f"cannot open the store {where}: folder {folder} does not exist")
    try:
        engine = connect(url)
    except (SQLAlchemyError, ValueError, ImportError) as exc:
        raise StoreUnavailable(f"cannot open the store {where}: {_reason(exc)}") from None
    try:
        with engine.connect():
            pass
    except (SQLAlchemyError, OSError) as exc:
        engine.dispose()
        raise StoreUnavailable(f"cannot open the store {where}: {_reason(exc)}") from None
    return engine


def connect(url: str) -> Engine:
    """An engine for `url`; SQLite gets WAL, synchronous=FULL, foreign keys and a busy timeout on
    every connection."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    # libpq waits for an unanswering host without end: a store that does not answer within
    # CONNECT_TIMEOUT is unavailable (a connect_timeout in the URL wins).
    timeout = {} if "connect_timeout" in make_url(url).query else {"connect_timeout": CONNECT_TIMEOUT}
    return create_engine(url, pool_pre_ping=True, connect_args=timeout)


def _sqlite_pragmas(dbapi_connection: Any, _record: object) -> None:
    # pysqlite would begin a transaction only at the first write, so two transactions could read
    # the same row and both write it (a cancel and a start of one job). SQLAlchemy begins them
    # instead, see _sqlite_begin.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    # FULL: every commit syncs the WAL, so a submission the API answered 201 survives a power
    # loss (NORMAL syncs only at checkpoints and may lose the last commits).
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _sqlite_begin(connection: Any) -> None:
    """Every transaction that may write takes SQLite's write lock at its start: those are
    serialized, so what one reads no other changes before it commits (PostgreSQL gets that from
    row locks). Read-only ones begin deferred and read one WAL snapshot."""
    read_only = connection.get_execution_options().get(READ_ONLY, False)
    connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def read_options(engine: Engine) -> dict[str, Any]:
    """Execution options of transactions that only read: on PostgreSQL, read-only and
    repeatable read, so that several queries see one state."""
    if engine.dialect.name == "sqlite":
        return {READ_ONLY: True}
    return {"isolation_level": "REPEATABLE READ", "postgresql_readonly": True}


def _alembic(connection: object) -> AlembicConfig:
    config = AlembicConfig()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision (a no-op when it is there already)."""
    with engine.begin() as connection:
        command.upgrade(_alembic(connection), "head")


def revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head() -> str | None:
    return ScriptDirectory.from_config(_alembic(None)).get_current_head()
