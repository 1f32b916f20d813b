"""Priorities for traces that record none: a fixed mix of classes, drawn per job from a hash of its id."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Sequence

MIX_TOLERANCE = 1e-6


def parse_priority_mix(text: str, known: Collection[str]) -> tuple[tuple[str, float], ...]:
    """Parse `"urgent=0.02,high=0.08,normal=0.5,low=0.4"` into ((class, fraction), ...), in text order.

    Each class must be in `known` and appear once; fractions must be finite, ≥ 0 and sum to 1
    (within 1e-6). Raises ValueError saying which part is wrong.
    """
    if not text.strip():
        raise ValueError("priority mix is empty: expected e.g. 'high=0.2,low=0.8'")
    mix: list[tuple[str, float]] = []
    for raw in text.split(","):
        part = raw.strip()
        name, sep, value = (piece.strip() for piece in part.partition("="))
        if not sep or not name:
            raise ValueError(f"priority mix {part!r}: expected class=fraction")
        if name not in known:
            raise ValueError(f"priority mix {part!r}: unknown class {name!r} (known: {', '.join(known)})")
        if any(name == seen for seen, _ in mix):
            raise ValueError(f"priority mix {part!r}: class {name!r} is given twice")
        try:
            fraction = float(value)
        except ValueError:
            raise ValueError(f"priority mix {part!r}: {value!r} is not a number") from None
        if not (math.isfinite(fraction) and fraction >= 0):
            raise ValueError(f"priority mix {part!r}: {value!r} is not a finite fraction ≥ 0")
        mix.append((name, fraction))
    total = math.fsum(fraction for _, fraction in mix)
    if abs(total - 1) > MIX_TOLERANCE:
        raise ValueError(f"priority mix {text!r}: fractions sum to {total:.10g}, not 1")
    return tuple(mix)


def assign_priority(job_id: str, mix: Sequence[tuple[str, float]]) -> str:
    """The class of `job_id` under `mix`: the same in every process and Python version.

    u = big-endian blake2b-64(job_id) / 2**64 in [0, 1); the answer is the first class whose
    cumulative fraction exceeds u. Classes with fraction 0 are never chosen. Raises ValueError if
    no class has a positive fraction.
    """
    digest = hashlib.blake2b(job_id.encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2**64
    cumulative = 0.0
    last: str | None = None
    for name, fraction in mix:
        if fraction <= 0:
            continue
        cumulative += fraction
        last = name
        if u < cumulative:
            return name
    if last is None:
        raise ValueError("priority mix has no class with a fraction above 0")
    # Fractions summing to 1 - ε, or u rounded up to 1.0, leave a sliver past the end: the last class gets it.
    return last


def parse_priority_map(text: str, known: Collection[str]) -> dict[str, str]:
    """Parse `"LS=high,Burstable=normal,BE=low"` into {trace value: class}, in text order.

    Each trace value appears once and each class must be in `known`. Raises ValueError saying
    which part is wrong.
    """
    mapping: dict[str, str] = {}
    for raw in text.split(","):
        part = raw.strip()
        value, sep, name = (piece.strip() for piece in part.partition("="))
        if not sep or not value or not name:
            raise ValueError(f"priority map {part!r}: expected trace value=class")
        if name not in known:
            raise ValueError(f"priority map {part!r}: unknown class {name!r} (known: {', '.join(known)})")
        if value in mapping:
            raise ValueError(f"priority map {part!r}: {value!r} is given twice")
        mapping[value] = name
    return mapping
