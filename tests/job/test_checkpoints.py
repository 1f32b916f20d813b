"""Atomic commit and resume on disk: what a crash or a damaged file leaves, and what resume picks."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.job import Checkpoint, CheckpointDir, CheckpointError


def save(checkpoints: CheckpointDir, step: int) -> Checkpoint:
    def write(folder: Path) -> None:
        (folder / "state.txt").write_text(f"state at {step}")
        (folder / "rank-0").mkdir()
        (folder / "rank-0" / "rng.txt").write_text(f"rng at {step}")

    return checkpoints.save(step, write)


def read(checkpoint: Checkpoint) -> str:
    return (checkpoint.path / "state.txt").read_text()


def test_a_commit_is_whole_with_its_manifest_latest_and_pruned_predecessors(tmp_path: Path) -> None:
    checkpoints = CheckpointDir(tmp_path, keep=2)
    for step in (10, 20, 30):
        save(checkpoints, step)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "step-000000020", "step-000000030"]
    assert (tmp_path / "LATEST").read_text().strip() == "step-000000030"
    newest = checkpoints.committed()[0]
    assert newest.step == 30
    assert set(newest.manifest["files"]) == {"state.txt", "rank-0/rng.txt"}
    found = checkpoints.restore(read)
    assert found is not None
    restored, value = found
    assert (restored.checkpoint.step, restored.skipped, value) == (30, (), "state at 30")


def test_no_checkpoint_means_a_fresh_start(tmp_path: Path) -> None:
    assert CheckpointDir(tmp_path).restore(read) is None


def test_a_torn_save_is_never_read_and_a_later_attempt_clears_it(tmp_path: Path) -> None:
    first = CheckpointDir(tmp_path, attempt=0)
    save(first, 10)
    torn = first.begin(20)
    (torn / "state.txt").write_text("half")
    second = CheckpointDir(tmp_path, attempt=1)
    found = second.restore(read)
    assert found is not None
    assert found[1] == "state at 10"
    save(second, 15)
    assert not torn.exists()


def test_a_damaged_newest_checkpoint_falls_back_to_the_older_one_and_says_which(tmp_path: Path) -> None:
    checkpoints = CheckpointDir(tmp_path, keep=1, attempt=0)
    save(checkpoints, 10)
    checkpoints.keep = 2
    save(checkpoints, 20)
    (tmp_path / "step-000000020" / "rank-0" / "rng.txt").write_text("bit rot")
    resumed = CheckpointDir(tmp_path, keep=1, attempt=1)
    found = resumed.restore(read)
    assert found is not None
    restored, value = found
    assert (restored.checkpoint.step, value) == (10, "state at 10")
    assert restored.skipped == (
        f"step-000000020: {tmp_path}/step-000000020/rank-0/rng.txt is damaged (its size differs from the manifest)",
    )
    # Set aside: the next save (keep=1) keeps itself, not the damaged newer one.
    save(resumed, 11)
    assert [c.step for c in resumed.committed()] == [11]


def test_a_flipped_bit_is_caught_by_the_digests_taken_after_the_commit(tmp_path: Path) -> None:
    checkpoints = CheckpointDir(tmp_path)
    save(checkpoints, 10)
    save(checkpoints, 20)
    checkpoints.wait_for_digests()
    assert (tmp_path / "step-000000020" / "DIGESTS.json").exists()
    state = tmp_path / "step-000000020" / "state.txt"
    state.write_text("state at 2O")  # same size, one character off
    found = CheckpointDir(tmp_path, attempt=1).restore(read)
    assert found is not None
    assert found[0].checkpoint.step == 10
    assert "its SHA-256 differs from the one taken at commit" in found[0].skipped[0]


def test_checkpoints_that_all_fail_to_load_raise_instead_of_starting_over(tmp_path: Path) -> None:
    checkpoints = CheckpointDir(tmp_path)
    save(checkpoints, 10)
    (tmp_path / "step-000000010" / "state.txt").unlink()
    with pytest.raises(CheckpointError, match=r"1 checkpoint\(s\) .* none loads; refusing to start over"):
        checkpoints.restore(read)


def test_saving_a_step_again_keeps_the_whole_copy_and_replaces_a_damaged_one(tmp_path: Path) -> None:
    checkpoints = CheckpointDir(tmp_path)
    first = save(checkpoints, 5)
    again = save(checkpoints, 5)
    assert again.path == first.path
    assert not list(tmp_path.glob("*.tmp-*"))
    (first.path / "state.txt").write_text("torn")
    replaced = save(checkpoints, 5)
    assert read(replaced) == "state at 5"
    assert [c.step for c in checkpoints.committed()] == [5]
