"""What the crash harness (`crash_harness.py`) checks once every job has ended: pure functions
of the store's rows and of the ledger its jobs wrote, each returning the violations it found
(sentences a person can read; an empty list when the property held).

- `check_ended_once`: every job ended, as a success, exactly once (one terminal event), and
  nothing of it started after it ended;
- `check_store_attempts`: a job's attempts, as the store has them, are numbered 0..n-1, all
  ended, and never overlapped in time;
- `check_gpus`: no GPU was held by two attempts at once (placements), each attempt held as many
  GPUs as its job asked, within its own lifetime;
- `check_processes`: the processes agree: no attempt ran twice (the per-job lock, the
  ledger), each process is the child of the launcher the store recorded, ran inside its
  attempt's lifetime, on the GPUs of its placement, never beside another attempt of its job nor
  beside another process on one of its GPUs;
- `check_resumes`: every attempt resumed from the newest checkpoint committed before it (the
  ledger's commits exactly; never older than a commit the store recorded) and said so;
- `check_nothing_lost`: every submission answered with a 2xx is a job, under its id; no job
  is unknown to the harness or stored twice.

Times in the store and in the ledger come from one clock (this machine's); `TOLERANCE` covers
the coarse clock of file times (the launcher's exit record) against `time.time()`.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timeout"})
TOLERANCE = 0.05
"""Seconds by which two clocks' views of one instant may differ (file times are coarse)."""


# --- the store's rows ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    id: int
    name: str
    state: str
    gpus: int
    attempts: int
    preemptions: int = 0


@dataclass(frozen=True)
class Attempt:
    job_id: int
    attempt: int
    started_at: float
    ended_at: float | None
    pid: int | None = None
    """The launcher's pid, as the store recorded it."""
    restored_step: int | None = None
    outcome: str | None = None
    notice_at: float | None = None


@dataclass(frozen=True)
class Placement:
    job_id: int
    attempt: int
    node: str
    gpu: int
    held_from: float
    held_until: float | None


@dataclass(frozen=True)
class Event:
    job_id: int
    attempt: int | None
    kind: str
    time: float


@dataclass(frozen=True)
class Commit:
    job_id: int
    attempt: int
    step: int | None
    time: float


@dataclass
class StoreRows:
    jobs: list[Job] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    placements: list[Placement] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    commits: list[Commit] = field(default_factory=list)


def read_store(database: Path) -> StoreRows:
    """The rows the checks need, read from the SQLite store without writing to it."""
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        rows = StoreRows(
            [Job(*r) for r in connection.execute("SELECT id, name, state, gpus, attempts, preemptions FROM jobs")],
            [
                Attempt(*r)
                for r in connection.execute(
                    "SELECT job_id, attempt, started_at, ended_at, json_extract(handle, '$.pid'), restored_step,"
                    " outcome, notice_at FROM attempts"
                )
            ],
            [
                Placement(*r)
                for r in connection.execute(
                    "SELECT job_id, attempt, node, gpu, held_from, held_until FROM placements ORDER BY id"
                )
            ],
            [
                Event(*r)
                for r in connection.execute(
                    "SELECT job_id, attempt, kind, time FROM events WHERE job_id IS NOT NULL ORDER BY id"
                )
            ],
            [Commit(*r) for r in connection.execute("SELECT job_id, attempt, step, time FROM checkpoint_commits")],
        )
    finally:
        connection.close()
    return rows


# --- the ledger the jobs write -------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """A process of an attempt began (it has restored its checkpoint, if any)."""

    job: int
    attempt: int
    pid: int
    ppid: int
    began: float
    """When the process started, before it took its lock."""
    restored: int | None
    """The step it resumed from; None when it started from scratch."""
    gpus: tuple[int, ...] = ()
    seq: int = -1
    locked: bool = True


@dataclass(frozen=True)
class LedgerCommit:
    """A checkpoint committed on disk (written before the commit is reported to gpupool)."""

    job: int
    attempt: int
    pid: int
    step: int
    time: float


@dataclass(frozen=True)
class End:
    """A process left: `how` is `done` (finished), `left` (after notice) or an error."""

    job: int
    attempt: int
    pid: int
    time: float
    how: str


@dataclass(frozen=True)
class Done:
    """A process finished the job's work: `total` is what its state added up to."""

    job: int
    attempt: int
    pid: int
    time: float
    total: int
    expected: int


@dataclass(frozen=True)
class Duplicate:
    """A process found its job's lock held: another process of the job ran at that moment."""

    job: int
    attempt: int
    pid: int
    time: float
    holder: str = ""


@dataclass
class Ledger:
    starts: list[Start] = field(default_factory=list)
    commits: list[LedgerCommit] = field(default_factory=list)
    ends: list[End] = field(default_factory=list)
    dones: list[Done] = field(default_factory=list)
    duplicates: list[Duplicate] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)


def parse_ledger(lines: Iterable[str]) -> Ledger:
    """The ledger's JSON lines; a line that does not parse is kept in `unreadable`."""
    ledger = Ledger()
    for line in lines:
        if not line.strip():
            continue
        try:
            record: dict[str, Any] = json.loads(line)
            kind = record["kind"]
            job, attempt, pid = int(record["job"]), int(record["attempt"]), int(record["pid"])
            if kind == "start":
                restored = record.get("restored")
                ledger.starts.append(
                    Start(
                        job,
                        attempt,
                        pid,
                        int(record["ppid"]),
                        float(record["began"]),
                        int(restored) if restored is not None else None,
                        tuple(int(g) for g in record.get("gpus", [])),
                        int(record.get("seq", -1)),
                        bool(record.get("locked", True)),
                    )
                )
            elif kind == "commit":
                ledger.commits.append(LedgerCommit(job, attempt, pid, int(record["step"]), float(record["time"])))
            elif kind == "end":
                ledger.ends.append(End(job, attempt, pid, float(record["time"]), str(record["how"])))
            elif kind == "done":
                ledger.dones.append(
                    Done(job, attempt, pid, float(record["time"]), int(record["total"]), int(record["expected"]))
                )
            elif kind == "duplicate":
                ledger.duplicates.append(
                    Duplicate(job, attempt, pid, float(record["time"]), str(record.get("holder", "")))
                )
            else:
                ledger.unreadable.append(line.strip())
        except (ValueError, KeyError, TypeError):
            ledger.unreadable.append(line.strip())
    return ledger


def read_ledger(path: Path) -> Ledger:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Ledger()
    return parse_ledger(text.splitlines())


# --- what the harness submitted ------------------------------------------------------------------


@dataclass(frozen=True)
class Submission:
    """One try of one submission: a submission whose answer was lost (or a 5xx) is tried again
    with the same Idempotency-Key (its name), as a client that retries does."""

    seq: int
    name: str
    job_id: int | None
    """The id of a 2xx answer; None otherwise."""
    status: int | None = None
    """The HTTP status of the answer, None without one (the service was killed meanwhile)."""
    replayed: bool = False
    """The answer said it was a retry's (`Idempotent-Replayed`): no new job was made."""

    @property
    def answered(self) -> bool:
        """Whether this try settled the submission: accepted, or refused for its own fault."""
        return self.status is not None and self.status < 500


# --- the checks ----------------------------------------------------------------------------------


def _by_job(attempts: Iterable[Attempt]) -> dict[int, list[Attempt]]:
    grouped: dict[int, list[Attempt]] = defaultdict(list)
    for a in attempts:
        grouped[a.job_id].append(a)
    for rows in grouped.values():
        rows.sort(key=lambda a: a.attempt)
    return grouped


def _terminal_events(events: Iterable[Event]) -> dict[int, list[Event]]:
    found: dict[int, list[Event]] = defaultdict(list)
    for e in events:
        if e.kind in TERMINAL:
            found[e.job_id].append(e)
    return found


def check_ended_once(store: StoreRows, ledger: Ledger) -> list[str]:
    """Every job ended as a success, with exactly one terminal event; no attempt (in the store)
    nor process (in the ledger) of it began after that; the store's successful attempt is one
    whose process finished the work, and the work added up to what it should."""
    problems = []
    terminal = _terminal_events(store.events)
    attempts = {(a.job_id, a.attempt): a for a in store.attempts}
    done_by = defaultdict(list)
    for d in ledger.dones:
        done_by[d.job].append(d)
        if d.total != d.expected:
            problems.append(
                f"job {d.job} attempt {d.attempt} (pid {d.pid}) finished with a state of {d.total}, not {d.expected}: "
                "its checkpoints did not carry its work exactly"
            )
    for job in sorted(store.jobs, key=lambda j: j.id):
        if job.state not in TERMINAL:
            problems.append(f"job {job.id} ({job.name}) never ended: it is {job.state}")
        elif job.state != "succeeded":
            problems.append(f"job {job.id} ({job.name}) ended as {job.state}, not succeeded")
        ends = terminal.get(job.id, [])
        if len(ends) != 1:
            kinds = ", ".join(f"{e.kind} at {e.time:.3f}" for e in ends) or "none"
            problems.append(f"job {job.id} has {len(ends)} terminal events, not 1 ({kinds})")
        if not ends:
            continue
        ended = ends[0].time
        for a in store.attempts:
            if a.job_id == job.id and a.started_at > ended:
                problems.append(f"job {job.id} attempt {a.attempt} started at {a.started_at:.3f}, after the job ended")
        for s in ledger.starts:
            if s.job == job.id and s.began > ended + TOLERANCE:
                problems.append(
                    f"job {job.id}: a process (pid {s.pid}, attempt {s.attempt}) began at {s.began:.3f}, "
                    f"after the job ended at {ended:.3f}"
                )
        if job.state == "succeeded":
            last = ends[0].attempt
            finished = any(d.attempt == last for d in done_by[job.id])
            if last is not None and attempts.get((job.id, last)) is not None and not finished:
                problems.append(
                    f"job {job.id} succeeded with attempt {last}, but no process of that attempt finished the work"
                )
            if not done_by[job.id]:
                problems.append(f"job {job.id} succeeded, but no process of it ever finished the work")
    return problems


def check_store_attempts(store: StoreRows) -> list[str]:
    """A job's attempts are 0..n-1 with n its attempt count, all ended, one after the other."""
    problems = []
    grouped = _by_job(store.attempts)
    for job in sorted(store.jobs, key=lambda j: j.id):
        rows = grouped.get(job.id, [])
        numbers = [a.attempt for a in rows]
        if numbers != list(range(job.attempts)):
            problems.append(f"job {job.id} counts {job.attempts} attempts, the store holds attempts {numbers}")
        for a in rows:
            if a.ended_at is None:
                problems.append(f"job {job.id} attempt {a.attempt} never ended in the store")
        for before, after in pairwise(rows):
            if before.ended_at is None or before.ended_at > after.started_at:
                until = f"{before.ended_at:.3f}" if before.ended_at is not None else "never ended"
                problems.append(
                    f"job {job.id}: attempt {after.attempt} started at {after.started_at:.3f} while attempt "
                    f"{before.attempt} ran ({before.started_at:.3f} to {until})"
                )
    return problems


def check_gpus(store: StoreRows) -> list[str]:
    """No (node, GPU) held by two placements at once; every hold ended; each attempt held as
    many distinct GPUs as its job asked for, within the attempt's lifetime."""
    problems = []
    by_gpu: dict[tuple[str, int], list[Placement]] = defaultdict(list)
    by_attempt: dict[tuple[int, int], list[Placement]] = defaultdict(list)
    for p in store.placements:
        by_gpu[(p.node, p.gpu)].append(p)
        by_attempt[(p.job_id, p.attempt)].append(p)
        if p.held_until is None:
            problems.append(f"GPU {p.node}/{p.gpu} is still held by job {p.job_id} attempt {p.attempt}")
    for (node, gpu), holds in sorted(by_gpu.items()):
        holds.sort(key=lambda p: p.held_from)
        for before, after in pairwise(holds):
            if before.held_until is None or before.held_until > after.held_from:
                problems.append(
                    f"GPU {node}/{gpu} held twice: by job {before.job_id} attempt {before.attempt} "
                    f"({before.held_from:.3f} to {before.held_until}) and by job {after.job_id} attempt "
                    f"{after.attempt} from {after.held_from:.3f}"
                )
    jobs = {j.id: j for j in store.jobs}
    for a in store.attempts:
        holds = by_attempt.get((a.job_id, a.attempt), [])
        job = jobs.get(a.job_id)
        gpus = {(p.node, p.gpu) for p in holds}
        if job is not None and (len(holds) != job.gpus or len(gpus) != len(holds)):
            problems.append(
                f"job {a.job_id} attempt {a.attempt} held {len(holds)} placements on {len(gpus)} GPUs; "
                f"the job asked for {job.gpus}"
            )
        for p in holds:
            end = a.ended_at if a.ended_at is not None else float("inf")
            until = p.held_until if p.held_until is not None else float("inf")
            if p.held_from < a.started_at - 1e-6 or until > end + 1e-6:
                problems.append(
                    f"job {a.job_id} attempt {a.attempt} held GPU {p.node}/{p.gpu} from {p.held_from:.3f} to "
                    f"{until:.3f}, outside its lifetime ({a.started_at:.3f} to {end:.3f})"
                )
    return problems


ProcessKey = tuple[int, int, int]
"""(job, attempt, pid): one process of one attempt."""


def _key(record: Start | End) -> ProcessKey:
    return (record.job, record.attempt, record.pid)


def _process_ends(ledger: Ledger, attempts: dict[tuple[int, int], Attempt]) -> dict[ProcessKey, tuple[float, float]]:
    """When each process ended, and by how much that time may be early: its own `end` line
    (written just before it exits: exact), else the end of its attempt in the store (a process
    killed before it could write ended by then; the store may have that time from a file's
    coarse clock)."""
    ends = {_key(e): e.time for e in ledger.ends}
    result = {}
    for s in ledger.starts:
        if _key(s) in ends:
            result[_key(s)] = (ends[_key(s)], 0.0)
        else:
            row = attempts.get((s.job, s.attempt))
            result[_key(s)] = (row.ended_at if row is not None and row.ended_at is not None else math.inf, TOLERANCE)
    return result


def _overlaps(starts: Iterable[Start], ended: dict[ProcessKey, tuple[float, float]]) -> list[tuple[Start, Start]]:
    """Pairs of processes (the first to begin, the other) that ran at the same time."""
    found = []
    ordered = sorted(starts, key=lambda s: s.began)
    for i, first in enumerate(ordered):
        until, slack = ended[_key(first)]
        for later in ordered[i + 1 :]:
            if later.began >= until - slack:
                break
            found.append((first, later))
    return found


def check_processes(store: StoreRows, ledger: Ledger) -> list[str]:
    """The processes' own account: no second process of a running job (the lock), one process
    per attempt, each the child of the launcher the store recorded and inside its attempt's
    lifetime, on its placement's GPUs; no two processes of a job, nor two on one GPU, at once."""
    problems = []
    for d in ledger.duplicates:
        holder = f" (held by {d.holder})" if d.holder else ""
        problems.append(
            f"DUPLICATE: job {d.job} attempt {d.attempt}: pid {d.pid} found the job's lock held{holder} "
            f"at {d.time:.3f}: two processes of one job ran at once"
        )
    for line in ledger.unreadable:
        problems.append(f"the ledger has a line that does not read: {line[:200]}")
    attempts = {(a.job_id, a.attempt): a for a in store.attempts}
    held: dict[tuple[int, int], set[int]] = defaultdict(set)
    for p in store.placements:
        held[(p.job_id, p.attempt)].add(p.gpu)
    per_attempt = Counter((s.job, s.attempt) for s in ledger.starts)
    for (job, attempt), count in sorted(per_attempt.items()):
        if count > 1:
            pids = ", ".join(str(s.pid) for s in ledger.starts if (s.job, s.attempt) == (job, attempt))
            problems.append(f"job {job} attempt {attempt} ran as {count} processes (pids {pids})")
    ended = _process_ends(ledger, attempts)
    for s in ledger.starts:
        row = attempts.get((s.job, s.attempt))
        if row is None:
            problems.append(f"pid {s.pid} ran as job {s.job} attempt {s.attempt}, which the store does not have")
            continue
        if row.pid is not None and s.ppid != row.pid:
            problems.append(
                f"job {s.job} attempt {s.attempt}: pid {s.pid} is the child of pid {s.ppid}, not of the attempt's "
                f"launcher (pid {row.pid} in the store)"
            )
        if s.began < row.started_at - TOLERANCE:
            problems.append(
                f"job {s.job} attempt {s.attempt}: pid {s.pid} began at {s.began:.3f}, before the attempt started "
                f"({row.started_at:.3f})"
            )
        until, _ = ended[_key(s)]
        if row.ended_at is not None and until > row.ended_at + TOLERANCE:
            problems.append(
                f"job {s.job} attempt {s.attempt}: pid {s.pid} ran until {until:.3f}, after the store ended the "
                f"attempt ({row.ended_at:.3f})"
            )
        if set(s.gpus) != held[(s.job, s.attempt)]:
            problems.append(
                f"job {s.job} attempt {s.attempt}: pid {s.pid} ran on GPUs {sorted(s.gpus)}, its placement is "
                f"{sorted(held[(s.job, s.attempt)])}"
            )
    by_job: dict[int, list[Start]] = defaultdict(list)
    by_gpu: dict[int, list[Start]] = defaultdict(list)
    for s in ledger.starts:
        by_job[s.job].append(s)
        for gpu in s.gpus:
            by_gpu[gpu].append(s)
    for job, starts in sorted(by_job.items()):
        for first, later in _overlaps(starts, ended):
            problems.append(
                f"job {job}: pid {later.pid} (attempt {later.attempt}) began at {later.began:.3f} while pid "
                f"{first.pid} (attempt {first.attempt}) still ran (until {ended[_key(first)][0]:.3f})"
            )
    for gpu, starts in sorted(by_gpu.items()):
        for first, later in _overlaps(starts, ended):
            if first.job == later.job:
                continue  # said above, as two processes of one job
            problems.append(
                f"GPU {gpu} used by two processes at once: pid {first.pid} (job {first.job} attempt "
                f"{first.attempt}, until {ended[_key(first)][0]:.3f}) and pid {later.pid} (job {later.job} attempt "
                f"{later.attempt}, from {later.began:.3f})"
            )
    by_job_commit: dict[int, list[LedgerCommit]] = defaultdict(list)
    for c in ledger.commits:
        by_job_commit[c.job].append(c)
    for s in ledger.starts:
        for c in by_job_commit[s.job]:
            if c.attempt < s.attempt and c.time > s.began + TOLERANCE:
                problems.append(
                    f"job {s.job}: attempt {c.attempt} (pid {c.pid}) committed step {c.step} at {c.time:.3f}, after "
                    f"attempt {s.attempt} began ({s.began:.3f})"
                )
    return problems


def check_resumes(store: StoreRows, ledger: Ledger) -> list[str]:
    """Every process resumed from the newest checkpoint its job committed before it began (the
    ledger knows every commit on disk): from scratch when there was none. Never from one older
    than a commit the store recorded for an earlier attempt (the store may miss a commit whose
    report found the service down, never have one that was not made). The `restored_step` the
    store recorded, when it has one, is the one the process resumed from."""
    problems = []
    commits: dict[int, list[LedgerCommit]] = defaultdict(list)
    for c in ledger.commits:
        commits[c.job].append(c)
    recorded: dict[int, list[Commit]] = defaultdict(list)
    for rc in store.commits:
        recorded[rc.job_id].append(rc)
    attempts = {(a.job_id, a.attempt): a for a in store.attempts}
    for s in sorted(ledger.starts, key=lambda s: (s.job, s.attempt, s.began)):
        earlier = [c for c in commits[s.job] if c.attempt < s.attempt and c.time <= s.began + TOLERANCE]
        newest = max(earlier, key=lambda c: (c.step, c.time), default=None)
        expected = newest.step if newest is not None else None
        if s.restored != expected:
            was = f"step {s.restored}" if s.restored is not None else "scratch"
            should = f"step {expected} (attempt {newest.attempt})" if newest is not None else "scratch"
            problems.append(
                f"job {s.job} attempt {s.attempt} (pid {s.pid}) resumed from {was}; the newest checkpoint committed "
                f"before it is {should}"
            )
        stored = [rc.step for rc in recorded[s.job] if rc.attempt < s.attempt and rc.step is not None]
        if stored and (s.restored is None or s.restored < max(stored)):
            problems.append(
                f"job {s.job} attempt {s.attempt} resumed from {s.restored}, older than step {max(stored)} the store "
                "recorded as committed by an earlier attempt"
            )
        row = attempts.get((s.job, s.attempt))
        if row is not None and row.restored_step is not None and row.restored_step != s.restored:
            problems.append(
                f"job {s.job} attempt {s.attempt}: the store says it resumed from step {row.restored_step}, its "
                f"process resumed from {s.restored}"
            )
    return problems


def check_nothing_lost(store: StoreRows, submissions: Sequence[Submission]) -> list[str]:
    """Every try answered 2xx names the job of its id and name, and every try of one submission
    answered 2xx names the same job (a retry gets the job the first try made, not another);
    every submission was accepted in the end (none refused, none left without an answer); every
    job in the store is a submission of the harness, stored once."""
    problems = []
    jobs = {j.id: j for j in store.jobs}
    names = Counter(j.name for j in store.jobs)
    tries: dict[str, list[Submission]] = defaultdict(list)
    for s in submissions:
        tries[s.name].append(s)
        if s.job_id is not None:
            job = jobs.get(s.job_id)
            if job is None:
                problems.append(f"submission {s.name} was answered {s.status} as job {s.job_id}, which the store lacks")
            elif job.name != s.name:
                problems.append(f"submission {s.name} was answered as job {s.job_id}, which is {job.name}")
        elif s.answered:
            problems.append(f"submission {s.name} was answered {s.status}, not accepted")
    for name, attempts in sorted(tries.items()):
        answered_as = sorted({s.job_id for s in attempts if s.job_id is not None})
        if len(answered_as) > 1:
            listed = ", ".join(map(str, answered_as))
            problems.append(f"submission {name} was answered as {len(answered_as)} different jobs ({listed})")
        if not any(s.answered for s in attempts):
            problems.append(f"submission {name} was never answered in {len(attempts)} tries")
    for name, count in sorted(names.items()):
        if count > 1:
            stored = ", ".join(str(j.id) for j in store.jobs if j.name == name)
            problems.append(f"submission {name} is stored {count} times (jobs {stored})")
        if name not in tries:
            problems.append(f"job {name} is in the store, but the harness never submitted it")
    return problems


def check_all(store: StoreRows, ledger: Ledger, submissions: Sequence[Submission]) -> list[str]:
    return [
        *check_nothing_lost(store, submissions),
        *check_ended_once(store, ledger),
        *check_store_attempts(store),
        *check_gpus(store),
        *check_processes(store, ledger),
        *check_resumes(store, ledger),
    ]


def figures(
    store: StoreRows, ledger: Ledger, submissions: Sequence[Submission], kills: Sequence[float] = ()
) -> dict[str, int]:
    """What the run did, as counts; `kills`: when the service was killed (unix times)."""
    outcomes = Counter(a.outcome for a in store.attempts)
    first: dict[str, Submission] = {}
    for s in submissions:
        first.setdefault(s.name, s)
    retried = {s.name for s in submissions if s is not first[s.name]}

    def spans(a: Attempt, since: float | None) -> int:
        end = a.ended_at if a.ended_at is not None else math.inf
        return sum(1 for k in kills if since is not None and since < k < end)

    return {
        "submissions": len(first),
        "  answered 2xx at the first try": sum(1 for s in first.values() if s.job_id is not None),
        "  tried again (no answer, or a 5xx)": len(retried),
        "  retries answered as a replay (the lost try made the job)": sum(
            1 for s in submissions if s.replayed and s.name in retried
        ),
        "tries without an answer (killed under them)": sum(1 for s in submissions if s.status is None),
        "tries answered 5xx": sum(1 for s in submissions if s.status is not None and s.status >= 500),
        "jobs in the store": len(store.jobs),
        "jobs succeeded": sum(1 for j in store.jobs if j.state == "succeeded"),
        "attempts (store)": len(store.attempts),
        "  preempted (notice, requeued)": outcomes["preempted"],
        "  lost while the service was down": outcomes["lost"],
        "  not launched": outcomes["not_launched"],
        "  alive across a kill (adopted or found ended)": sum(1 for a in store.attempts if spans(a, a.started_at)),
        "  under notice across a kill": sum(1 for a in store.attempts if spans(a, a.notice_at)),
        "processes (ledger)": len(ledger.starts),
        "preemptions (jobs' counters)": sum(j.preemptions for j in store.jobs),
        "checkpoint commits (ledger)": len(ledger.commits),
        "checkpoint commits (store)": len(store.commits),
        "resumes checked": sum(1 for s in ledger.starts if s.attempt > 0),
        "  from a checkpoint": sum(1 for s in ledger.starts if s.restored is not None),
        "  restored step reported to the store": sum(1 for a in store.attempts if a.restored_step is not None),
        "duplicate processes (lock held)": len(ledger.duplicates),
    }
