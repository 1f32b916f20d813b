"""What the service keeps of running sessions between the rule's reviews (`service.sessions`):
terminals attached and activity count per attempt, so that a terminal of an attempt that ended
never makes a later attempt of the same job look detached, or active."""

from __future__ import annotations

from pathlib import Path

from gpupool.model import DEFAULT_CLASSES, Config, SessionKind
from gpupool.service.sessions import Sessions
from gpupool.store import Store
from tests.support.fakes import FakeExecutor


def test_a_terminal_of_an_ended_attempt_that_leaves_detaches_nothing_of_the_next(tmp_path: Path) -> None:
    config = Config(DEFAULT_CLASSES)
    store = Store.open(f"sqlite:///{tmp_path / 'gpupool.db'}")
    sessions = Sessions(store, FakeExecutor(store), config)
    sessions.started((7, 0), SessionKind.SHELL, "interactive", now=0.0)
    sessions.attach((7, 0), 1.0, 1)
    sessions.forget([(7, 0)])  # requeued: its terminal is still open in the API
    sessions.started((7, 1), SessionKind.SHELL, "interactive", now=5.0)
    sessions.attach((7, 1), 6.0, 1)
    sessions.attach((7, 0), 7.0, -1)  # the first attempt's terminal closes late
    [seen] = sessions.seen()
    assert (seen.attempt, seen.detached_since) == (1, None)
    sessions.attach((7, 1), 8.0, -1)
    [seen] = sessions.seen()
    assert seen.detached_since == 8.0


def test_a_keystroke_on_a_terminal_of_an_ended_attempt_keeps_no_later_one_active(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'gpupool.db'}")
    sessions = Sessions(store, FakeExecutor(store), Config(DEFAULT_CLASSES))
    sessions.started((7, 0), SessionKind.SHELL, "interactive", now=0.0)
    sessions.forget([(7, 0)])
    sessions.started((7, 1), SessionKind.SHELL, "interactive", now=5.0)
    sessions.active((7, 0), 9.0)  # typed on the first attempt's terminal, still open
    [seen] = sessions.seen()
    assert seen.last_activity == 5.0
    sessions.active((7, 1), 9.0)
    [seen] = sessions.seen()
    assert seen.last_activity == 9.0
