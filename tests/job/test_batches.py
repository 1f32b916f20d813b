"""`Batches` across a change of world size (issue 36): the epoch's items are used in order, a
step's worth over every rank at a time, so a run resumed at another world size or batch size
goes on from the very next item, none seen twice and none skipped."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpupool.job.data import Batches
from tests.support.exercised import Exercised


def steps(size: int, batch: int, world: int, epoch: int, used: int, count: int) -> list[list[int]]:
    """The items `count` steps of every rank take, from the position (epoch, used)."""
    ranks = [Batches(size, batch, seed=7, rank=r, world=world) for r in range(world)]
    taken = []
    for each in ranks:
        each.epoch, each.used = epoch, used
    iterators = [iter(each) for each in ranks]
    for _ in range(count):
        taken.append([item for it in iterators for item in next(it)])
        for each in ranks:
            each.advance()
    return taken


def test_a_run_resharded_mid_epoch_sees_every_item_of_the_epoch_once() -> None:
    exercised = Exercised()

    @given(st.integers(1, 8), st.integers(1, 8), st.integers(1, 8), st.integers(1, 8), st.integers(0, 12), st.data())
    def check(batch: int, world: int, batch_after: int, world_after: int, before: int, data: st.DataObject) -> None:
        size = data.draw(st.integers(max(batch * world, batch_after * world_after) * 2, 200))
        first = Batches(size, batch, seed=7, world=world)
        before = min(before, size // first.step_items - 1)
        taken = steps(size, batch, world, 0, 0, before)
        saved = {**first.state_dict(), "used": before * first.step_items}
        resumed = Batches(size, batch_after, seed=7, rank=0, world=world_after)
        state = resumed.resharded(saved)
        if state["epoch"] == 0:  # a whole step of the new size is left in the epoch
            left = (size - state["used"]) // resumed.step_items
            taken += steps(size, batch_after, world_after, 0, state["used"], left)
        seen = [item for step in taken for item in step]
        assert len(seen) == len(set(seen)), "an item seen twice"
        assert seen == list(first.order(0)[: len(seen)]), "an item skipped, or out of order"
        assert size - len(seen) < max(batch_after * world_after, batch * world), "more than a step's items left"
        exercised.note(resharded_mid_epoch=before > 0 and (batch, world) != (batch_after, world_after))

    check()
    exercised.assert_shown("resharded_mid_epoch", share=0.5)


def test_a_checkpoint_of_the_old_position_in_batches_reads_as_as_many_items() -> None:
    batches = Batches(512, batch_size=8, seed=3, rank=1, world=2)
    state = batches.state_dict()
    del state["used"]
    batches.load_state_dict({**state, "epoch": 2, "position": 10})
    assert (batches.epoch, batches.used) == (2, 160)


def step_sets(
    size: int, batch: int, world: int, global_batch: int, epoch: int, used: int, count: int
) -> list[set[int]]:
    """The items each of `count` steps takes over every rank and every accumulated batch."""
    ranks = [Batches(size, batch, seed=7, rank=r, world=world, global_batch=global_batch) for r in range(world)]
    for each in ranks:
        each.epoch, each.used = epoch, used
    iterators = [iter(each) for each in ranks]
    taken = []
    for _ in range(count):
        step = [
            item
            for it, each in zip(iterators, ranks, strict=True)
            for _ in range(each.accumulation)
            for item in next(it)
        ]
        assert len(step) == len(set(step)) == global_batch, "a step's batches overlap, or miss items"
        taken.append(set(step))
        for each in ranks:
            each.advance()
    return taken


def test_with_a_global_batch_each_step_uses_the_same_items_at_any_world_size() -> None:
    exercised = Exercised()

    @given(st.integers(1, 4), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]), st.integers(0, 6), st.data())
    def check(batch: int, world: int, world_after: int, before: int, data: st.DataObject) -> None:
        global_batch = 4 * batch * data.draw(st.integers(1, 2))
        size = data.draw(st.integers(global_batch * 2, 120))
        whole = size // global_batch
        before = min(before, whole - 1)
        uninterrupted = step_sets(size, batch, world, global_batch, 0, 0, whole)
        saved = Batches(size, batch, seed=7, world=world, global_batch=global_batch).state_dict()
        saved["used"] = before * global_batch
        resumed = Batches(size, batch, seed=7, world=world_after, global_batch=global_batch)
        state = resumed.resharded(saved)
        after = step_sets(size, batch, world_after, global_batch, state["epoch"], state["used"], whole - before)
        assert uninterrupted[:before] + after == uninterrupted, "a resumed step took other items"
        exercised.note(resized=before > 0 and world != world_after, accumulates=resumed.accumulation > 1)

    check()
    exercised.assert_shown("resized", "accumulates", share=0.2)


def test_a_global_batch_that_the_ranks_cannot_share_or_that_changed_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="global_batch 12 is not a multiple of 2 ranks x batch_size 8"):
        Batches(100, 8, world=2, global_batch=12)
    saved = Batches(100, 8, world=2, global_batch=32).state_dict()
    with pytest.raises(ValueError, match="global_batch was 32; this run's is 64"):
        Batches(100, 8, world=1, global_batch=64).resharded(saved)
