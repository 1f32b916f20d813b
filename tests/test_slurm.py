"""Slurm's notations as gpupool reads them: arrays, dependencies, batch directives."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.settle import JobState
from gpupool.slurm import directives, parse_after, parse_array, parse_states
from gpupool.store.holds import Verdict, judge


@pytest.mark.parametrize(
    ("text", "indexes", "limit"),
    [
        ("0-3", [0, 1, 2, 3], None),
        ("0-99%8", list(range(100)), 8),
        ("1,3,5-7", [1, 3, 5, 6, 7], None),
        ("0-20:5%2", [0, 5, 10, 15, 20], 2),
        ("7", [7], None),
    ],
)
def test_arrays(text: str, indexes: list[int], limit: int | None) -> None:
    assert parse_array(text) == (indexes, limit)


@pytest.mark.parametrize("text", ["", "a-b", "5-1", "0-3%0", "0-3%x", "0-100000", "1,,2"])
def test_a_bad_array_says_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match=r"array|range|limit|tasks|indexes"):
        parse_array(text)


@pytest.mark.parametrize(
    ("text", "pairs"),
    [
        ("12", [("ok", 12)]),
        ("12,13", [("ok", 12), ("ok", 13)]),
        ("ok:12:13", [("ok", 12), ("ok", 13)]),
        ("afterany:4,notok:5", [("any", 4), ("notok", 5)]),
    ],
)
def test_dependencies(text: str, pairs: list[tuple[str, int]]) -> None:
    assert parse_after(text) == pairs


@pytest.mark.parametrize("text", ["", "soon:12", "ok:", "ok:x"])
def test_a_bad_dependency_says_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match=r"dependency kind|job id"):
        parse_after(text)


@pytest.mark.parametrize(
    ("kind", "states", "verdict"),
    [
        ("ok", [JobState.RUNNING], Verdict.WAITING),
        ("ok", [JobState.SUCCEEDED], Verdict.MET),
        ("ok", [JobState.SUCCEEDED, JobState.FAILED], Verdict.NEVER),
        ("ok", [JobState.TIMEOUT, JobState.RUNNING], Verdict.NEVER),  # an array task failed already
        ("notok", [JobState.FAILED], Verdict.MET),
        ("notok", [JobState.SUCCEEDED], Verdict.NEVER),
        ("any", [JobState.CANCELLED, JobState.SUCCEEDED], Verdict.MET),
        ("any", [JobState.PENDING], Verdict.WAITING),
        ("any", [], Verdict.NEVER),
    ],
)
def test_dependency_verdicts(kind: str, states: list[JobState], verdict: Verdict) -> None:
    assert judge(kind, 12, states).verdict is verdict


def test_directives_are_read_up_to_the_first_command() -> None:
    script = (
        "#!/bin/sh\n#GPUPOOL --gpus 2  -J 'my run'\n\n# a comment\n#GPUPOOL -t 2h # why\necho hi\n#GPUPOOL --gpus 8\n"
    )
    assert directives(script) == ["--gpus", "2", "-J", "my run", "-t", "2h"]
    assert directives("#!/bin/sh\n#GPUPOOLX --gpus 2\n") == []


@pytest.mark.parametrize(
    ("states", "verdict"),
    [
        ([JobState.SUCCEEDED, JobState.RUNNING], Verdict.WAITING),  # another task may still fail
        ([JobState.SUCCEEDED, JobState.FAILED], Verdict.MET),
        ([JobState.SUCCEEDED, JobState.SUCCEEDED], Verdict.NEVER),
    ],
)
def test_notok_on_an_array_is_met_once_all_ended_and_one_did_not_succeed(
    states: list[JobState], verdict: Verdict
) -> None:
    assert judge("notok", 12, states).verdict is verdict


def test_a_bare_id_is_ok_whatever_came_before_it() -> None:
    assert parse_after("any:12,13") == [("any", 12), ("ok", 13)]


@pytest.mark.parametrize(("parse", "text"), [(parse_array, "5000000000"), (parse_after, "ok:99999999999")])
def test_ids_and_indexes_stay_within_what_the_store_keeps(parse: Any, text: str) -> None:
    with pytest.raises(ValueError, match="2,147,483,647"):
        parse(text)


def test_state_names_are_gpupools_and_slurms_in_any_case_and_cover_every_state() -> None:
    assert parse_states("PD,r") == ["pending", "running"]
    assert parse_states("PENDING") == ["pending"]
    assert parse_states("cd, F ,Ca,TO") == ["succeeded", "failed", "cancelled", "timeout"]
    assert parse_states("all") == [s.value for s in JobState]
    assert all(parse_states(s.value) == [s.value] for s in JobState)
    with pytest.raises(ValueError, match="'bogus' is not a job state: give pending, starting"):
        parse_states("R,bogus")
