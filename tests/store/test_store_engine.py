"""Opening a store: SQLite's durability, and a store that cannot be reached said in one line."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from sqlalchemy import text

from gpupool.errors import GpupoolError, StoreUnavailable
from gpupool.store import Store
from gpupool.store.engine import connect


def test_sqlite_commits_are_durable_with_synchronous_full(tmp_path: Path) -> None:
    # An accepted job (a 201) must survive a power loss: WAL with synchronous=NORMAL may lose
    # the last commits, FULL syncs the WAL at every commit.
    engine = connect(f"sqlite:///{tmp_path / 'gpupool.db'}")
    with engine.connect() as connection:
        assert connection.execute(text("PRAGMA synchronous")).scalar() == 2  # FULL
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    engine.dispose()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_an_unreachable_postgresql_store_is_one_clear_line_with_the_password_masked() -> None:
    url = f"postgresql://gpupool:s3cret@127.0.0.1:{closed_port()}/gpupool"
    with pytest.raises(StoreUnavailable) as caught:
        Store.open(url)
    message = str(caught.value)
    assert isinstance(caught.value, GpupoolError)
    assert "s3cret" not in message
    assert "postgresql://gpupool:***@127.0.0.1:" in message
    assert "cannot open the store" in message
    assert "\n" not in message
    assert "refused" in message.lower()


def test_an_unknown_postgresql_host_is_a_clear_error() -> None:
    with pytest.raises(StoreUnavailable, match=r"postgresql://u:\*\*\*@no-such-host\.invalid/db"):
        Store.open("postgresql://u:pw@no-such-host.invalid/db")


def test_a_postgresql_login_that_is_refused_is_a_clear_error(postgres_url: str) -> None:
    wrong = postgres_url.replace("gpupool@", "nobody:pw@")
    with pytest.raises(StoreUnavailable, match=r"nobody:\*\*\*@") as caught:
        Store.open(wrong)
    assert "\n" not in str(caught.value)


def test_a_sqlite_file_in_a_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'missing' / 'gpupool.db'}"
    with pytest.raises(StoreUnavailable, match=r"cannot open the store sqlite:///.*missing/gpupool\.db: ") as caught:
        Store.open(url)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "missing").exists()


def test_a_url_that_is_not_a_store_is_a_clear_error() -> None:
    with pytest.raises(StoreUnavailable, match="not a store URL"):
        Store.open("nonsense")


def test_up_with_an_unreachable_store_says_so_without_a_traceback(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpupool.cli import app

    path = tmp_path / "gpupool.yaml"
    store = f"postgresql://gpupool:s3cret@127.0.0.1:{closed_port()}/gpupool"
    path.write_text(f"service:\n  data_dir: {tmp_path / 'data'}\n  run_as: service\n  store: '{store}'\n")
    result = CliRunner().invoke(app, ["up", "--config", str(path)])
    assert result.exit_code == 2
    assert "cannot open the store postgresql://gpupool:***@127.0.0.1:" in result.output
    assert "s3cret" not in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "data").exists(), "nothing is made for a store that cannot be reached"
