"""The shapes a request may take, each rule said for its submitter: a session's, a gang's split
into members, an elastic job's sizes. The API, the store, the simulator and the core check
these, and nothing else says them."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from gpupool.model import SessionKind

ONE_NODE_SESSIONS = (SessionKind.SHELL, SessionKind.NOTEBOOK)
"""Sessions whose terminal or server is one process, on one node."""


def session_problem(session: str | None, gpus: int, gpus_per_node: int | None, array: bool) -> str | None:
    """What is wrong with a session's shape, said for its submitter; None when it is fine."""
    if session is None:
        return None
    if session not in tuple(SessionKind):
        return f"session: {session!r} is not one of {', '.join(SessionKind)}"
    if session in ONE_NODE_SESSIONS and gpus_per_node not in (None, gpus):
        return f"gpus_per_node: a {session} session runs on one node, with all its GPUs"
    if array:
        return f"array: a {session} session is one job, not an array"
    return None


def gpus_per_node_of(session: str | None, gpus: int, gpus_per_node: int | None) -> int | None:
    """GPUs per node of a job as submitted: a shell's or a notebook's all on one node (its
    terminal or server is one process), never split as a gang; else as asked."""
    return gpus if session in ONE_NODE_SESSIONS else gpus_per_node


def gang_split_problem(gpus: int, gpus_per_node: int | None) -> str | None:
    """Why `gpus` cannot be a gang of members of `gpus_per_node` GPUs each, or None if it can
    (or has no fixed members): the one rule the API, the store and the core check."""
    if gpus_per_node is None:
        return None
    if gpus_per_node < 1:
        return f"{gpus_per_node} is not a positive number of GPUs per node"
    if gpus % gpus_per_node:
        return f"{gpus} GPUs do not split into members of {gpus_per_node}"
    return None


POWERS_OF_TWO = "pow2"
"""The step of an elastic job whose sizes double (4, 8, 16)."""


def elastic_sizes(smallest: int, largest: int, step: int | str, gpus_per_node: int | None) -> tuple[int, ...]:
    """The sizes of an elastic job from `smallest` to `largest` GPUs by `step` (GPUs added at
    each size, or `POWERS_OF_TWO`), smallest first; () for one size. `elastic_problem` says
    first why they would not be sizes."""
    if smallest == largest:
        return ()
    if step == POWERS_OF_TWO:
        sizes = [smallest]
        while sizes[-1] < largest:
            sizes.append(sizes[-1] * 2)
        return tuple(sizes)
    assert isinstance(step, int)
    return tuple(range(smallest, largest + 1, step))


def elastic_problem(smallest: int, largest: int, step: int | str, gpus_per_node: int | None) -> str | None:
    """Why `smallest` to `largest` GPUs by `step` are not an elastic job's sizes, said for its
    submitter; None when they are (or are one size). Each size of a gang splits into its members:
    the step of one is a multiple of its GPUs per node."""
    if not 1 <= smallest <= largest:
        return "the fewest GPUs must be at least 1 and at most the most"
    if step == POWERS_OF_TWO:
        doubled = smallest
        while doubled < largest:
            doubled *= 2
        if doubled != largest:
            return f"by powers of two, {largest} is not {smallest} doubled"
    elif not isinstance(step, int) or step < 1:
        return f"step {step!r}: a positive number of GPUs, or {POWERS_OF_TWO}"
    elif (largest - smallest) % step:
        return f"{largest - smallest} GPUs between them are not steps of {step}"
    for size in (smallest, largest):
        problem = gang_split_problem(size, gpus_per_node)
        if problem is not None:
            return problem
    if gpus_per_node is not None and step != POWERS_OF_TWO and isinstance(step, int) and step % gpus_per_node:
        return f"step {step}: a gang grows and shrinks by whole members of {gpus_per_node} GPUs"
    return None


def sizes_problem(gpus: int, sizes: Sequence[int], gpus_per_node: int | None, session: str | None) -> str | None:
    """Why `sizes` are not the sizes of a job that asks for `gpus`, said for its submitter; None
    when they are (or are none: a job of one size). They come smallest first, `gpus` the
    largest, each a gang's whole members; a session runs at one size."""
    if not sizes:
        return None
    if session is not None:
        return f"sizes: a {session} session runs at one size; give --gpus N"
    if len(sizes) < 2 or any(a >= b for a, b in pairwise(sizes)) or sizes[0] < 1:
        return f"sizes: {list(sizes)} are not two or more numbers of GPUs, smallest first"
    if sizes[-1] != gpus:
        return f"sizes: the largest, {sizes[-1]}, is not the job's gpus ({gpus})"
    for size in sizes:
        problem = gang_split_problem(size, gpus_per_node)
        if problem is not None:
            return f"sizes: {problem}"
    return None


def parse_sizes(text: str, step: str | None, gpus_per_node: int | None) -> tuple[int, tuple[int, ...]]:
    """`--gpus N` or `--gpus MIN-MAX` with `--resize-step N|pow2` (a gang's step defaults to its
    GPUs per node, any other job's to 1): (the GPUs it asks for in line, its sizes; () for one
    size). A ValueError says what is wrong, for the submitter."""
    low, dash, high = text.strip().partition("-")
    try:
        smallest, largest = int(low), int(high) if dash else int(low)
    except ValueError:
        raise ValueError(f"--gpus {text!r}: a number of GPUs, or the fewest and the most, as 4-16") from None
    if not dash:
        if step is not None:
            raise ValueError(f"--resize-step {step!r} goes with --gpus MIN-MAX (an elastic job)")
        return smallest, ()
    resize: int | str = gpus_per_node or 1
    if step is not None:
        try:
            resize = POWERS_OF_TWO if step == POWERS_OF_TWO else int(step)
        except ValueError:
            raise ValueError(f"--resize-step {step!r}: a number of GPUs, or {POWERS_OF_TWO}") from None
    problem = elastic_problem(smallest, largest, resize, gpus_per_node)
    if problem is not None:
        raise ValueError(f"--gpus {text}: {problem}")
    return largest, elastic_sizes(smallest, largest, resize, gpus_per_node)
