"""What the HTTP API takes and returns."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpupool.accounting import AttemptCost, Interruption, JobAccount, Totals
from gpupool.store.schema import AttemptRow, JobRow


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


MANY = 1_000_000
"""Upper bound of counts (the store keeps 32-bit integers)."""


class JobIn(_In):
    command: list[str] = Field(min_length=1)
    team: str | None = Field(default=None, max_length=200)
    """Defaults to the team of the token (or `default` for the admin)."""
    priority: str = Field(default="normal", max_length=100)
    gpus: int = Field(default=1, ge=1, le=MANY)
    gpus_per_node: int | None = Field(default=None, ge=1, le=MANY)
    gpu_type: str | None = Field(default=None, max_length=100)
    name: str = Field(default="", max_length=200)
    workdir: str = Field(default=".", max_length=4096)
    env: dict[str, str] = Field(default_factory=dict, max_length=10_000)
    """The job's variables (the command line sends the submitter's environment, as sbatch)."""
    max_failures: int = Field(default=0, ge=0, le=MANY)
    max_preemptions: int | None = Field(default=None, ge=0, le=MANY)
    time_limit: float | None = Field(default=None, gt=0, le=10 * 365 * 86400)
    """Seconds of run time over all attempts (a preemption's drain not counted); at the limit the
    job gets notice and its class's grace, then ends as `timeout`."""
    after: str | None = Field(default=None, max_length=10_000)
    """Dependencies in Slurm's words: `12`, `ok:12:13`, `notok:12`, `any:12,ok:14` (a bare id is
    `ok`); an array's id stands for all its tasks. The job waits; one that can never be met
    cancels it, saying why."""
    array: str | None = Field(default=None, max_length=10_000)
    """A job array: `0-99%8` is 100 tasks, at most 8 at once; each gets GPUPOOL_ARRAY_INDEX."""
    script: str | None = Field(default=None, max_length=1_000_000)
    """A batch script's text, run in place of `command[0]` (the rest are its arguments)."""
    output: str | None = Field(default=None, max_length=4096)
    error: str | None = Field(default=None, max_length=4096)
    """Paths of standard output and error, relative to `workdir`: `%j` job, `%A` array, `%a`
    index, `%t` attempt, `%x` name, `%%`. Without `error`, errors go to `output`."""
    user: str | None = Field(default=None, max_length=200)
    """Who submits it: the admin's command line sends its OS user; a team's token has its own."""

    @field_validator("env")
    @classmethod
    def _names_and_no_tokens(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not name or "=" in name or "\0" in name or "\0" in value:
                raise ValueError(f"{name!r} is not a variable name (or its value holds a NUL)")
        if "GPUPOOL_TOKEN" in env:
            raise ValueError("GPUPOOL_TOKEN is set by gpupool for each attempt: a job never gets another token")
        if sum(len(k) + len(v) for k, v in env.items()) > 1_000_000:
            raise ValueError("the variables hold more than 1 MB")
        return env


class AttemptOut(BaseModel):
    attempt: int
    started_at: float
    ended_at: float | None
    outcome: str | None
    exit_code: int | None
    pid: int | None
    step: int | None
    phase: str | None
    last_checkpoint_at: float | None
    notice_at: float | None
    notice_deadline: float | None
    notice_for: int | None

    @classmethod
    def of(cls, row: AttemptRow) -> AttemptOut:
        return cls.model_validate(row, from_attributes=True)


class InterruptionOut(BaseModel):
    """One interruption and what it cost, in GPU-seconds (docs: gpupool.accounting)."""

    attempt: int
    at: float
    cause: str
    reason: str
    wasted: float
    drain: float
    restart: float | None
    lost: float
    delay: float | None
    """Seconds in line before the next attempt (not GPU time); None while it still waits."""

    @classmethod
    def of(cls, cut: Interruption) -> InterruptionOut:
        return cls.model_validate(cut, from_attributes=True)


class AccountOut(BaseModel):
    """A job's GPU-seconds by what they went to, per attempt, and its interruptions."""

    allocated: float
    productive: float
    unreported: float
    """GPU-seconds of attempts that never reported their progress (left out of goodput)."""
    goodput: float | None
    attempts: list[AttemptCost]
    interruptions: list[InterruptionOut]

    @classmethod
    def of(cls, job: JobAccount) -> AccountOut:
        return cls(
            allocated=job.allocated,
            productive=job.productive,
            unreported=job.unreported,
            goodput=job.goodput,
            attempts=list(job.attempts),
            interruptions=[InterruptionOut.of(i) for i in job.interruptions],
        )


class TotalsOut(BaseModel):
    jobs: int
    allocated: float
    productive: float
    goodput: float | None
    startup: float
    checkpoint: float
    drain: float
    wasted: float
    unreported: float
    """GPU-seconds of jobs that never reported their progress: neither productive nor wasted."""
    interruptions: int
    lost: float
    causes: dict[str, int]

    @classmethod
    def of(cls, totals: Totals) -> TotalsOut:
        fields = {name: getattr(totals, name) for name in cls.model_fields}
        return cls(**fields)


class JobInterruptionOut(InterruptionOut):
    job: int
    team: str
    priority: str


class ReportOut(BaseModel):
    """The pool's accounting since a time: GPU-seconds, goodput and interruptions, for the pool,
    per team and per class."""

    since: float | None
    until: float
    pool: TotalsOut
    teams: dict[str, TotalsOut]
    users: dict[str, TotalsOut]
    """Per user who submitted (jobs of no known user under "(none)")."""
    classes: dict[str, TotalsOut]
    interruptions: list[JobInterruptionOut]


class JobOut(BaseModel):
    id: int
    name: str
    team: str
    priority: str
    state: str
    gpus: int
    gpus_per_node: int | None
    gpu_type: str | None
    command: list[str]
    workdir: str
    submit_time: float
    attempts: int
    preemptions: int
    failures: int
    ended_at: float | None
    exit_code: int | None
    wait_reason: str | None
    wait_message: str | None
    time_limit: float | None
    run_seconds: float
    """Run time of its ended attempts (what counts against `time_limit`, with the live one's)."""
    user: str | None
    dependencies: list[list[Any]] | None
    dependency_met_at: float | None
    array_id: int | None
    array_index: int | None
    array_limit: int | None
    output: str | None
    error: str | None
    """Its `-o`/`-e` paths as given (patterns unexpanded), if any."""
    task: str | None = None
    """`ARRAY_INDEX` for a task of a job array (Slurm's form), else None."""
    placement: dict[str, list[int]] = Field(default_factory=dict)
    running_since: float | None = None
    """Start of its live attempt, if it has one."""
    history: list[AttemptOut] = Field(default_factory=list)
    account: AccountOut | None = None
    """With `show`: GPU-seconds by bucket and each interruption's cost."""

    @classmethod
    def of(cls, row: JobRow, **extra: Any) -> JobOut:
        fields = {name: getattr(row, name) for name in cls.model_fields if hasattr(row, name) and name not in extra}
        if row.array_id is not None:
            fields["task"] = f"{row.array_id}_{row.array_index}"
        return cls(**fields, **extra)


class TeamIn(_In):
    """A partial update: only the fields sent change (a new team starts from weight 1, no
    guarantee, every class). `classes: null` allows every class again."""

    weight: float | None = Field(default=None, gt=0)
    guaranteed_gpus: int | None = Field(default=None, ge=0, le=MANY)
    classes: list[str] | None = Field(default=None, max_length=100)
    """Priority classes the team may use; null for all."""
    new_token: bool = False


class BudgetOut(BaseModel):
    priority: str
    gpu_hours: float
    window: float
    used_gpu_hours: float
    """GPU-hours spent at this class inside the window (metered at the class attempts ran at)."""


class TeamOut(BaseModel):
    name: str
    weight: float
    guaranteed_gpus: int
    classes: list[str] | None
    using_gpus: int = 0
    """GPUs its live attempts hold now."""
    pending_jobs: int = 0
    budgets: list[BudgetOut] = Field(default_factory=list)
    token: str | None = None
    """Only when a token was just made: it is not stored and cannot be shown again."""


class GpuOut(BaseModel):
    gpu: int
    state: str
    """idle, allocated, draining (its job has notice), held (free, kept for a preemptor)."""
    job: int | None
    team: str | None
    user: str | None
    for_job: int | None
    """For draining and held GPUs: the job they are freed or kept for."""
    task: str | None
    """`ARRAY_INDEX` when the holder is a task of a job array."""


class NodeOut(BaseModel):
    name: str
    gpus: int
    gpu_type: str
    virtual: bool
    gpu_states: list[GpuOut]


class PoolOut(BaseModel):
    nodes: list[NodeOut]
    gpus: int
    busy: int
    """GPUs held by live attempts (allocated or draining)."""


class UserIn(_In):
    team: str | None = Field(default=None, max_length=200)
    """The user's team: needed for a new user; given for an old one, it moves them."""
    new_token: bool = False


class UserOut(BaseModel):
    name: str
    team: str
    token: str | None = None
    """Only when a token was just made: it is not stored and cannot be shown again."""


class HeartbeatIn(_In):
    step: int | None = None
    phase: str | None = Field(default=None, pattern="^(startup|restore|train|save)$")
    restored_step: int | None = Field(default=None, ge=0, description="the checkpoint step this attempt resumed from")
    restore_seconds: float | None = Field(default=None, ge=0, description="how long the restore took")
    since_commit: float | None = Field(default=None, ge=0, description="seconds since its last checkpoint commit")
    restore_skipped: list[str] = Field(
        default_factory=list, max_length=20, description="newer checkpoints it could not use, and why"
    )


class NoticeOut(BaseModel):
    deadline: float
    seconds_left: float


class HeartbeatOut(BaseModel):
    notice: NoticeOut | None


class CheckpointIn(_In):
    step: int | None = None
    path: str | None = None
    seconds: float | None = Field(default=None, ge=0, description="how long the save blocked training")


class EventOut(BaseModel):
    id: int
    time: float
    kind: str
    job_id: int | None
    attempt: int | None
    reason: str | None
    message: str


class ErrorOut(BaseModel):
    error: str
    message: str
