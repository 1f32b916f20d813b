"""The API's models of the pool rather than of one job: teams, their budgets and users, the
GPUs and who holds them, the priority classes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import BaseModel, Field

from gpupool.api.models import MANY, _In
from gpupool.store.schema import BudgetRow


class TeamIn(_In):
    """A partial update: only the fields sent change (a new team starts from weight 1, no
    guarantee, every class). `classes: null` allows every class again."""

    weight: float | None = Field(default=None, gt=0, le=MANY)
    guaranteed_gpus: int | None = Field(default=None, ge=0, le=MANY)
    classes: list[Annotated[str, Field(max_length=100)]] | None = Field(default=None, max_length=100)
    """Priority classes the team may use; null for all."""
    new_token: bool = False


class BudgetIn(_In):
    """A team's budget at a class: GPU-hours per sliding window."""

    gpu_hours: float = Field(gt=0, le=MANY, allow_inf_nan=False)
    window: float = Field(gt=0, le=10 * 365 * 86400, allow_inf_nan=False)
    """Seconds: the sliding window the GPU-hours are counted over."""


class BudgetOut(BaseModel):
    priority: str
    gpu_hours: float
    window: float
    used_gpu_hours: float
    """GPU-hours spent at this class inside the window (metered at the class attempts ran at)."""

    @classmethod
    def of(cls, row: BudgetRow, spent: Mapping[tuple[str, str], float]) -> BudgetOut:
        """The budget, with its use from `spent` (GPU-seconds per (team, class), `budget_use`)."""
        used = spent.get((row.team, row.priority), 0.0) / 3600
        return cls(priority=row.priority, gpu_hours=row.gpu_hours, window=row.window, used_gpu_hours=used)


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
    """idle, allocated, draining (its job has notice), held (free, kept for a preemptor), dirty
    (free, but a process of no live attempt holds it: no job is given it until that ends)."""
    job: int | None
    team: str | None
    user: str | None
    for_job: int | None
    """For draining and held GPUs: the job they are freed or kept for."""
    job_label: str | None
    """The holder as people name it: `ARRAYID_INDEX` for a task of an array, else its id."""
    for_label: str | None
    """`for_job` as people name it."""
    dirty: str | None = None
    """The process of no live attempt on it, where NVML sees one, and its owner: `pid 4242
    (ana)`."""


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


class ClassOut(BaseModel):
    name: str
    value: int
    may_preempt: bool
    preemptible: bool
    min_runtime: float
    grace_period: float
    time_limit: float | None = None
    """A job's time limit when it gives none."""
    idle_after: float | None = None
    """A session idle this long is warned, then reclaimed (`on_idle`); null: never."""
    on_idle: str | None = None
