"""Slurm's notations, read as gpupool means them: job arrays, dependencies, batch directives.

Pure functions: the API reads arrays and dependencies with them, the command line reads batch
scripts; each raises `ValueError` with what is wrong, for the caller to say where.
"""

from __future__ import annotations

import re
import shlex

MAX_ARRAY = 10_000
"""Tasks one array may have (Slurm's MaxArraySize defaults to 1001)."""
MAX_ID = 2**31 - 1
"""The largest job id or array index the store keeps (a 32-bit integer)."""


def _number(text: str, whole: str, what: str) -> int:
    value = int(text)
    if value > MAX_ID:
        raise ValueError(f"{whole!r}: {what} {value} is more than {MAX_ID:,}")
    return value


_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def parse_array(text: str) -> tuple[list[int], int | None]:
    """`0-99%8` → indexes 0..99, at most 8 at once; also `1,3,5-9`, `0-20:5` (step 5)."""
    body, _, limit_text = text.strip().partition("%")
    limit: int | None = None
    if limit_text:
        if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_ARRAY:
            raise ValueError(f"{text!r}: the limit after % must be a number from 1 to {MAX_ARRAY:,}")
        limit = int(limit_text)
    indexes: set[int] = set()
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            raise ValueError(f"{text!r}: use indexes and ranges like 0-99, 1,3,5-9, 0-20:5, with %N to limit")
        first = _number(match.group(1), text, "index")
        last = _number(match.group(2), text, "index") if match.group(2) is not None else first
        step = int(match.group(3)) if match.group(3) is not None else 1
        if last < first or step < 1:
            raise ValueError(f"{text!r}: {part.strip()!r} is an empty range")
        if (last - first) // step + 1 + len(indexes) > MAX_ARRAY:
            raise ValueError(f"{text!r}: more than {MAX_ARRAY:,} tasks")
        indexes.update(range(first, last + 1, step))
    return sorted(indexes), limit


DEPENDENCY_KINDS = {
    "ok": "ok",
    "afterok": "ok",
    "notok": "notok",
    "afternotok": "notok",
    "any": "any",
    "afterany": "any",
}


def parse_after(text: str) -> list[tuple[str, int]]:
    """`12`, `12,13`, `ok:12:13`, `any:12`, `notok:12` (Slurm's afterok/afterany/afternotok
    too, and several separated by commas): (kind, job id) pairs. A bare id means `ok`."""
    pairs: list[tuple[str, int]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        kind = "ok"
        words = part.split(":")
        if not words[0].isdigit():
            named = DEPENDENCY_KINDS.get(words[0].lower())
            if named is None:
                raise ValueError(f"{text!r}: {words[0]!r} is not a dependency kind (ok, notok, any)")
            kind, words = named, words[1:]
        if not words or not all(w.isdigit() for w in words):
            raise ValueError(f"{text!r}: give job ids, like ok:12 or 12,13")
        pairs.extend((kind, _number(w, text, "job id")) for w in words)
    if not pairs:
        raise ValueError(f"{text!r}: give at least one job id")
    return pairs


DIRECTIVE = "#GPUPOOL"


def directives(script: str) -> list[str]:
    """The options of the `#GPUPOOL` lines at the top of a batch script (as `#SBATCH`): they
    are read up to the first line that is neither a comment nor blank."""
    options: list[str] = []
    for number, line in enumerate(script.splitlines(), start=1):
        stripped = line.strip()
        if number == 1 and stripped.startswith("#!"):
            continue
        if stripped.startswith(DIRECTIVE) and (len(stripped) == len(DIRECTIVE) or stripped[len(DIRECTIVE)].isspace()):
            try:
                options.extend(shlex.split(stripped[len(DIRECTIVE) :], comments=True))
            except ValueError as exc:
                raise ValueError(f"line {number}: {exc}") from None
        elif stripped and not stripped.startswith("#"):
            break
    return options


STATE_NAMES = {
    "pending": "pending",
    "pd": "pending",
    "starting": "starting",
    "configuring": "starting",
    "cf": "starting",
    "running": "running",
    "r": "running",
    "preempting": "preempting",
    "preempted": "preempting",
    "pr": "preempting",
    "succeeded": "succeeded",
    "completed": "succeeded",
    "cd": "succeeded",
    "failed": "failed",
    "f": "failed",
    "cancelled": "cancelled",
    "ca": "cancelled",
    "timeout": "timeout",
    "to": "timeout",
}
"""gpupool's job states by their own names and by Slurm's names and short codes (squeue's
`--states`): PENDING/PD, CONFIGURING/CF (starting), RUNNING/R, PREEMPTED/PR (preempting: given
notice, leaving), COMPLETED/CD (succeeded), FAILED/F, CANCELLED/CA, TIMEOUT/TO."""


def parse_states(text: str) -> list[str]:
    """`pd,R` → ["pending", "running"]: comma-separated states, any case, by gpupool's names or
    Slurm's (`STATE_NAMES`); `all` is every state."""
    names = [part.strip().lower() for part in text.split(",")]
    if names == ["all"]:
        return list(dict.fromkeys(STATE_NAMES.values()))
    states: list[str] = []
    for name in names:
        if name not in STATE_NAMES:
            ours = ", ".join(dict.fromkeys(STATE_NAMES.values()))
            raise ValueError(f"{name!r} is not a job state: give {ours}, or Slurm's (PD, R, CD, F, CA, TO...)")
        if STATE_NAMES[name] not in states:
            states.append(STATE_NAMES[name])
    return states
