"""How a gang's members' ends make its attempt's end (no Ray needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.executors.ray.gang import attempt_exit, member_folder

KEY = (7, 1)


def ended(*codes: int | None, never: str | None = None) -> dict[int, dict[str, Any]]:
    return {rank: {"exit_code": code, "why": None, "not_started": never} for rank, code in enumerate(codes)}


def test_every_member_done_is_success() -> None:
    assert attempt_exit(KEY, ended(0, 0), None, None, None).exit_code == 0


def test_the_member_whose_failure_stopped_the_others_gives_the_code() -> None:
    members = ended(-9, 3)  # rank 1 failed with 3, then rank 0 was killed
    assert attempt_exit(KEY, members, members[1], None, None).exit_code == 3
    assert attempt_exit(KEY, members, None, None, None).exit_code == -9, "without a failure: the first rank's"


def test_a_lost_node_wins_over_the_failures_it_caused() -> None:
    members = ended(1, None)  # rank 0's collective broke when rank 1's node died
    lost = attempt_exit(KEY, members, members[0], "node b (rank 1) was lost", 5.0)
    assert (lost.exit_code, lost.node_lost, lost.ended_at) == (None, "node b (rank 1) was lost", 5.0)


def test_a_member_never_started_gives_the_attempt_back() -> None:
    back = attempt_exit(KEY, ended(None, 0, never="no space left"), None, None, None)
    assert (back.started, back.why) == (False, "no space left")


def test_rank_zero_keeps_the_attempts_folder() -> None:
    assert member_folder(Path("/a"), 0) == Path("/a")
    assert member_folder(Path("/a"), 2) == Path("/a/rank-2")
