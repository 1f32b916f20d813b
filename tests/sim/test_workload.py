from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpupool.sim.trace import load_trace
from gpupool.sim.workload import assign_priority, parse_priority_mix

KNOWN = ("urgent", "high", "normal", "low")
MIX = (("urgent", 0.02), ("high", 0.08), ("normal", 0.5), ("low", 0.4))


def test_a_mix_parses_into_classes_and_fractions_in_text_order() -> None:
    assert parse_priority_mix("urgent=0.02,high=0.08,normal=0.5,low=0.4", KNOWN) == MIX
    assert parse_priority_mix(" low = 0.25 , high=0.75 ", KNOWN) == (("low", 0.25), ("high", 0.75))
    assert parse_priority_mix("normal=1", KNOWN) == (("normal", 1.0),)


def test_a_mix_may_give_a_class_zero_and_may_be_off_by_less_than_a_millionth() -> None:
    assert parse_priority_mix("urgent=0,low=1", KNOWN) == (("urgent", 0.0), ("low", 1.0))
    assert parse_priority_mix("high=0.3333333,low=0.6666666", KNOWN)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "priority mix is empty: expected e.g. 'high=0.2,low=0.8'"),
        ("high=x", "priority mix 'high=x': 'x' is not a number"),
        ("high=", "priority mix 'high=': '' is not a number"),
        ("high", "priority mix 'high': expected class=fraction"),
        ("=0.5,low=0.5", "priority mix '=0.5': expected class=fraction"),
        ("high=0.5,,low=0.5", "priority mix '': expected class=fraction"),
        ("top=1", "priority mix 'top=1': unknown class 'top' (known: urgent, high, normal, low)"),
        ("low=0.5,low=0.5", "priority mix 'low=0.5': class 'low' is given twice"),
        ("low=-0.5,high=1.5", "priority mix 'low=-0.5': '-0.5' is not a finite fraction ≥ 0"),
        ("low=nan,high=1", "priority mix 'low=nan': 'nan' is not a finite fraction ≥ 0"),
        ("low=inf", "priority mix 'low=inf': 'inf' is not a finite fraction ≥ 0"),
        ("low=0.5,high=0.4", "priority mix 'low=0.5,high=0.4': fractions sum to 0.9, not 1"),
        ("low=0.5,high=0.500002", "priority mix 'low=0.5,high=0.500002': fractions sum to 1.000002, not 1"),
    ],
)
def test_a_bad_mix_says_which_part_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"^priority mix") as caught:
        parse_priority_mix(text, KNOWN)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("job_id", "expected"),
    [
        ("philly-000003", "urgent"),  # u = 0.0179
        ("philly-000019", "high"),  # u = 0.0279
        ("philly-000000", "normal"),  # u = 0.5985
        ("philly-000001", "low"),  # u = 0.7406
    ],
)
def test_priorities_are_the_same_in_every_process(job_id: str, expected: str) -> None:
    assert assign_priority(job_id, MIX) == expected


def test_a_class_with_fraction_zero_is_never_chosen() -> None:
    mix = (("urgent", 0.0), ("low", 1.0), ("high", 0.0))
    assert {assign_priority(f"job-{i}", mix) for i in range(2000)} == {"low"}


def test_a_job_past_the_last_cumulative_fraction_gets_the_last_class_with_a_share() -> None:
    short = (("high", 0.25), ("low", 0.25), ("normal", 0.0))
    chosen = {assign_priority(f"job-{i}", short) for i in range(200)}
    assert chosen == {"high", "low"}


@pytest.mark.parametrize("mix", [(), (("low", 0.0),)])
def test_a_mix_with_no_positive_fraction_is_refused(mix: tuple[tuple[str, float], ...]) -> None:
    with pytest.raises(ValueError, match="no class with a fraction above 0"):
        assign_priority("job", mix)


def test_the_mix_over_philly_lands_within_half_a_point_of_what_was_asked(traces_dir: Path) -> None:
    ids = [job.job_id for job in load_trace(traces_dir / "philly" / "jobs.csv").jobs]
    assert len(ids) == 82_247
    counts = Counter(assign_priority(job_id, MIX) for job_id in ids)
    for name, fraction in MIX:
        assert abs(counts[name] / len(ids) - fraction) < 0.005, name
