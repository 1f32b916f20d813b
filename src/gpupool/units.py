"""Durations and memory for people and from people: `human_seconds(5400) == "1.5 h"`,
`parse_duration("30m") == 1800`, `parse_memory("16G") == 17179869184`.

Pure and dependency-free, so the scheduling core may use it for its messages.
"""

from __future__ import annotations

import math
import re

NONE = "—"
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$")


def parse_duration(value: object) -> float:
    """Seconds from a number or a string like `90s`, `30m`, `1.5h`, `7d`."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if match is None:
            raise ValueError(f"{value!r} is not a duration (use seconds or 90s, 30m, 1.5h, 7d)")
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"{value!r} is not a duration ≥ 0")
    return seconds


_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_time_limit(value: str) -> float:
    """Seconds from a time limit in Slurm's forms (`90` is minutes, `90:30` minutes and seconds,
    `2:00:00`, `1-12`, `1-12:30`, `1-12:30:00`) or gpupool's (`90s`, `2h`, `1.5d`)."""
    text = value.strip()
    match = _SLURM_TIME.match(text)
    if match is None:
        try:
            seconds = parse_duration(text)
        except ValueError:
            raise ValueError(
                f"{value!r} is not a time limit (use minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]], or 90s, 2h, 1d)"
            ) from None
    else:
        days, first, second, third = match.groups()
        numbers = [int(n) for n in (first, second, third) if n is not None]
        if days is not None:  # D-H, D-H:M, D-H:M:S
            hours, minutes, secs = [*numbers, 0, 0][:3]
            seconds = int(days) * 86400.0 + hours * 3600.0 + minutes * 60.0 + secs
        elif len(numbers) == 1:  # M
            seconds = numbers[0] * 60.0
        elif len(numbers) == 2:  # M:S
            seconds = numbers[0] * 60.0 + numbers[1]
        else:  # H:M:S
            seconds = numbers[0] * 3600.0 + numbers[1] * 60.0 + numbers[2]
    if seconds <= 0:
        raise ValueError(f"{value!r}: a time limit must be more than 0")
    return seconds


_MEMORY = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_MEMORY_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
MIN_MEMORY = 16 * 2**20
"""The least memory a job may ask: a shell and a small program (less would fail at once)."""
MAX_MEMORY = 2**50
"""A petabyte: more than any node has, and within the store's 64-bit columns."""


def parse_memory(value: object) -> int:
    """Bytes from memory as Slurm takes it (`--mem`): a number of megabytes, or a number with
    K, M, G or T (powers of 1024, as in Slurm): `4096`, `16G`, `1.5T`, `512M`."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not an amount of memory")
    match = _MEMORY.match(str(value))
    if match is None:
        raise ValueError(f"{value!r} is not an amount of memory (use megabytes, or 512M, 16G, 1.5T)")
    amount = float(match.group(1)) * _MEMORY_UNITS[(match.group(2) or "M").upper()]
    if amount < MIN_MEMORY:
        raise ValueError(f"{value!r}: at least 16M of memory")
    if amount > MAX_MEMORY:
        raise ValueError(f"{value!r} is more than 1024T")
    return int(amount)


def human_bytes(amount: float) -> str:
    """Memory for people, in powers of 1024 as Slurm prints it: "512 M", "15.6 G", "1.2 T"."""
    for unit, size in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if amount >= size:
            value = amount / size
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{amount:.0f} B"


def brief_seconds(seconds: float) -> str:
    """`human_seconds` with three significant digits under a minute: "0.342 s", "12.3 s"."""
    if 0 <= seconds < 0.001:
        return "0 s"
    if seconds < 59.95:
        return f"{seconds:.3g} s"
    return human_seconds(seconds)


def human_seconds(seconds: float) -> str:
    """A duration in the largest unit that keeps it readable: "42 s", "3.5 min", "2.1 h", "1.3 d"."""
    if math.isnan(seconds):
        return NONE
    if seconds < 0:
        return "-" + human_seconds(-seconds)
    if math.isinf(seconds):
        return "∞"
    if round(seconds) < 60:
        return f"{round(seconds)} s"
    # Units are picked on the rounded value so that 3599 s reads "1.0 h", never "60.0 min".
    for unit, size, limit in (("min", 60.0, 60.0), ("h", 3600.0, 24.0)):
        if round(seconds / size, 1) < limit:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds / 86400:.1f} d"


def gpu_time(gpu_seconds: float) -> str:
    """GPU time for people: "0.6 GPU·s", "42 GPU·s", "3.5 GPU·min", "2.1 GPU·h"."""
    if not math.isnan(gpu_seconds) and 0 <= gpu_seconds < 10:
        return f"{gpu_seconds:.1f} GPU·s"
    amount, _, unit = human_seconds(gpu_seconds).partition(" ")
    return f"{amount} GPU·{unit}" if unit else amount


def plural(count: int, word: str) -> str:
    """`1 GPU`, `2 GPUs`, `1 node`, `0 nodes`."""
    return f"{count:,} {word}" if count == 1 else f"{count:,} {word}s"


def clock_time(seconds: float) -> str:
    """A duration as Slurm prints one, the same form for a whole column: `0:05`, `12:34`,
    `1:02:03`, `3-04:05:06` (days-hours:minutes:seconds)."""
    if math.isnan(seconds) or math.isinf(seconds):
        return NONE
    total = max(0, round(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


GPU_UNITS = (("GPU·h", 3600.0), ("GPU·min", 60.0), ("GPU·s", 1.0))


def gpu_unit(largest: float) -> tuple[str, float]:
    """One unit of GPU time for a whole table, chosen by its largest value: (name, seconds)."""
    for name, size in GPU_UNITS:
        if largest >= 10 * size:
            return name, size
    return GPU_UNITS[-1]
