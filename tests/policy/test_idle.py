"""The idle rule of sessions (`policy.idle`): warn, then reclaim as the class says; end a shell
left detached past the grace. Pure: the times are given."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.model import Config, PriorityClass, SessionKind, SessionPolicy
from gpupool.policy.idle import SessionSeen, idle_stretch, review
from tests.support.exercised import Exercised

CONFIG = Config(
    (
        PriorityClass("interactive", 500, True, False, idle_after=600.0, on_idle="end"),
        PriorityClass("notebooks", 400, True, False, idle_after=600.0, on_idle="requeue"),
        PriorityClass("low", 0, False, True),
    ),
    sessions=SessionPolicy("interactive", detach_grace=300.0, idle_notice=60.0, idle_counts_after=120.0),
)
SHELL = SessionSeen(1, 0, SessionKind.SHELL, "interactive", last_activity=1000.0)


def test_a_session_used_lately_is_left_alone() -> None:
    assert review([SHELL], CONFIG, 1000.0 + 599) == []


def test_an_idle_session_is_warned_once_then_ended_after_the_notice() -> None:
    [warn] = review([SHELL], CONFIG, 1600.0)
    assert warn.action == "warn"
    assert "idle for 10.0 min" in warn.message and "in 1.0 min" in warn.message
    warned = replace(SHELL, warned_at=1600.0)
    assert review([warned], CONFIG, 1659.0) == []
    [end] = review([warned], CONFIG, 1660.0)
    assert (end.action, end.job) == ("end", 1)
    assert "class interactive: idle_after 10.0 min" in end.message


def test_the_class_says_whether_an_idle_session_is_ended_or_requeued() -> None:
    notebook = replace(SHELL, kind=SessionKind.NOTEBOOK, priority="notebooks", warned_at=1600.0)
    [action] = review([notebook], CONFIG, 1700.0)
    assert action.action == "requeue"
    assert "is requeued" in review([replace(notebook, warned_at=None)], CONFIG, 1700.0)[0].message


def test_a_class_without_idle_after_is_never_reclaimed_for_idleness() -> None:
    assert review([replace(SHELL, priority="low")], CONFIG, 10**9) == []


def test_a_shell_left_detached_past_the_grace_ends_whatever_its_activity() -> None:
    left = replace(SHELL, last_activity=2000.0, detached_since=1800.0)
    assert review([left], CONFIG, 2099.0) == []
    [end] = review([left], CONFIG, 2100.0)
    assert end.action == "end"
    assert "no terminal attached for 5.0 min (sessions.detach_grace: 5.0 min)" in end.message


def test_nothing_is_reclaimed_before_its_time_and_one_action_at_most() -> None:
    exercised = Exercised()

    @given(
        last=st.floats(0, 1e4),
        warned=st.none() | st.floats(0, 1e4),
        detached=st.none() | st.floats(0, 1e4),
        now=st.floats(0, 2e4),
    )
    def check(last: float, warned: float | None, detached: float | None, now: float) -> None:
        seen = SessionSeen(1, 0, SessionKind.SHELL, "interactive", last, warned, detached)
        actions = review([seen], CONFIG, now)
        assert len(actions) <= 1
        for action in actions:
            if action.action == "warn":
                assert warned is None and now - last >= 600.0
            elif detached is not None and now - detached >= 300.0:
                assert action.action == "end"
            else:
                assert warned is not None and now - warned >= 60.0
        kinds = {a.action for a in actions}
        exercised.note(
            warns="warn" in kinds,
            reclaims="end" in kinds and (detached is None or now - detached < 300.0),
            ends_detached="end" in kinds and detached is not None and now - detached >= 300.0,
            leaves_alone=not actions,
        )

    check()
    exercised.assert_shown("warns", "reclaims", "ends_detached", "leaves_alone")


@pytest.mark.parametrize(("stretch", "counted"), [(119.0, 0.0), (120.0, 120.0), (3600.0, 3600.0)])
def test_a_stretch_counts_as_idle_whole_once_it_is_long_enough(stretch: float, counted: float) -> None:
    assert idle_stretch(1000.0, 1000.0 + stretch, CONFIG) == counted


def test_a_command_run_in_the_foreground_is_never_reclaimed_for_idleness() -> None:
    run = replace(SHELL, kind=SessionKind.RUN, warned_at=1600.0)
    assert review([run], CONFIG, 10**9) == []


def test_a_session_of_a_class_the_configuration_lost_is_left_to_its_time_limit() -> None:
    assert review([replace(SHELL, priority="gone")], CONFIG, 10**9) == []
