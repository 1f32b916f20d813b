"""Migrations that move data: a store taken to another revision keeps what it had."""

from __future__ import annotations

from alembic import command
from sqlalchemy import text

from gpupool.model import DEFAULT_CLASSES, Allocation, Config, Node
from gpupool.store import JobSpec, Store
from gpupool.store.engine import _alembic


def test_the_local_executors_handle_is_a_pid_before_0008_and_back(store_url: str) -> None:
    store = Store.open(store_url)
    try:
        store.sync_config(Config(DEFAULT_CLASSES))
        store.set_nodes([Node("n0", 4, "virtual")], virtual=True)
        job = store.submit(JobSpec(["train"]), now=0.0)
        store.start_attempt(job.id, [Allocation("n0", (0,))], now=1.0, message="started")
        store.mark_running(job.id, 0, {"pid": 4242, "started": "99"}, now=1.0)
        with store.engine.begin() as connection:
            command.downgrade(_alembic(connection), "0007")
            assert tuple(connection.execute(text("SELECT pid, pid_started FROM attempts")).one()) == (4242, "99")
            command.upgrade(_alembic(connection), "head")
        [attempt] = store.attempts(job.id)
        assert attempt.handle == {"pid": 4242, "started": "99"}
        assert [n.name for n in store.nodes()] == ["n0"], "a node there before is up"
        assert [(p.node, p.gpu) for p in store.held()] == [("n0", 0)], "no row referring to an attempt is lost"
    finally:
        store.close()
