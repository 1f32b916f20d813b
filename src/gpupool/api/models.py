"""What the HTTP API takes and returns."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpupool.store.schema import AttemptRow, JobRow


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobIn(_In):
    command: list[str] = Field(min_length=1)
    team: str | None = None
    """Defaults to the team of the token (or `default` for the admin)."""
    priority: str = "normal"
    gpus: int = Field(default=1, ge=1)
    gpus_per_node: int | None = Field(default=None, ge=1)
    gpu_type: str | None = None
    name: str = ""
    workdir: str = "."
    env: dict[str, str] = Field(default_factory=dict)
    max_failures: int = Field(default=0, ge=0)
    max_preemptions: int | None = Field(default=None, ge=0)


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
    placement: dict[str, list[int]] = Field(default_factory=dict)
    running_since: float | None = None
    """Start of its live attempt, if it has one."""
    history: list[AttemptOut] = Field(default_factory=list)

    @classmethod
    def of(cls, row: JobRow, **extra: Any) -> JobOut:
        fields = {name: getattr(row, name) for name in cls.model_fields if hasattr(row, name) and name not in extra}
        return cls(**fields, **extra)


class TeamIn(_In):
    weight: float = Field(default=1.0, gt=0)
    guaranteed_gpus: int = Field(default=0, ge=0)
    classes: list[str] | None = None
    """Priority classes the team may use; all when omitted."""
    new_token: bool = False


class TeamOut(BaseModel):
    name: str
    weight: float
    guaranteed_gpus: int
    classes: list[str] | None
    token: str | None = None
    """Only when a token was just made: it is not stored and cannot be shown again."""


class HeartbeatIn(_In):
    step: int | None = None
    phase: str | None = Field(default=None, pattern="^(startup|restore|train|save)$")


class NoticeOut(BaseModel):
    deadline: float
    seconds_left: float


class HeartbeatOut(BaseModel):
    notice: NoticeOut | None


class CheckpointIn(_In):
    step: int | None = None
    path: str | None = None


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
