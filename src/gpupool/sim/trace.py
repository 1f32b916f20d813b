"""Load a job trace in the normalised `jobs.csv` format (see shared/data/traces/README.md).

Required columns: `job_id, submit_time, num_gpus, duration, vc`. Others are optional:
`submit_datetime` (for a window), `status` (a `Failed` job fails at the end of its run time),
`gpu_type`/`gpu_spec`, `gpu_milli`, `gpus_per_node` (a gang's equal members), `save_cost` and
`restart_cost` (seconds the job was seen to pay, as `gpupool export` writes them), and the
column priorities are taken from.
A `.gz` suffix means the file is gzip-compressed.
"""

from __future__ import annotations

import csv
import gzip
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TextIO

from gpupool.shapes import gang_split_problem

REQUIRED_COLUMNS: tuple[str, ...] = ("job_id", "submit_time", "num_gpus", "duration", "vc")
DEFAULT_TEAM = "default"
DATETIME_FORMAT = "YYYY-MM-DD HH:MM:SS"
FAILED_STATUSES = frozenset({"failed"})
"""`status` values (case aside) of a job that ended by failing: Philly's and alibaba-openb-2023's
`Failed`, Slurm's `FAILED`. Killed and cancelled jobs ended as their users chose: they replay
as jobs that finish."""


class TraceError(ValueError):
    """A trace file that cannot be read, with the file, line (1-based; header = 1) and column at fault."""

    def __init__(self, path: Path, detail: str, *, line: int | None = None, column: str | None = None) -> None:
        where = str(path)
        if line is not None:
            where += f" line {line}"
            if column is not None:
                where += f", column {column}"
        super().__init__(f"{where}: {detail}")
        self.path = path
        self.line = line
        self.column = column


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    submit_time: float
    """Seconds, as in the file (not rebased)."""
    gpus: int
    duration: float
    """Seconds of run time as recorded by the trace."""
    team: str
    """The trace's `vc`, or `"default"` where it is empty."""
    submit_datetime: datetime | None
    gpu_type: str | None = None
    """The one GPU type it must run on (`gpu_type`, or `gpu_spec` as in alibaba-openb-2023);
    None takes any."""
    label: str | None = None
    """Its value in the column `load_trace(priority_from=…)` named, to map to a class."""
    failed: bool = False
    """Its `status` says it failed (`FAILED_STATUSES`): it ran `duration` and then failed."""
    gpus_per_node: int | None = None
    save_cost: float | None = None
    restart_cost: float | None = None
    """Seconds its saves blocked and its resumed attempts took to start, as observed."""


@dataclass(frozen=True, slots=True)
class Trace:
    path: Path
    jobs: tuple[TraceJob, ...]
    """Sorted by submit time; ties keep file order."""
    zero_gpu_jobs: int
    """Rows asking for 0 GPUs (CPU-only pods), skipped."""
    outside_window: int
    """Rows with GPUs whose submit_datetime falls outside the asked window, skipped."""
    no_duration: int = 0
    """Rows with an empty duration (never scheduled, as in alibaba-openb-2023), skipped."""
    fractional: int = 0
    """Jobs asking for a fraction of a GPU (`gpu_milli` < 1000), rounded up to whole GPUs."""
    failed: int = 0
    """Jobs whose `status` says they failed."""


def open_text(path: Path) -> TextIO:
    """Open `path` as UTF-8 text for csv (gzip when it ends in `.gz`); OS errors become TraceError."""
    try:
        if path.suffix == ".gz":
            return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
        return path.open(encoding="utf-8-sig", newline="")
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, "is a directory, not a file") from None
    except OSError as exc:
        raise TraceError(path, f"cannot open: {exc.strerror or exc}") from None


def read_rows(path: Path, stream: TextIO, required: Sequence[str]) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
    """Read the header, check that each `required` column is there, and return it with the rows.

    Rows come as (line, fields), blank lines skipped; a row whose field count differs from the
    header's, undecodable bytes and malformed csv raise TraceError with their line.
    """
    reader = csv.reader(stream)
    try:
        header = next(reader, None)
    except (csv.Error, UnicodeDecodeError, EOFError, OSError) as exc:
        raise TraceError(path, f"unreadable: {exc}", line=1) from None
    if not header:
        raise TraceError(path, "empty file, no header", line=1)
    header = [name.strip() for name in header]
    duplicated = sorted({name for name in header if header.count(name) > 1})
    if duplicated:
        raise TraceError(path, f"duplicate column(s) {', '.join(duplicated)}", line=1)
    missing = [name for name in required if name not in header]
    if missing:
        raise TraceError(path, f"missing column(s) {', '.join(missing)}")

    def rows() -> Iterator[tuple[int, list[str]]]:
        width = len(header)
        try:
            for row in reader:
                if len(row) != width:
                    if not row:
                        continue
                    raise TraceError(path, f"{len(row)} field(s), the header has {width}", line=reader.line_num)
                # line_num counts physical lines, so quoted newlines and blank lines do not shift it.
                yield reader.line_num, row
        except csv.Error as exc:
            raise TraceError(path, f"malformed csv: {exc}", line=reader.line_num) from None
        except (UnicodeDecodeError, EOFError, OSError) as exc:
            # Text is decoded in chunks, so the failing line is not known, only the last good one.
            raise TraceError(path, f"unreadable after line {reader.line_num}: {exc}") from None

    return header, rows()


def _parse_datetime(text: str) -> datetime | None:
    """`YYYY-MM-DD HH:MM:SS` → naive datetime, or None if `text` is not exactly that shape."""
    # fromisoformat is ~50x faster than strptime but accepts more shapes: pin the shape first.
    if (
        len(text) != 19
        or text[4] != "-"
        or text[7] != "-"
        or text[10] != " "
        or text[13] != ":"
        or text[16] != ":"
        or not (text[:4] + text[5:7] + text[8:10] + text[11:13] + text[14:16] + text[17:]).isdigit()
    ):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _shape_and_costs(
    path: Path, line: int, row: list[str], columns: Mapping[str, int], gpus: int
) -> tuple[int | None, tuple[float | None, float | None]]:
    """A row's `gpus_per_node`, `save_cost` and `restart_cost`, each None where empty or absent."""
    shape = None
    if "gpus_per_node" in columns and (text := row[columns["gpus_per_node"]].strip()):
        try:
            shape = int(text)
        except ValueError:
            shape = 0
        problem = gang_split_problem(gpus, shape) if shape >= 1 else "not a positive integer"
        if problem is not None:
            raise TraceError(path, f"{text!r}: {problem}", line=line, column="gpus_per_node")
    costs: list[float | None] = []
    for name in ("save_cost", "restart_cost"):
        text = row[columns[name]].strip() if name in columns else ""
        costs.append(_number(path, line, text, name, "is not a number of seconds ≥ 0") if text else None)
    return shape, (costs[0], costs[1])


def load_trace(
    path: Path,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
    priority_from: str | None = None,
    team_from: str | None = None,
) -> Trace:
    """Read and validate a normalised trace; keep the jobs with GPUs submitted in [start, end).

    Every row is validated, also rows that are then skipped. A window (`start` and/or `end`, naive
    datetimes) needs a `submit_datetime` column with a value on every row. `priority_from` names a
    column every job must have a value in (its `label`); `team_from` one that gives each job's
    team instead of `vc` (to partition by it). A `gpu_type` or `gpu_spec` column gives
    the GPU type a job needs (one; empty for any), and a `gpu_milli` below 1000 a fractional GPU,
    rounded up and counted; a `status` in `FAILED_STATUSES` marks a job that failed. Raises
    TraceError naming the file, line and column of the first problem, ValueError for a bad
    window.
    """
    for bound in (start, end):
        if bound is not None and bound.tzinfo is not None:
            raise ValueError(f"window bound {bound.isoformat()} must be naive, like the trace's datetimes")
    if start is not None and end is not None and start >= end:
        raise ValueError(f"empty window: start {start} is not before end {end}")
    jobs: list[TraceJob] = []
    with open_text(path) as stream:
        header, rows = read_rows(path, stream, REQUIRED_COLUMNS)
        reading = _Reading(path, _Columns.of(path, header, priority_from, team_from), start, end)
        if reading.windowed and reading.columns.submitted is None:
            raise TraceError(path, "a window was asked but the trace has no submit_datetime column")
        for line, row in rows:
            job = reading.job(line, row)
            if job is not None:
                jobs.append(job)
    jobs.sort(key=lambda job: job.submit_time)
    return Trace(
        path=path,
        jobs=tuple(jobs),
        zero_gpu_jobs=reading.zero_gpu,
        outside_window=reading.outside,
        no_duration=reading.unrecorded,
        fractional=reading.fractional,
        failed=sum(job.failed for job in jobs),
    )


@dataclass(frozen=True, slots=True)
class _Columns:
    """Where each field is in a trace's rows (None: the trace has no such column)."""

    id: int
    submit: int
    gpus: int
    duration: int
    team: int
    team_from: str | None
    submitted: int | None
    gpu_type: int | None
    gpu_type_name: str | None
    milli: int | None
    status: int | None
    label: int | None
    label_name: str | None
    optional: dict[str, int]

    @classmethod
    def of(cls, path: Path, header: list[str], priority_from: str | None, team_from: str | None) -> _Columns:
        """The columns of `header`; a TraceError names a column `priority_from` or `team_from`
        asks for that is not there."""
        i_id, i_submit, i_gpus, i_duration, i_vc = (header.index(name) for name in REQUIRED_COLUMNS)
        type_column = next((name for name in ("gpu_type", "gpu_spec") if name in header), None)
        if priority_from is not None and priority_from not in header:
            raise TraceError(
                path, f"no column {priority_from!r} to take priorities from (columns: {', '.join(header)})"
            )
        if team_from is not None and team_from not in header:
            raise TraceError(path, f"no column {team_from!r} to take teams from (columns: {', '.join(header)})")

        def at(name: str | None) -> int | None:
            return header.index(name) if name is not None and name in header else None

        return cls(
            i_id,
            i_submit,
            i_gpus,
            i_duration,
            header.index(team_from) if team_from is not None else i_vc,
            team_from,
            at("submit_datetime"),
            at(type_column),
            type_column,
            at("gpu_milli"),
            at("status"),
            at(priority_from),
            priority_from,
            {name: header.index(name) for name in ("gpus_per_node", "save_cost", "restart_cost") if name in header},
        )


@dataclass(slots=True)
class _Reading:
    """One trace's rows read in order: the ids seen, and the rows skipped or rounded so far."""

    path: Path
    columns: _Columns
    start: datetime | None
    end: datetime | None
    first_line: dict[str, int] = field(default_factory=dict)
    zero_gpu: int = 0
    outside: int = 0
    unrecorded: int = 0
    fractional: int = 0

    @property
    def windowed(self) -> bool:
        return self.start is not None or self.end is not None

    def job(self, line: int, row: list[str]) -> TraceJob | None:
        """The job of a row, validated whole first; None for a row skipped (and counted)."""
        path, columns = self.path, self.columns
        job_id = self._job_id(line, row)
        submit_time = _number(path, line, row[columns.submit], "submit_time", "is not a number ≥ 0")
        gpus = _gpus(path, line, row[columns.gpus])
        # Checked before any skip: every row is validated.
        shape, costs = _shape_and_costs(path, line, row, columns.optional, gpus)
        text = row[columns.duration]
        if not text.strip():
            self.unrecorded += 1
            return None
        duration = _number(path, line, text, "duration", "is not a number ≥ 0")
        submitted = self._submitted(line, row)
        if gpus == 0:
            self.zero_gpu += 1
            return None
        start, end = self.start, self.end
        if submitted is not None and (
            (start is not None and submitted < start) or (end is not None and submitted >= end)
        ):
            self.outside += 1
            return None
        gpu_type = self._gpu_type(line, row)
        self._milli(line, row)
        label = self._label(line, row)
        team = row[columns.team].strip()
        if not team and columns.team_from is not None:
            raise TraceError(path, "empty, but teams are taken from it", line=line, column=columns.team_from)
        failed = columns.status is not None and row[columns.status].strip().lower() in FAILED_STATUSES
        team = team or DEFAULT_TEAM
        return TraceJob(job_id, submit_time, gpus, duration, team, submitted, gpu_type, label, failed, shape, *costs)

    def _job_id(self, line: int, row: list[str]) -> str:
        job_id = row[self.columns.id].strip()
        if not job_id:
            raise TraceError(self.path, "empty", line=line, column="job_id")
        seen = self.first_line.get(job_id)
        if seen is not None:
            raise TraceError(self.path, f"job_id {job_id!r} already used on line {seen}", line=line, column="job_id")
        self.first_line[job_id] = line
        return job_id

    def _submitted(self, line: int, row: list[str]) -> datetime | None:
        if self.columns.submitted is None:
            return None
        text = row[self.columns.submitted].strip()
        if text:
            submitted = _parse_datetime(text)
            if submitted is None:
                raise TraceError(
                    self.path, f"{text!r} is not a {DATETIME_FORMAT} time", line=line, column="submit_datetime"
                )
            return submitted
        if self.windowed:
            detail = "empty, but a window needs every submit time"
            raise TraceError(self.path, detail, line=line, column="submit_datetime")
        return None

    def _gpu_type(self, line: int, row: list[str]) -> str | None:
        if self.columns.gpu_type is None:
            return None
        gpu_type = row[self.columns.gpu_type].strip() or None
        if gpu_type is not None and "|" in gpu_type:
            detail = f"{gpu_type!r}: a job may need one GPU type here, not a choice of several"
            raise TraceError(self.path, detail, line=line, column=self.columns.gpu_type_name)
        return gpu_type

    def _milli(self, line: int, row: list[str]) -> None:
        """A fractional GPU (`gpu_milli` below 1000) is counted; the job takes a whole one."""
        if self.columns.milli is None or not (text := row[self.columns.milli].strip()):
            return
        try:
            milli = float(text)
        except ValueError:
            milli = math.nan
        if not (math.isfinite(milli) and 0 < milli <= 1000):
            raise TraceError(self.path, f"{text!r} is not a number in (0, 1000]", line=line, column="gpu_milli")
        self.fractional += milli < 1000

    def _label(self, line: int, row: list[str]) -> str | None:
        if self.columns.label is None:
            return None
        label = row[self.columns.label].strip()
        if not label:
            detail = "empty, but priorities are taken from it"
            raise TraceError(self.path, detail, line=line, column=self.columns.label_name)
        return label


def _number(path: Path, line: int, text: str, column: str, problem: str) -> float:
    """A finite number ≥ 0 from `text`; a TraceError says `problem` of it otherwise."""
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number >= 0):
        raise TraceError(path, f"{text!r} {problem}", line=line, column=column)
    return number


def _gpus(path: Path, line: int, text: str) -> int:
    """A number of GPUs ≥ 0 from `text` (an integer, or a float with no fraction)."""
    try:
        gpus = int(text)
    except ValueError:
        try:
            as_float = float(text)
        except ValueError:
            as_float = math.nan
        gpus = int(as_float) if as_float.is_integer() else -1
    if gpus < 0:
        raise TraceError(path, f"{text!r} is not a positive integer", line=line, column="num_gpus")
    return gpus
