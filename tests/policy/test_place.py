"""The free-GPU index answers first-fit and best-fit as a scan of every node would, however
nodes have moved between its buckets (the driver's, and a decision's overlay on them)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpupool.model import Allocation, Node
from gpupool.policy.free import FreeGpus, FreeIndex

SIZES = st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=8)


@given(st.data())
def test_first_fit_and_best_fit_agree_with_a_scan(data: st.DataObject) -> None:
    sizes = data.draw(SIZES)
    nodes = [Node(f"n{i}", gpus, "t" if i % 3 else "u") for i, gpus in enumerate(sizes)]
    kept = FreeIndex(nodes)
    for _ in range(data.draw(st.integers(0, 6))):  # the driver's changes between decisions
        i = data.draw(st.integers(0, len(nodes) - 1))
        taken = [g for g in range(nodes[i].gpus) if g not in kept.free[i]]
        if len(taken) > 0 and data.draw(st.booleans()):
            kept.give((Allocation(nodes[i].name, tuple(taken[: data.draw(st.integers(1, len(taken)))])),))
        elif kept.free[i]:
            gpus = kept.free[i][: data.draw(st.integers(1, len(kept.free[i])))]
            kept.take((Allocation(nodes[i].name, gpus),))
    free = FreeGpus(kept)
    for _ in range(data.draw(st.integers(0, 6))):  # a decision's own, on its overlay
        i = data.draw(st.integers(0, len(nodes) - 1))
        if free.free[i]:
            free.take(i, free.free[i][:1])
    want = data.draw(st.integers(1, 8))
    groups = data.draw(st.sampled_from([[("t", None)], [("u", None)], [("t", None), ("u", None)]]))
    exclude = set(data.draw(st.lists(st.integers(0, len(nodes) - 1), max_size=3)))
    fitting = [
        i
        for i in range(len(nodes))
        if (nodes[i].gpu_type, None) in groups and len(free.free[i]) >= want and i not in exclude
    ]
    assert free.first_fit(want, groups, exclude) == (min(fitting) if fitting else None)
    best = free.best_fit(want, groups, exclude)
    if not fitting:
        assert best is None
    else:
        assert best in fitting and len(free.free[best]) == min(len(free.free[i]) for i in fitting)
