"""Why a job waits, always with the rule and the numbers."""

from __future__ import annotations

from gpupool.model import DEFAULT_CLASSES, Config, PriorityBudget, Reason, Snapshot, Team
from tests.support.builders import job, on, pool, running
from tests.support.oracle import decide

NOW = 1000.0


def test_a_job_without_victims_is_told_which_rule_protects_each_one() -> None:
    nodes = pool(1, 4)
    young = running(job("young", cls="low", gpus=2), on("n0", 0, 1), started=NOW - 30)
    capped = running(job("capped", cls="normal", gpus=1, preemptions=10), on("n0", 2), started=0)
    vip = running(job("vip", cls="urgent", gpus=1), on("n0", 3), started=0)
    plan = decide(Snapshot(nodes, [young, capped, vip], [job("h", cls="high", gpus=4)]), Config(DEFAULT_CLASSES), NOW)
    [wait] = plan.waits
    assert wait.reason is Reason.NO_VICTIMS
    assert "inside their minimum runtime (low: 2.0 min): job young for 1.5 min more" in wait.message
    assert "at their preemption cap: job capped (10 of 10)" in wait.message
    assert "vip" not in wait.message, "an urgent job is not one a high job could take anyway"
    assert plan.retry_at == NOW + 90


def test_a_demoted_job_says_its_team_is_over_budget_when_it_waits() -> None:
    nodes = pool(1, 2)
    busy = running(job("busy", team="b", cls="normal", gpus=2), on("n0", 0, 1), started=0)
    config = Config(DEFAULT_CLASSES, {"a": Team("a", budgets=(PriorityBudget("high", 1.0, 86400),))})
    snapshot = Snapshot(nodes, [busy], [job("h", team="a", cls="high", gpus=2)], usage={("a", "high"): 7200.0})
    [wait] = decide(snapshot, config, NOW).waits
    assert "team a is over its high budget (2.0 of 1 GPU-h per 24 h): runs as normal" in wait.message


def test_a_gang_that_needs_nodes_of_one_type_says_how_many_of_each_the_pool_has() -> None:
    from gpupool.model import Node
    from gpupool.policy.messages import never_fits

    nodes = [Node("a", 4, "a100"), Node("b", 4, "h100"), Node("c", 1, "h100")]
    message = never_fits(job("g", gpus=4, gpus_per_node=2), nodes)
    assert message == (
        "can never fit: 4 GPUs as 2 members of 2 on separate nodes need 2 nodes of one GPU type with at "
        "least 2 GPUs; the pool has 1 such node of type a100, 1 of type h100"
    )
    nodes = [Node("a", 4, "a100"), Node("b", 4, "a100"), Node("c", 4, "h100"), Node("d", 4, "h100")]
    message = never_fits(job("g", gpus=12, gpus_per_node=4), nodes)
    assert message.endswith("the pool has 2 such nodes of type a100, 2 of type h100")
    one_type = never_fits(job("g", gpus=4, gpus_per_node=2), [Node("a", 4, "a100")])
    assert one_type.endswith("need 2 nodes with at least 2 GPUs; the pool has 1")


def test_each_protection_names_its_rule_and_when_it_ends() -> None:
    from gpupool.policy.preempt.candidates import ProtectionRule, protection

    config = Config(DEFAULT_CLASSES, max_preemptions=2)
    classes = {c.name: c for c in DEFAULT_CLASSES}
    young = running(job("young", cls="low"), on("n0", 0), started=NOW - 30)
    young_guard = protection(young, classes["low"], NOW, config)
    assert young_guard is not None and young_guard.rule is ProtectionRule.MIN_RUNTIME
    assert young_guard.until == NOW - 30 + classes["low"].min_runtime
    capped = running(job("capped", cls="normal", preemptions=2), on("n0", 1), started=0)
    capped_guard = protection(capped, classes["normal"], NOW, config)
    assert capped_guard is not None and (capped_guard.rule, capped_guard.until) == (ProtectionRule.PREEMPTION_CAP, None)
    assert (
        protection(running(job("free", cls="normal"), on("n0", 2), started=0), classes["normal"], NOW, config) is None
    )
