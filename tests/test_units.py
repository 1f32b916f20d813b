"""Durations and counts as people write and read them."""

from __future__ import annotations

import pytest

from gpupool.units import parse_time_limit, plural


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90 * 60),  # Slurm: a bare number is minutes
        ("90:30", 90 * 60 + 30),
        ("2:00:00", 7200),
        ("1-12", 86400 + 12 * 3600),
        ("1-12:30", 86400 + 12 * 3600 + 30 * 60),
        ("1-12:30:15", 86400 + 12 * 3600 + 30 * 60 + 15),
        ("2h", 7200),
        ("90s", 90),
        ("1.5d", 1.5 * 86400),
    ],
)
def test_time_limits_in_slurms_forms_and_gpupools(text: str, seconds: float) -> None:
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "two hours", "1-", "1:2:3:4", "-5"])
def test_a_bad_time_limit_says_which_forms_work(text: str) -> None:
    with pytest.raises(ValueError, match="time limit"):
        parse_time_limit(text)


def test_counts_agree_with_their_noun() -> None:
    assert (plural(1, "GPU"), plural(2, "GPU"), plural(0, "node"), plural(1000, "job")) == (
        "1 GPU",
        "2 GPUs",
        "0 nodes",
        "1,000 jobs",
    )
