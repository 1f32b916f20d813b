"""What the configuration file may say (pydantic models, each field bounded by what the store
holds and the system takes), and the checks of its values that are more than a bound: a store
URL, a user-name template, a webhook's URL. Reading the file and building the core's `Config`
from it is `gpupool.config`'s."""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from gpupool.model import DEFAULT_CLASSES, FairShare, PlacementRule, PriorityScope, QueueMode, QueueOrder
from gpupool.units import parse_duration, parse_memory

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
"""What the store's Integer columns hold on PostgreSQL (a class value, a count)."""
MAX_DURATION = 10 * 365 * 86400.0
"""Ten years, in seconds: the longest duration a configuration may give."""
MAX_VIRTUAL_GPUS = 4096
MAX_WEIGHT = 1e6
MAX_GUARANTEED_GPUS = 1_000_000
MAX_GPU_HOURS = 1e9
EXPLAIN_DEPTH = 1000
"""Jobs in line whose wait a decision explains, by default (`policy.explain_depth`)."""
STORE_BACKENDS = {"sqlite": "pysqlite", "postgresql": "psycopg"}
"""The store URLs gpupool opens: backend, and the one driver it has."""
RUN_AS = ("service", "submitter", "team")
JOB_USER_PLACEHOLDERS = ("user", "team")
POSIX_USER = re.compile(r"^[a-z_][a-z0-9_-]*$")
POSIX_USER_LENGTH = 32
"""The longest user name Linux's useradd accepts."""


def _bounded_duration(value: object) -> float:
    seconds = parse_duration(value)
    if seconds > MAX_DURATION:
        raise ValueError(f"{value!r} is more than 10 years")
    return seconds


Duration = Annotated[float, BeforeValidator(_bounded_duration)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClassSpec(_Strict):
    value: int = Field(ge=INT32_MIN, le=INT32_MAX)
    may_preempt: bool
    preemptible: bool
    min_runtime: Duration = 0.0
    grace_period: Duration = 30.0
    time_limit: Duration | None = Field(default=None, gt=0)
    idle_after: Duration | None = Field(default=None, gt=0)
    on_idle: Literal["end", "requeue"] = "end"


class SessionsSpec(_Strict):
    priority: str | None = Field(default=None, max_length=100)
    """None: `interactive` where the classes have it, else `normal`, as for any job."""
    detach_grace: Duration = Field(default=600.0, gt=0)
    idle_notice: Duration = 300.0
    idle_counts_after: Duration = 300.0


class ElasticSpec(_Strict):
    min_time_at_size: Duration = Field(default=600.0, ge=0)


class BudgetSpec(_Strict):
    gpu_hours: float = Field(ge=0, le=MAX_GPU_HOURS, allow_inf_nan=False)
    window: Duration


class TeamSpec(_Strict):
    weight: float = Field(default=1.0, gt=0, le=MAX_WEIGHT, allow_inf_nan=False)
    guaranteed_gpus: int = Field(default=0, ge=0, le=MAX_GUARANTEED_GPUS)
    budgets: dict[str, BudgetSpec] = Field(default_factory=dict)


class PolicySpec(_Strict):
    order: QueueOrder = QueueOrder.PRIORITY
    queue: QueueMode = QueueMode.BACKFILL
    preemption: bool = True
    reclaim: bool = True
    max_preemptions: int | None = Field(default=10, ge=0, le=INT32_MAX)
    max_node_losses: int = Field(default=3, ge=0, le=INT32_MAX)
    priority_preemption: PriorityScope = PriorityScope.POOL
    fair_share: FairShare = FairShare.OFF
    seniority_after: Duration | None = None
    placement: PlacementRule = PlacementRule.BEST_FIT
    explain_depth: int | None = Field(default=EXPLAIN_DEPTH, ge=0, le=INT32_MAX)


WEBHOOK = re.compile(r"https?://[^\s/?#@]+(/[^\s#]*)?")


Memory = Annotated[int, BeforeValidator(parse_memory)]
CGROUP_ROOT = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
MAX_PIDS = 4_194_304
"""Linux's largest pid_max."""


class ContainmentSpec(_Strict):
    """How attempts are contained (cgroups), and what a job gets when it does not say."""

    mode: Literal["auto", "cgroups", "off"] = "auto"
    """auto: cgroups where this host allows them (root, the controllers), else process groups,
    said at start; cgroups: refuse to start without them; off: process groups."""
    cgroup_root: str = Field(default="gpupool", max_length=200)
    mem_per_gpu: Memory | None = None
    cpus_per_gpu: float | None = Field(default=None, gt=0, le=4096, allow_inf_nan=False)
    cpu_limit: Literal["weight", "quota"] = "weight"
    pids: int = Field(default=16384, ge=16, le=MAX_PIDS)
    gpu_devices: str = Field(default="/dev/nvidia{index}", max_length=300)

    @field_validator("cgroup_root")
    @classmethod
    def _relative_folder(cls, value: str) -> str:
        if not CGROUP_ROOT.fullmatch(value) or ".." in value.split("/"):
            raise ValueError("must be a relative folder of letters, digits, '.', '_' and '-', such as gpupool")
        return value

    @field_validator("gpu_devices")
    @classmethod
    def _device_template(cls, value: str) -> str:
        if not value.startswith("/") or "{index}" not in value or value.replace("{index}", "").count("{"):
            raise ValueError("must be an absolute path with {index}, such as /dev/nvidia{index}")
        return value


def webhook_url(text: str) -> str:
    """`text` as a webhook's URL (`http://` or `https://`, no credentials in it), or a ValueError."""
    if len(text) > 2000 or not WEBHOOK.fullmatch(text):
        raise ValueError(f"{text[:100]!r} is not an http:// or https:// URL such as https://hooks.example/T0/B0")
    return text


class ServiceSpec(_Strict):
    data_dir: str = "~/.gpupool"
    host: str = "127.0.0.1"
    port: int = Field(default=8470, ge=1, le=65535)
    virtual_gpus: int = Field(default=4, ge=0, le=MAX_VIRTUAL_GPUS)
    store: str | None = None
    interval: Duration = 1.0
    run_as: Literal["service", "submitter", "team"] = "submitter"
    """The OS user jobs run as: the submitter's (the default), one per team, or the service's
    own (an explicit choice, for a machine with a single user: jobs then reach its data)."""
    job_user: str | None = None
    """That user's name, `{user}` and `{team}` replaced; None is `{user}` for submitter and
    `gpupool-{team}` for team (see `job_user_template`)."""
    api_url: str | None = Field(default=None, max_length=300)
    """The API's address for jobs and clients when `host` is not one they reach (`0.0.0.0`, a
    cluster's head): `http://head.example:8470`."""
    executor: Literal["local", "ray"] = "local"
    """Where attempts run: this machine's processes, or every node of a Ray cluster."""
    ray_address: str = Field(default="auto", max_length=300)
    webhooks: list[str] = Field(default_factory=list, max_length=20)
    """URLs told of every job's start, end and notices (Slack-compatible JSON), besides the
    URL a job names itself (`submit --notify`)."""
    start_timeout: Duration = Field(default=60.0, gt=0)
    """With Ray: a gang whose members are not all running by then is given back and placed again."""
    containment: ContainmentSpec = Field(default_factory=ContainmentSpec)

    @field_validator("store")
    @classmethod
    def _store_is_a_store_url(cls, value: str | None) -> str | None:
        if value is not None:
            check_store_url(value)
        return value

    @field_validator("webhooks")
    @classmethod
    def _webhooks_are_urls(cls, value: list[str]) -> list[str]:
        return [webhook_url(url) for url in value]

    @field_validator("api_url")
    @classmethod
    def _api_url_is_a_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^\s/?#@]+(/[^\s?#]*)?", value):
            raise ValueError("must be an http:// or https:// address such as http://head.example:8470")
        return value

    @field_validator("ray_address")
    @classmethod
    def _ray_address_is_an_address(cls, value: str) -> str:
        if value != "auto" and not re.fullmatch(r"(ray://)?[A-Za-z0-9_.\-]+:[0-9]{1,5}", value):
            raise ValueError("must be auto or the Ray head's host:port, such as head.example:6379")
        return value

    @field_validator("job_user")
    @classmethod
    def _job_user_is_a_user_name(cls, value: str | None) -> str | None:
        if value is not None:
            check_job_user(value)
        return value

    @model_validator(mode="after")
    def _job_user_needs_another_user(self) -> ServiceSpec:
        if self.job_user is not None and self.run_as == "service":
            raise ValueError("job_user is used only with run_as: submitter or team (jobs run as the service)")
        return self

    @property
    def job_user_template(self) -> str | None:
        """The OS user name of jobs, `{user}` and `{team}` to replace; None: the service's."""
        if self.run_as == "service":
            return None
        if self.job_user is not None:
            return self.job_user
        return "{user}" if self.run_as == "submitter" else "gpupool-{team}"

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()

    @property
    def url(self) -> str:
        """Where jobs and the command line reach the API."""
        return self.api_url.rstrip("/") if self.api_url is not None else f"http://{self.host}:{self.port}"


class ConfigSpec(_Strict):
    classes: dict[str, ClassSpec] | None = None
    teams: dict[str, TeamSpec] = Field(default_factory=dict)
    policy: PolicySpec = Field(default_factory=PolicySpec)
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    sessions: SessionsSpec = Field(default_factory=SessionsSpec)
    elastic: ElasticSpec = Field(default_factory=ElasticSpec)

    @model_validator(mode="after")
    def _budgets_name_known_classes(self) -> ConfigSpec:
        known = set(self.classes) if self.classes is not None else {c.name for c in DEFAULT_CLASSES}
        if self.sessions.priority is not None and self.sessions.priority not in known:
            raise ValueError(
                f"sessions.priority: unknown priority class {self.sessions.priority!r} (known: {', '.join(known)})"
            )
        for team, spec in self.teams.items():
            for cls in spec.budgets:
                if cls not in known:
                    raise ValueError(f"teams.{team}.budgets: unknown priority class {cls!r}")
        if self.classes is not None:
            if not self.classes:
                raise ValueError("classes: at least one priority class is needed")
            values = [c.value for c in self.classes.values()]
            if len(set(values)) != len(values):
                raise ValueError("classes: two priority classes share one value")
        return self


def check_store_url(url: str) -> None:
    """Refuse what is not a store URL gpupool can open (a ValueError that does not repeat it)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    usage = "use sqlite:///PATH or postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ValueError(f"not a sqlite or postgresql URL ({usage})") from None
    except ValueError as exc:  # a port that is not a number
        raise ValueError(f"not a store URL: {exc} ({usage})") from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend not in STORE_BACKENDS:
        raise ValueError(f"not a sqlite or postgresql URL ({usage})")
    if driver and driver != STORE_BACKENDS[backend]:
        raise ValueError(f"driver {driver!r}: gpupool opens {backend} with {STORE_BACKENDS[backend]} ({usage})")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise ValueError(f"port {parsed.port} is not in 1..65535")
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise ValueError("an in-memory SQLite store loses every job at exit: give a file, sqlite:///PATH")


def check_job_user(template: str) -> None:
    """A user-name template: only `{user}` and `{team}`, else a POSIX user name."""
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"{template!r}: {exc} (placeholders are {{user}} and {{team}})") from None
    for _literal, name, spec, conversion in fields:
        if name is None:
            continue
        if name not in JOB_USER_PLACEHOLDERS or spec or conversion:
            shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise ValueError(f"unknown placeholder {shown} in {template!r} (placeholders are {{user}} and {{team}})")
    sample = template.format(user="u", team="t")
    if not POSIX_USER.match(sample) or len(sample) > POSIX_USER_LENGTH:
        raise ValueError(
            f"{template!r} is not a POSIX user name: lower-case letters, digits, _ and -, not starting"
            f" with a digit or -, at most {POSIX_USER_LENGTH} characters, besides {{user}} and {{team}}"
        )
