"""Opening a store: the engine, SQLite's pragmas, and migrations to the newest schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event

MIGRATIONS = Path(__file__).with_name("migrations")
READ_ONLY = "gpupool_read_only"


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite:///{data_dir / 'gpupool.db'}"


def connect(url: str) -> Engine:
    """An engine for `url`; SQLite gets WAL, foreign keys and a busy timeout on every connection."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    return create_engine(url, pool_pre_ping=True)


def _sqlite_pragmas(dbapi_connection: Any, _record: object) -> None:
    # pysqlite would begin a transaction only at the first write, so two transactions could read
    # the same row and both write it (a cancel and a start of one job). SQLAlchemy begins them
    # instead, see _sqlite_begin.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
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
