"""The policy options reach the core the simulator drives."""

from __future__ import annotations

from gpupool.model import FairShare, PriorityScope
from gpupool.sim.cluster import cluster_from_sizes
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.replay import Policy, Settings, policy_config

CLUSTER = cluster_from_sizes({"a": 2, "b": 1}, 8, dedicated=False)
MODEL = JobModel({}, 1800.0)


def test_pool_fair_keeps_guarantees_against_every_other_team() -> None:
    config = policy_config(Policy.POOL_FAIR, CLUSTER, Settings(MODEL))
    assert (config.priority_preemption, config.fair_share) == (PriorityScope.ABOVE_GUARANTEE, FairShare.PREEMPT)
    assert {t: team.guaranteed_gpus for t, team in config.teams.items()} == {"a": 16, "b": 8}


def test_pool_priority_takes_the_options_it_is_given_and_the_baselines_preempt_nothing() -> None:
    settings = Settings(
        MODEL, fair_share=FairShare.PREEMPT, priority_preemption=PriorityScope.TEAM, reclaim=False, max_preemptions=2
    )
    config = policy_config(Policy.POOL_PRIORITY, CLUSTER, settings)
    assert (config.priority_preemption, config.fair_share, config.reclaim, config.max_preemptions) == (
        PriorityScope.TEAM,
        FairShare.PREEMPT,
        False,
        2,
    )
    for baseline in (Policy.PARTITIONED, Policy.POOL_FIFO):
        assert not policy_config(baseline, CLUSTER, settings).preemption
