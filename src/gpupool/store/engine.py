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


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite:///{data_dir / 'gpupool.db'}"


def connect(url: str) -> Engine:
    """An engine for `url`; SQLite gets WAL, foreign keys and a busy timeout on every connection."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def _sqlite_pragmas(dbapi_connection: Any, _record: object) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


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
