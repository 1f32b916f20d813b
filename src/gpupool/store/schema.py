"""The tables of the store. Alembic migrations in `migrations/` build exactly this schema.

One row per job and per attempt; placements are one row per GPU an attempt held, with the
time it held it. A GPU held by two live attempts at once is refused by the database itself
(a unique index over the placements that have not ended).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from gpupool.model import Allocation, Placement, job_label


class Base(DeclarativeBase):
    pass


def _partial(name: str, column: str, where: str) -> Index:
    """An index of the rows `where` holds, on both backends."""
    return Index(name, column, sqlite_where=text(where), postgresql_where=text(where))


# What the control loop checks at every tick, found through partial indexes (migration 0011)
# instead of reading every pending or live job; `base.indexed` reads them.
DEPENDENCIES_UNMET = "state = 'pending' AND dependencies IS NOT NULL AND dependency_met_at IS NULL"
WATCHED_LIVE = (
    "state IN ('starting', 'running', 'preempting') AND (time_limit IS NOT NULL OR cancel_requested_at IS NOT NULL)"
)
NOTICED_LIVE = "ended_at IS NULL AND notice_deadline IS NOT NULL"


class StoreIdentityRow(Base):
    """One row, made by the migration that created it: the store's id names the job folders
    it makes and is written in the data directory, so that neither is mistaken for another's."""

    __tablename__ = "store_identity"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)
    legacy_below: Mapped[int] = mapped_column(Integer)
    """Jobs with smaller ids were made before store ids: their folders are `jobs/<id>`."""


class NodeRow(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    gpus: Mapped[int] = mapped_column(Integer)
    gpu_type: Mapped[str] = mapped_column(String(100))
    virtual: Mapped[bool] = mapped_column(Boolean, default=False)
    team: Mapped[str | None] = mapped_column(String(200), default=None)
    up: Mapped[bool] = mapped_column(Boolean, default=True, server_default=text("true"))
    """Whether the executor has the node now; one that left keeps its row (and its history)."""


class PriorityClassRow(Base):
    __tablename__ = "priority_classes"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[int] = mapped_column(Integer, unique=True)
    may_preempt: Mapped[bool] = mapped_column(Boolean)
    preemptible: Mapped[bool] = mapped_column(Boolean)
    min_runtime: Mapped[float] = mapped_column(Float)
    grace_period: Mapped[float] = mapped_column(Float)
    time_limit: Mapped[float | None] = mapped_column(Float, default=None)
    idle_after: Mapped[float | None] = mapped_column(Float, default=None)
    on_idle: Mapped[str | None] = mapped_column(String(20), default=None)


class TeamRow(Base):
    __tablename__ = "teams"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    guaranteed_gpus: Mapped[int] = mapped_column(Integer, default=0)
    token_hash: Mapped[str | None] = mapped_column(String(128), default=None)
    allowed_classes: Mapped[list[str] | None] = mapped_column(JSON, default=None)
    """Priority classes the team's token may submit at; None for all."""
    seeded: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    """The policy the configuration file last gave this team: a field the file changes since
    wins over the store, one it leaves as it was keeps what the API set."""
    removed_at: Mapped[float | None] = mapped_column(Float, default=None)
    """When the admin removed it (`team remove`): it is gone but for its ended jobs' history,
    which names it; `team set` makes it anew."""


class UserRow(Base):
    """A person who submits jobs, in one team, with a token of their own."""

    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    team: Mapped[str] = mapped_column(ForeignKey("teams.name", ondelete="CASCADE"))
    token_hash: Mapped[str | None] = mapped_column(String(128), unique=True, default=None)


class BudgetRow(Base):
    __tablename__ = "budgets"

    team: Mapped[str] = mapped_column(ForeignKey("teams.name", ondelete="CASCADE"), primary_key=True)
    priority: Mapped[str] = mapped_column(ForeignKey("priority_classes.name"), primary_key=True)
    gpu_hours: Mapped[float] = mapped_column(Float)
    window: Mapped[float] = mapped_column(Float)


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_state", "state"),
        Index("ix_jobs_team_state", "team", "state"),
        Index("ix_jobs_array", "array_id"),
        Index("ix_jobs_user", "user"),
        Index("ux_jobs_idempotency", "team", "idempotency_key", unique=True),
        _partial("ix_jobs_dependencies_unmet", "id", DEPENDENCIES_UNMET),
        _partial("ix_jobs_watched_live", "id", WATCHED_LIVE),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    team: Mapped[str] = mapped_column(ForeignKey("teams.name"))
    priority: Mapped[str] = mapped_column(ForeignKey("priority_classes.name"))
    gpus: Mapped[int] = mapped_column(Integer)
    gpus_per_node: Mapped[int | None] = mapped_column(Integer, default=None)
    sizes: Mapped[list[int] | None] = mapped_column(JSON(none_as_null=True), default=None)
    """An elastic job's sizes in GPUs, smallest first, `gpus` its largest; None for one size."""
    gpu_type: Mapped[str | None] = mapped_column(String(100), default=None)
    command: Mapped[list[str]] = mapped_column(JSON)
    workdir: Mapped[str] = mapped_column(String(4096))
    env: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    state: Mapped[str] = mapped_column(String(20))
    submit_time: Mapped[float] = mapped_column(Float)
    """Original submit time: a requeued job keeps its place in line."""
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    """Attempts started so far; the next one is numbered `attempts`."""
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    node_losses: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Attempts that ended because a node they ran on was lost."""
    failures: Mapped[int] = mapped_column(Integer, default=0)
    max_failures: Mapped[int] = mapped_column(Integer, default=0)
    """Retries after failed attempts, a budget separate from preemptions."""
    max_preemptions: Mapped[int | None] = mapped_column(Integer, default=None)
    ended_at: Mapped[float | None] = mapped_column(Float, default=None)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    cancel_requested_at: Mapped[float | None] = mapped_column(Float, default=None)
    wait_reason: Mapped[str | None] = mapped_column(String(40), default=None)
    wait_message: Mapped[str | None] = mapped_column(String(2000), default=None)
    """Why the job waited at the last decision, for people."""
    held_gpus: Mapped[dict[str, list[int]] | None] = mapped_column(JSON(none_as_null=True), default=None)
    """While its victims drain: the GPUs held for it, by node (draining ones and free ones)."""
    time_limit: Mapped[float | None] = mapped_column(Float, default=None)
    """Seconds of run time over all its attempts (notice to release not counted) before it
    gets notice and ends as TIMEOUT; None for no limit."""
    run_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    """Run time of its ended attempts, counted against `time_limit`."""
    user: Mapped[str | None] = mapped_column(String(200), default=None)
    """Who submitted it: the user of the token, or the OS user of the admin's command line."""
    dependencies: Mapped[list[list[Any]] | None] = mapped_column(JSON(none_as_null=True), default=None)
    """`[kind, job id]` pairs, kind `ok` (succeeded), `notok` (ended otherwise) or `any` (ended)."""
    dependency_met_at: Mapped[float | None] = mapped_column(Float, default=None)
    """When every dependency was met: only then is the job given to the scheduling core."""
    array_id: Mapped[int | None] = mapped_column(Integer, default=None)
    """The id of the array's first task, for every task of a job array."""
    array_index: Mapped[int | None] = mapped_column(Integer, default=None)
    array_limit: Mapped[int | None] = mapped_column(Integer, default=None)
    """At most this many tasks of the array hold GPUs at once."""
    script: Mapped[str | None] = mapped_column(Text, default=None)
    """A batch script, as it was when submitted: each attempt runs this copy."""
    output: Mapped[str | None] = mapped_column(String(4096), default=None)
    error: Mapped[str | None] = mapped_column(String(4096), default=None)
    """Paths of the standard output and error (`%j` job, `%a` array index, `%t` attempt, `%%`);
    None keeps them in the attempt's folder."""
    nominated_at: Mapped[float | None] = mapped_column(Float, default=None)
    """When jobs were first given notice for it; cleared when it starts (see `Job.nominated`)."""
    idempotency_key: Mapped[str | None] = mapped_column(String(200), default=None)
    """The client's `Idempotency-Key`: a retried submission returns this job, not a new one."""
    launch_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Launches in a row that failed for the scheduler's reasons (disk, fork), not the job's."""
    retry_after: Mapped[float | None] = mapped_column(Float, default=None)
    """After such a failure: the job is held until then (a back-off), then tried again."""
    launch_error: Mapped[str | None] = mapped_column(String(500), default=None)
    """What went wrong at its last launch that failed for the scheduler's reasons."""
    notify: Mapped[str | None] = mapped_column(String(2000), default=None)
    """A URL told of the job's start, end and each notice (`gpupool submit --notify`)."""
    held_by: Mapped[str | None] = mapped_column(String(20), default=None)
    """`user` or `admin` while a person holds the pending job (`gpupool hold`): it waits until
    released, by the admin, or by anyone who may act on it if a user held it."""
    mem: Mapped[int | None] = mapped_column(BigInteger, default=None)
    """Bytes of memory on each node (`--mem`); None: `mem_per_gpu`, else the pool's default."""
    mem_per_gpu: Mapped[int | None] = mapped_column(BigInteger, default=None)
    cpus_per_gpu: Mapped[float | None] = mapped_column(Float, default=None)
    session: Mapped[str | None] = mapped_column(String(20), default=None)
    """`run`, `shell` or `notebook` for a session (`model.SessionKind`); None for a batch job."""
    kill_requested_at: Mapped[float | None] = mapped_column(Float, default=None)
    """When a cancel asked for the attempt to be killed at once, with no grace."""

    @property
    def label(self) -> str:
        """The job as people name it (`model.job_label`)."""
        return job_label(self.id, self.array_id, self.array_index)


class AttemptRow(Base):
    __tablename__ = "attempts"
    __table_args__ = (
        Index("ix_attempts_live", "ended_at"),
        _partial("ix_attempts_notice_live", "job_id", NOTICED_LIVE),
    )

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[float] = mapped_column(Float)
    """When the GPUs were allocated."""
    gpus: Mapped[int | None] = mapped_column(Integer, default=None)
    """The GPUs it ran on: its job's size, or an elastic job's size at this attempt (None only
    in a store older than migration 0015, read as its job's `gpus`)."""
    priority: Mapped[str | None] = mapped_column(String(100), default=None)
    """The class the attempt ran at (lower than the job's when its team was over budget)."""
    handle: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    """How the executor finds the attempt's processes again (its own JSON, read by it alone);
    None until it started them."""
    token_hash: Mapped[str | None] = mapped_column(String(128), default=None)
    last_heartbeat_at: Mapped[float | None] = mapped_column(Float, default=None)
    step: Mapped[int | None] = mapped_column(Integer, default=None)
    phase: Mapped[str | None] = mapped_column(String(20), default=None)
    productive_at: Mapped[float | None] = mapped_column(Float, default=None)
    """First productive step of this attempt (end of startup and restore)."""
    last_checkpoint_at: Mapped[float | None] = mapped_column(Float, default=None)
    restored_step: Mapped[int | None] = mapped_column(Integer, default=None)
    """The checkpoint step this attempt resumed from, as the job reported it."""
    restore_seconds: Mapped[float | None] = mapped_column(Float, default=None)
    restart: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    """Where its start-up went, as the job reported it: `process_started_at` (Unix time),
    `phases` ({name: seconds}, in order), `first_step` and `steady_step` (seconds)."""
    since_commit: Mapped[float | None] = mapped_column(Float, default=None)
    """Seconds of work since its last checkpoint commit, as of its last heartbeat."""
    notice_at: Mapped[float | None] = mapped_column(Float, default=None)
    notice_deadline: Mapped[float | None] = mapped_column(Float, default=None)
    notice_for: Mapped[int | None] = mapped_column(Integer, default=None)
    notice_keep: Mapped[dict[str, list[int]] | None] = mapped_column(JSON(none_as_null=True), default=None)
    """A resize's notice (`model.Notice.keep`): the GPUs, {node: [gpu]}, its next attempt starts
    on at once; None for any other notice. A growth's (`notice_for` the job itself) holds more
    than its placement: the added ones are held already (`PlacementRow.added`)."""
    timeout_at: Mapped[float | None] = mapped_column(Float, default=None)
    """When the job reached its time limit (its notice deadline is then the end of its grace)."""
    acked_at: Mapped[float | None] = mapped_column(Float, default=None)
    completed_at: Mapped[float | None] = mapped_column(Float, default=None)
    """When the job reported that it finished: success whatever happens after."""
    ended_at: Mapped[float | None] = mapped_column(Float, default=None)
    outcome: Mapped[str | None] = mapped_column(String(20), default=None)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    peak_memory: Mapped[int | None] = mapped_column(BigInteger, default=None)
    """Bytes, the largest of its members' peaks, as their cgroups counted (Slurm's MaxRSS)."""
    cpu_seconds: Mapped[float | None] = mapped_column(Float, default=None)
    oom_kills: Mapped[int | None] = mapped_column(Integer, default=None)
    """Processes the kernel killed because the attempt reached its memory limit."""
    peak_gpu_memory: Mapped[int | None] = mapped_column(BigInteger, default=None)
    """Bytes, the largest GPU memory its processes held at once, where NVML counts it."""
    idle_seconds: Mapped[float | None] = mapped_column(Float, default=None)
    """A session's: seconds it held its GPUs with no activity (`SessionPolicy.idle_counts_after`)."""
    server: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), default=None)
    """A notebook session's server, as it reported it: `{"port": N, "token": T}` (on the node
    its placement names)."""


class PlacementRow(Base):
    __tablename__ = "placements"
    __table_args__ = (
        ForeignKeyConstraint(["job_id", "attempt"], ["attempts.job_id", "attempts.attempt"], ondelete="CASCADE"),
        # At most one live holder per GPU, enforced where no bug in the service can get around it.
        Index(
            "ux_placements_live_gpu",
            "node",
            "gpu",
            unique=True,
            sqlite_where=text("held_until IS NULL"),
            postgresql_where=text("held_until IS NULL"),
        ),
        Index("ix_placements_attempt", "job_id", "attempt"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    node: Mapped[str] = mapped_column(ForeignKey("nodes.name"))
    gpu: Mapped[int] = mapped_column(Integer)
    held_from: Mapped[float] = mapped_column(Float)
    held_until: Mapped[float | None] = mapped_column(Float, default=None)
    added: Mapped[bool | None] = mapped_column(Boolean, default=None)
    """A free GPU a growth's notice holds for the attempt that follows: not the attempt's own
    (it runs without it), released with it and held again by the next."""


class EventRow(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_job", "job_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(40))
    job_id: Mapped[int | None] = mapped_column(Integer, default=None)
    attempt: Mapped[int | None] = mapped_column(Integer, default=None)
    reason: Mapped[str | None] = mapped_column(String(40), default=None)
    message: Mapped[str] = mapped_column(String(2000), default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class CheckpointRow(Base):
    __tablename__ = "checkpoint_commits"
    __table_args__ = (
        ForeignKeyConstraint(["job_id", "attempt"], ["attempts.job_id", "attempts.attempt"], ondelete="CASCADE"),
        Index("ix_checkpoints_job", "job_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    time: Mapped[float] = mapped_column(Float)
    step: Mapped[int | None] = mapped_column(Integer, default=None)
    path: Mapped[str | None] = mapped_column(String(4096), default=None)
    seconds: Mapped[float | None] = mapped_column(Float, default=None)
    """How long the save blocked training."""
    background_seconds: Mapped[float | None] = mapped_column(Float, default=None)
    """How long it was written after training went on (a background save)."""


class ChangeRow(Base):
    """One write to what the scheduling core reads, left by a trigger (migration 0011) whatever
    made it: the job it is of, or None for the pool's nodes. The control loop reads those since
    its last decision (`store/reads.py`). `seq` orders them on SQLite, whose writers take turns;
    on PostgreSQL, `xid` is the writing transaction's id, which says which were not yet visible
    to a read."""

    __tablename__ = "changes"
    __table_args__ = (Index("ix_changes_xid", "xid"), {"sqlite_autoincrement": True})

    seq: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    job_id: Mapped[int | None] = mapped_column(Integer, default=None)
    xid: Mapped[int | None] = mapped_column(BigInteger, default=None)


ATTEMPT_GPUS = func.coalesce(AttemptRow.gpus, JobRow.gpus)
"""The GPUs an attempt ran on, in a query that joins its job (a store older than migration
0015 has not recorded them: its job's one size)."""


def placement_of(held: Mapping[str, Sequence[int]] | None, up: Mapping[str, int] | None = None) -> Placement:
    """A placement from its stored form, {node: [gpu]} (`AttemptRow.notice_keep`); with `up`
    (each node that is up, with its GPUs), only the GPUs that are there: those of a node that
    left, or came back smaller, are nobody's to give."""
    kept = (
        (node, sorted(g for g in gpus if up is None or g < up.get(node, 0)))
        for node, gpus in sorted((held or {}).items())
    )
    return tuple(Allocation(node, tuple(gpus)) for node, gpus in kept if gpus)


def stored(placement: Placement) -> dict[str, list[int]]:
    """A placement in its stored form (`placement_of` reads it)."""
    return {a.node: list(a.gpus) for a in placement}
