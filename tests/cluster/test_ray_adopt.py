"""How a gang not all there is taken when a scheduler adopts it (pure: what its launchers said
and its members' records on shared storage; no Ray cluster needed)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpupool.executors import Recorded
from gpupool.executors.ray.adopt import GONE, UNKNOWN, lost, unrecorded

NAME = "store:7:0"


def recorded(folder: Path) -> Recorded:
    return Recorded(7, 0, {"executor": "ray"}, folder, (), time.time() - 5, None)


def records(folder: Path, rank: int, exit_code: int | None) -> None:
    """What rank's launcher wrote: that it started, and its exit status unless None."""
    where = folder if rank == 0 else folder / f"rank-{rank}"
    where.mkdir(parents=True, exist_ok=True)
    owner = f"{NAME}:{rank}"
    (where / "launcher.json").write_text(json.dumps({"pid": 1, "started": "1", "owner": owner}))
    if exit_code is not None:
        (where / "exit.json").write_text(json.dumps({"exit_code": exit_code, "owner": owner}))


def test_a_member_not_started_and_another_never_asked_is_a_gang_given_back(tmp_path: Path) -> None:
    never = {"exit_code": None, "why": None, "not_started": "no process to fork"}
    ended = lost(recorded(tmp_path), NAME, [never, UNKNOWN])
    assert ended.started is False, "nothing of it ran: not the job's failure"


def test_a_gang_the_scheduler_before_gave_back_or_ended_is_taken_as_it_said(tmp_path: Path) -> None:
    assert lost(recorded(tmp_path), NAME, [{"forgotten": False}, UNKNOWN]).started is False
    killed = lost(recorded(tmp_path), NAME, [{"forgotten": True}, {"forgotten": True}])
    assert (killed.started, killed.exit_code, killed.node_lost) == (True, None, None)


def test_a_gang_with_a_launcher_gone_lost_its_node(tmp_path: Path) -> None:
    assert lost(recorded(tmp_path), NAME, [None, GONE]).node_lost is not None


def test_members_that_all_recorded_their_end_end_the_gang_as_they_did(tmp_path: Path) -> None:
    records(tmp_path, 0, 0)
    records(tmp_path, 1, 3)
    ended = lost(recorded(tmp_path), NAME, [UNKNOWN, UNKNOWN])
    assert (ended.exit_code, ended.started) == (3, True)


def test_an_attempt_without_a_handle_ended_as_its_records_say(tmp_path: Path) -> None:
    assert unrecorded(recorded(tmp_path / "none"), NAME).started is False, "no member started"
    done = tmp_path / "done"
    records(done, 0, 0)
    ended = unrecorded(recorded(done), NAME)
    assert (ended.exit_code, ended.started) == (0, True), "a job that ran to its end does not run again"
    killed = tmp_path / "killed"
    records(killed, 0, None)
    records(killed, 1, 0)
    ended = unrecorded(recorded(killed), NAME)
    assert (ended.started, ended.exit_code) == (False, None), "stopped for the scheduler's reasons: not charged"


def test_a_launcher_given_up_while_its_ping_was_answered_is_made_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.executors import NodeState
    from gpupool.executors.ray import nodes as ray_nodes
    from gpupool.model import Node

    nodes = ray_nodes.RayNodes("ns", 60.0)
    node = ray_nodes.RayNode(NodeState(Node("a", 4)), "id-a", "10.0.0.1", launcher=object(), ready="ping")
    nodes.known["id-a"] = node

    def answered(refs: list[object], timeout: float) -> tuple[list[object], list[object]]:
        nodes.forget_launcher("id-a")  # the watcher saw its member's launcher die meanwhile
        return refs, []

    monkeypatch.setattr("ray.wait", answered)
    monkeypatch.setattr("ray.get", lambda *_a, **_k: {"incarnation": "old"})
    nodes._bring_up(node, 0.0)
    assert not (node.up and node.launcher is None), "never up without a launcher"
    assert nodes.by_name("a") is None and nodes.launchers() == []


def test_a_forget_its_launcher_did_not_take_is_asked_again_then_its_node_set_aside() -> None:
    from ray.exceptions import ActorUnavailableError

    from gpupool.executors.ray.executor import RayExecutor

    class Launcher:
        def __init__(self) -> None:
            self.asked = 0
            self.forget = self

        def remote(self, *_args: object) -> object:
            self.asked += 1
            return object()

    class Pool:
        def __init__(self) -> None:
            self.aside: list[str] = []

        def by_id(self, node_id: str) -> object:
            return node_id

        def set_aside(self, node_id: str) -> None:
            self.aside.append(node_id)

    executor = RayExecutor.__new__(RayExecutor)  # its bookkeeping only: no Ray
    pool = Pool()
    executor.forgetting, executor.pool = {}, pool  # type: ignore[assignment]
    launcher = Launcher()
    executor._ask_to_forget(launcher, "store:7:0", True, "node-a", 0)
    for _ in range(11):
        [ref] = executor.forgetting
        executor._forgot(ref, ActorUnavailableError("unreachable", None))
    assert launcher.asked == 11 and not executor.forgetting
    assert pool.aside == ["node-a"], "a member given up may still run there: no more gangs placed on it"
