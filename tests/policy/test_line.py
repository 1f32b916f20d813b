"""The line gives the jobs in the order the sort of `oracle.queue_order` gives them, and passes the
jobs of hopeless kinds without changing the order of the others: checked against
`queue_order` with a consumer that, at every job it is given, changes teams' shares (up, as a
start does, or down, as a notice to a team's job does) and marks kinds hopeless, as the queue
pass does."""

from __future__ import annotations

import random
from collections.abc import Iterator

from hypothesis import given
from hypothesis import strategies as st

from gpupool.model import Job, QueueOrder
from gpupool.policy.line import Kind, Line, kind_of
from tests.support.oracle import queue_order

TEAMS = "abc"


def jobs_of(seed: int, count: int) -> list[Job]:
    rng = random.Random(seed)
    return [
        Job(
            f"j{i}",
            rng.choice(TEAMS),
            rng.choice(["high", "low"]),
            rng.choice([1, 4]),
            float(rng.randrange(0, 6)),
            order=i,
            nominated=rng.random() < 0.1,
        )
        for i in range(count)
    ]


def consume(jobs: list[Job], seed: int, order: QueueOrder, indexed: bool, skip: set[str]) -> list[str]:
    """The ids of the jobs a consumer acts on, in order; it acts on every job whose kind is not
    hopeless (changing shares and the hopeless kinds by its own random stream)."""
    rng = random.Random(seed)
    shares = {team: float(rng.randrange(0, 3)) for team in TEAMS}
    hopeless: set[Kind] = {kind_of(job) for job in jobs if rng.random() < 0.2}
    values = {"high": 100, "low": 0}
    given_ids = []
    stream: Iterator[Job]
    if indexed:
        stream = (
            job
            for _, job in Line(jobs).in_order(
                lambda team, asked: values[asked], order, shares.__getitem__, skip, hopeless.__contains__
            )
        )
    else:
        pending = [(values[j.priority], j) for j in jobs if j.id not in skip]
        stream = queue_order(pending, order, shares.__getitem__)
    for job in stream:
        if kind_of(job) in hopeless:
            assert not indexed, f"the line gave {job.id}, of a kind it was told is hopeless"
            continue
        given_ids.append(job.id)
        move = rng.random()
        if move < 0.3:
            shares[job.team] += job.gpus  # it started
        elif move < 0.7:
            shares[rng.choice(TEAMS)] -= 1.0  # a job of that team was given notice
        if rng.random() < 0.4:
            hopeless.add(kind_of(job))
    return given_ids


@given(
    st.integers(0, 10**6),
    st.integers(0, 60),
    st.integers(0, 10**6),
    st.sampled_from(list(QueueOrder)),
    st.integers(0, 5),
)
def test_the_index_gives_the_queue_orders_jobs_and_passes_only_hopeless_ones(
    job_seed: int, count: int, seed: int, order: QueueOrder, skipped: int
) -> None:
    jobs = jobs_of(job_seed, count)
    skip = {job.id for job in jobs[:skipped]}
    assert consume(jobs, seed, order, True, skip) == consume(jobs, seed, order, False, skip)


def test_a_team_whose_share_fell_keeps_its_turn_at_its_next_job_passed() -> None:
    """Team a's jobs h1 and h2 are of a hopeless kind; b1's start gives notice to a job of team
    a, lowering a's share. queue_order reads a's share again when h2 comes up (after b1), so a's
    next job j goes before b2: passing h1 and h2 at once must not skip that reading."""
    jobs = [
        Job("h1", "a", "low", 4, 0.0, order=0),
        Job("b1", "b", "low", 1, 1.0, order=1),
        Job("h2", "a", "low", 4, 2.0, order=2),
        Job("b2", "b", "low", 1, 3.0, order=3),
        Job("j", "a", "low", 1, 5.0, order=4),
        Job("b3", "b", "low", 1, 6.0, order=5),
    ]
    hopeless = {kind_of(jobs[0])}
    orders = []
    for indexed in (True, False):
        shares = {"a": 1.0, "b": 1.0}
        stream: Iterator[Job]
        if indexed:
            stream = (
                job
                for _, job in Line(jobs).in_order(
                    lambda t, a: 0, QueueOrder.PRIORITY, shares.__getitem__, set(), hopeless.__contains__
                )
            )
        else:
            stream = queue_order([(0, j) for j in jobs], QueueOrder.PRIORITY, shares.__getitem__)
        seen = []
        for job in stream:
            if kind_of(job) in hopeless:
                continue
            seen.append(job.id)
            if job.id == "b1":
                shares["a"] = 0.0
        orders.append(seen)
    assert orders[0] == orders[1] == ["b1", "j", "b2", "b3"]
