"""What a submission is checked against before it is written: the pool (a job that could never
fit), this machine's paths (folders, the data directory, what the system refuses), and the
Slurm-style fields it parses."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from gpupool.api import limits
from gpupool.api.models import JobIn
from gpupool.errors import InvalidInput
from gpupool.model import Job, Node
from gpupool.policy import can_ever_fit, messages
from gpupool.service.workspace import expand_log_path, inside
from gpupool.shapes import gang_split_problem
from gpupool.store.jobs import job_name

T = TypeVar("T")

KEY_TEXT = re.compile(r"[\x20-\x7e]{1,200}")
"""An Idempotency-Key: 1 to 200 printable ASCII characters."""


def check_key(key: str | None) -> None:
    if key is not None and not KEY_TEXT.fullmatch(key):
        raise InvalidInput("Idempotency-Key: give 1 to 200 printable ASCII characters")


def parsed(field: str, parse: Callable[[str], T], text: str | None) -> T | None:
    """`parse(text)`, its error named after the field; None when the field was not given."""
    if not text:
        return None
    try:
        return parse(text)
    except ValueError as exc:
        raise InvalidInput(f"{field}: {exc}") from None


def check_fits(nodes: list[Node], body: JobIn, team: str, priority: str) -> None:
    """Refuse a job that no placement of this pool could ever hold."""
    problem = gang_split_problem(body.gpus, body.gpus_per_node)
    if problem is not None:
        raise InvalidInput(f"gpus_per_node: {problem}")
    probe = Job("new", team, priority, body.gpus, 0.0, body.gpus_per_node, body.gpu_type, sizes=tuple(body.sizes or ()))
    if not can_ever_fit(probe, nodes):
        raise InvalidInput(f"gpus: {messages.never_fits(probe, nodes)}")


def check_paths(body: JobIn, data_dir: Path) -> None:
    """Refuse a working directory that is not one, and log paths that could never be written
    or that lie in the scheduler's data directory (its store, tokens and other jobs' folders)."""
    workdir = Path(body.workdir)
    try:
        if not workdir.is_dir():
            raise InvalidInput(f"workdir: {body.workdir!r} is not a directory on this machine")
        if inside(workdir, data_dir):
            raise InvalidInput(f"workdir: {body.workdir!r} is in the scheduler's data directory")
    except OSError as exc:
        raise InvalidInput(f"workdir: {body.workdir!r}: {exc.strerror}") from None
    except RuntimeError as exc:  # a loop of links (Python before 3.13)
        raise InvalidInput(f"workdir: {body.workdir!r}: {exc}") from None
    name = job_name(body.name, body.command)
    for field, template in (("output", body.output), ("error", body.error)):
        if template is None:
            continue
        problem = limits.path_problem(str(workdir / limits.widest(template, name)))
        if problem:
            raise InvalidInput(
                f"{field}: {template[:50]!r} in {body.workdir[:50]!r} {problem} (patterns at their longest)"
            )
        path = workdir / expand_log_path(template, 1, 0, name, 1, 0)
        try:
            if path.is_dir():
                raise InvalidInput(f"{field}: {template!r} is a folder; give a file name (with %j for the job)")
            if inside(path, data_dir):
                raise InvalidInput(f"{field}: {template!r} is in the scheduler's data directory")
        except OSError as exc:
            raise InvalidInput(f"{field}: {template!r}: {exc.strerror}") from None
        except RuntimeError as exc:
            raise InvalidInput(f"{field}: {template!r}: {exc}") from None
