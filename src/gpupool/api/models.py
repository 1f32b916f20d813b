"""What the HTTP API takes and returns. Inputs are strict (`true` is no number, `"x"` no
boolean; an integer is a number of seconds) and bounded by what the store holds and what the
system takes when the job starts (`limits`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from gpupool.accounting import AttemptCost, Interruption, JobAccount, Totals
from gpupool.api import limits
from gpupool.settle import JobState
from gpupool.store.jobs import job_name
from gpupool.store.schema import AttemptRow, EventRow, JobRow
from gpupool.units import MAX_MEMORY, MIN_MEMORY, parse_memory


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


MANY = 1_000_000
"""Upper bound of counts (the store keeps 32-bit integers)."""


def memory_in(value: object) -> int:
    """Bytes from an integer (bytes) or Slurm's text (`16G`; a bare number is megabytes)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not MIN_MEMORY <= value <= MAX_MEMORY:
            raise ValueError(f"{value} bytes: give from 16M ({MIN_MEMORY}) to 1024T")
        return value
    if isinstance(value, str):
        return parse_memory(value)
    raise ValueError(f"{value!r} is not an amount of memory (bytes, or a string such as 16G)")


MemoryIn = Annotated[int, BeforeValidator(memory_in), Field(strict=False)]

Step = Annotated[int, Field(ge=0, le=limits.INT32)]
Text = Annotated[str, Field(max_length=200)]
Seconds = Annotated[float, Field(ge=0, le=1e9)]
PhaseName = Annotated[str, Field(min_length=1, max_length=40, pattern=r"^[^\x00-\x1f\x7f]+$")]


def no_nul(value: str | None) -> str | None:
    if value is not None and "\0" in value:
        raise ValueError("holds a NUL character")
    return value


class JobUpdateIn(_In):
    """What a person changes of a job after submitting it, as scontrol update: only the fields
    sent change."""

    time_limit: float | None = Field(default=None, gt=0, le=10 * 365 * 86400)
    """Seconds of run time over all attempts. A team's or user's token only lowers it (or sets
    one where there was none); the admin's also raises it."""
    priority: str | None = Field(default=None, max_length=100)
    """A class the job's team may use; while it waits."""
    after: str | None = Field(default=None, max_length=10_000)
    """Its dependencies, replaced, as at submit (`""`: none); while it waits."""


class JobIn(_In):
    command: list[str] = Field(min_length=1, max_length=limits.ARGUMENTS)
    """The program and its arguments (1 MB in all, 128 KiB each; the program a path the system takes)."""
    team: str | None = Field(default=None, max_length=200)
    """Defaults to the team of the token (or `default` for the admin)."""
    priority: str | None = Field(default=None, max_length=100)
    """Its class; by default `normal`, or the sessions' class (`sessions.priority`) for a session."""
    gpus: int = Field(default=1, ge=1, le=MANY)
    """GPUs, all or nothing; an elastic job's largest size."""
    sizes: list[Annotated[int, Field(ge=1, le=MANY)]] | None = Field(default=None, max_length=1024)
    """An elastic job's sizes in GPUs, smallest first, `gpus` the largest (`--gpus 4-16`): it
    starts at the largest that is free, or waits for its smallest; it may be shrunk down to its
    smallest instead of evicted, and grows back into GPUs nobody waits for (docs/elastic.md)."""
    gpus_per_node: int | None = Field(default=None, ge=1, le=MANY)
    gpu_type: str | None = Field(default=None, max_length=100)
    name: str = Field(default="", max_length=200)
    workdir: str = Field(default=".", max_length=limits.PATH_MAX)
    env: dict[str, str] = Field(default_factory=dict, max_length=limits.VARIABLES)
    """The job's variables (the command line sends the submitter's environment, as sbatch):
    1 MB in all, 128 KiB each `NAME=value`."""
    max_failures: int = Field(default=0, ge=0, le=MANY)
    max_preemptions: int | None = Field(default=None, ge=0, le=MANY)
    time_limit: float | None = Field(default=None, gt=0, le=10 * 365 * 86400)
    """Seconds of run time over all attempts (a preemption's drain not counted); at the limit the
    job gets notice and its class's grace, then ends as `timeout`."""
    notify: str | None = Field(default=None, max_length=2000)
    """A URL the scheduler POSTs to when the job starts, ends and gets notice: Slack-compatible
    JSON, `{"text": ..., "gpupool": {...}}` (docs/configuration.md, `webhooks`)."""
    after: str | None = Field(default=None, max_length=10_000)
    """Dependencies in Slurm's words: `12`, `ok:12:13`, `notok:12`, `any:12,ok:14` (a bare id is
    `ok`); an array's id stands for all its tasks. The job waits; one that can never be met
    cancels it, saying why."""
    array: str | None = Field(default=None, max_length=10_000)
    """A job array: `0-99%8` is 100 tasks, at most 8 at once; each gets GPUPOOL_ARRAY_INDEX."""
    script: str | None = Field(default=None, max_length=limits.SCRIPT_CHARS)
    """A batch script's text, run in place of `command[0]` (the rest are its arguments); as
    sbatch's, its first line is `#!` and its interpreter."""
    output: str | None = Field(default=None, max_length=limits.PATH_MAX)
    error: str | None = Field(default=None, max_length=limits.PATH_MAX)
    """Paths of standard output and error, relative to `workdir`: `%j` job, `%A` array, `%a`
    index, `%t` attempt, `%x` name, `%%`. Without `error`, errors go to `output`."""
    user: str | None = Field(default=None, max_length=200)
    """Who submits it: the admin's command line sends its OS user; a team's token has its own."""
    mem: MemoryIn | None = None
    """Memory on each node, as bytes or Slurm's form (`16G`, `512M`; a bare number in a string
    is megabytes): the job's cgroup limit there. With `mem_per_gpu`, refused."""
    mem_per_gpu: MemoryIn | None = None
    """Memory for each GPU (the default: a node's memory divided by its GPUs)."""
    cpus_per_gpu: float | None = Field(default=None, gt=0, le=4096)
    """CPUs for each GPU: a weight or a cap, as the pool is configured."""
    session: Literal["run", "shell", "notebook"] | None = None
    """`run`, `shell` (a terminal through `/jobs/{id}/terminal`) or `notebook`: a person waits
    on it. It gets the sessions' class when it names none, and is one job on one node (`run`
    may span nodes)."""

    @field_validator("team", "priority", "gpu_type", "name", "after", "array", "user")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        return no_nul(value)

    @field_validator("command")
    @classmethod
    def _runnable(cls, command: list[str]) -> list[str]:
        for i, arg in enumerate(command):
            if "\0" in arg:
                raise ValueError(f"argument {i} holds a NUL character")
            if len(arg.encode()) > limits.ARG_BYTES:
                raise ValueError(f"argument {i} is longer than {limits.ARG_BYTES} bytes")
        if sum(len(arg.encode()) for arg in command) > limits.COMMAND_BYTES:
            raise ValueError(f"the arguments hold more than {limits.COMMAND_BYTES} bytes")
        problem = limits.path_problem(command[0])
        if problem:
            raise ValueError(f"the program {problem}")
        return command

    @field_validator("env")
    @classmethod
    def _names_and_no_tokens(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not name or "=" in name or "\0" in name or "\0" in value:
                raise ValueError(f"{name!r} is not a variable name (or its value holds a NUL)")
            if len(name.encode()) + 1 + len(value.encode()) > limits.ARG_BYTES:
                raise ValueError(f"{name}=… is longer than {limits.ARG_BYTES} bytes")
        if "GPUPOOL_TOKEN" in env:
            raise ValueError("GPUPOOL_TOKEN is set by gpupool for each attempt: a job never gets another token")
        if sum(len(k.encode()) + 1 + len(v.encode()) for k, v in env.items()) > limits.ENV_BYTES:
            raise ValueError(f"the variables hold more than {limits.ENV_BYTES} bytes")
        return env

    @field_validator("workdir")
    @classmethod
    def _a_path(cls, workdir: str) -> str:
        problem = limits.path_problem(workdir)
        if problem:
            raise ValueError(problem)
        return workdir

    @field_validator("script")
    @classmethod
    def _a_script(cls, script: str | None) -> str | None:
        problem = limits.script_problem(script) if script is not None else None
        if problem:
            raise ValueError(problem)
        return script

    @model_validator(mode="after")
    def _launchable(self) -> JobIn:
        name = job_name(self.name, self.command)
        for field, template in (("output", self.output), ("error", self.error)):
            if template is None:
                continue
            problem = limits.path_problem(limits.widest(template, name))
            if problem:
                raise ValueError(f"{field}: {template[:50]!r} {problem} (patterns at their longest)")
        used = limits.exec_bytes(self.command, self.env)
        if used > limits.EXEC_BYTES:
            raise ValueError(f"command and env take {used} bytes of the {limits.EXEC_BYTES} a start may pass")
        if self.mem is not None and self.mem_per_gpu is not None:
            raise ValueError("mem and mem_per_gpu: give one of them, as Slurm's --mem and --mem-per-gpu")
        return self


class AttemptOut(BaseModel):
    attempt: int
    started_at: float
    gpus: int | None = None
    """The GPUs it ran on (an elastic job's size at this attempt)."""
    ended_at: float | None
    outcome: str | None
    exit_code: int | None
    handle: dict[str, Any] | None = Field(
        description="How the executor finds the attempt's processes: the local executor's launcher "
        "pid and start time, Ray's actor names."
    )
    step: int | None
    phase: str | None
    last_checkpoint_at: float | None
    notice_at: float | None
    notice_deadline: float | None
    notice_for: int | None
    restart: dict[str, Any] | None = Field(
        default=None,
        description="Where its start-up went, as the job reported it: process_started_at (Unix time), "
        "phases ({name: seconds}, in order), first_step and steady_step (seconds).",
    )
    peak_memory: int | None = None
    """Bytes: the largest of its members' peak memory, as their cgroups counted (MaxRSS)."""
    cpu_seconds: float | None = None
    oom_kills: int | None = None
    """Processes the kernel killed because it reached its memory limit."""
    peak_gpu_memory: int | None = None
    """Bytes, where NVML counts it."""
    idle_seconds: float | None = None
    """A session's: seconds it held its GPUs with no activity (stretches of `idle_counts_after` or more)."""

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
    restart_phases: dict[str, float] = Field(
        default_factory=dict, description="`restart` by phase (GPU-seconds), where the job reported them"
    )

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
    background: float
    """GPU-seconds that background checkpoint writes overlapped training (not lost)."""
    interruptions: int
    lost: float
    causes: dict[str, int]
    restart_phases: dict[str, float]
    """GPU-seconds of restarts after interruptions, by phase, where the jobs reported them."""
    cpu_seconds: float = 0.0
    """CPU time of the attempts whose cgroups counted it."""
    peak_memory: int | None = None
    """Bytes: the largest attempt's peak memory (MaxRSS)."""
    peak_gpu_memory: int | None = None
    """Bytes: the largest attempt's peak GPU memory, where NVML counted it."""
    idle: float = 0.0
    """GPU-seconds sessions (shells, notebooks) held with no activity (docs/sessions.md)."""

    @classmethod
    def of(cls, totals: Totals) -> TotalsOut:
        fields = {name: getattr(totals, name) for name in cls.model_fields}
        return cls(**fields)


class JobInterruptionOut(InterruptionOut):
    job: int
    job_label: str
    """The job as people name it: `ARRAYID_INDEX` for a task of an array, else its id."""
    team: str
    priority: str
    job_ended: bool
    """The job has ended: an interruption with no next attempt (`delay` null) never gets one."""


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


class _Out(BaseModel):
    # Every field is in every answer: the document says so (and `brief` can discriminate).
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)


class JobOut(_Out):
    """A job in full: what its own team (and the admin) sees."""

    brief: Literal[False] = False
    id: int
    label: str
    """The job as people name it: `ARRAYID_INDEX` for a task of an array, else its id."""
    name: str
    team: str
    priority: str
    state: str
    gpus: int
    """What it asks for: an elastic job's largest size (its live attempt's size is that
    attempt's `gpus`)."""
    sizes: list[int] | None = None
    """An elastic job's sizes, smallest first; null for a job of one size."""
    gpus_per_node: int | None
    gpu_type: str | None
    command: list[str]
    workdir: str
    submit_time: float
    attempts: int
    preemptions: int
    failures: int
    node_losses: int = 0
    ended_at: float | None
    exit_code: int | None
    wait_reason: str | None
    wait_message: str | None
    """Why it waits: a pending job's only (null once it has started or ended)."""
    time_limit: float | None
    run_seconds: float
    """Run time of its ended attempts (what counts against `time_limit`, with the live one's)."""
    mem: int | None = None
    mem_per_gpu: int | None = None
    cpus_per_gpu: float | None = None
    """What it asked besides GPUs (None: the pool's default)."""
    session: str | None = None
    """`run`, `shell` or `notebook` for a session; null for a batch job."""
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
        fields.pop("brief", None)
        fields["label"] = row.label
        if row.state != JobState.PENDING.value:  # why it waited, before it started or ended
            fields["wait_reason"] = fields["wait_message"] = None
        if row.array_id is not None:
            fields["task"] = fields["label"]
        return cls(**fields, **extra)

    @classmethod
    def as_submitted(cls, row: JobRow) -> JobOut:
        """The job as its submission made it, whatever happened since: the answer to the
        submission, given again to a retry of it (same Idempotency-Key)."""
        return cls.of(row).model_copy(update=SUBMITTED)


SUBMITTED: dict[str, Any] = {
    "state": "pending",
    "attempts": 0,
    "preemptions": 0,
    "failures": 0,
    "ended_at": None,
    "exit_code": None,
    "wait_reason": None,
    "wait_message": None,
    "run_seconds": 0.0,
    "dependency_met_at": None,
}
"""What a new job's changing fields hold when it is submitted."""


class JobBriefOut(_Out):
    """Another team's job, as a team's token sees it in a listing (docs/access.md)."""

    brief: Literal[True] = True
    id: int
    label: str
    """The job as people name it: `ARRAYID_INDEX` for a task of an array, else its id."""
    team: str
    priority: str
    state: str
    gpus: int

    @classmethod
    def of(cls, row: JobRow) -> JobBriefOut:
        return cls(id=row.id, label=row.label, team=row.team, priority=row.priority, state=row.state, gpus=row.gpus)


JobListed = Annotated[JobOut | JobBriefOut, Field(discriminator="brief")]
"""A job in a listing: in full (`brief: false`) or brief (`brief: true`)."""


class EventOut(BaseModel):
    id: int
    time: float
    kind: str
    job_id: int | None
    job_label: str | None
    """Its job as people name it: `ARRAYID_INDEX` for a task of an array, else its id."""
    attempt: int | None
    reason: str | None
    message: str

    @classmethod
    def of(cls, row: EventRow, labels: Mapping[int, str]) -> EventOut:
        """The event, its job named as in `labels` (`Store.labels`)."""
        label = None if row.job_id is None else labels.get(row.job_id, str(row.job_id))
        return cls(
            id=row.id,
            time=row.time,
            kind=row.kind,
            job_id=row.job_id,
            job_label=label,
            attempt=row.attempt,
            reason=row.reason,
            message=row.message,
        )


class ErrorOut(BaseModel):
    """Every error: its kind (`InvalidInput`, `Unauthorized`, `Forbidden`, `NotFound`,
    `Conflict`, `TooLarge`, `Unavailable`, `InternalError`) and what was wrong, for people."""

    error: str
    message: str


class HealthOut(BaseModel):
    status: Literal["ok", "unavailable"]
    store: str
    """`ok`, or what the store answered."""
