"""Priority classes, teams and policy options, from one YAML file (or the embedded defaults).

    classes:                       # replaces the defaults when given
      urgent: {value: 1000, may_preempt: true, preemptible: false, grace_period: 60s}
      low:    {value: 0, may_preempt: false, preemptible: true, min_runtime: 2m}
      interactive: {value: 500, may_preempt: true, preemptible: false, time_limit: 8h,
                    idle_after: 1h, on_idle: end}   # or requeue; a class may give neither
    teams:
      nlp: {weight: 2, guaranteed_gpus: 16, budgets: {high: {gpu_hours: 100, window: 7d}}}
    policy:
      queue: backfill              # or strict
      reclaim: true                # a team below its guarantee takes it back
      priority_preemption: pool    # or team, above_guarantee: whose jobs a class preempts
      fair_share: off              # or preempt: a lower weighted share takes from the highest
      seniority_after: null        # e.g. 2h: a job waiting that long preempts smaller jobs
                                   # of its class or lower submitted after it
      max_preemptions: 10          # per job; null for no cap
      max_node_losses: 3           # per job: requeues after a node it ran on was lost
      placement: best-fit          # or first-fit: the node a job takes among those it fits
      explain_depth: 1000          # why a job waits is worked out for the first 1000 in
                                   # line at each decision; null: for every one
    service:                       # `gpupool up`
      data_dir: ~/.gpupool         # store, logs, checkpoints, the admin token
      host: 127.0.0.1
      port: 8470
      api_url: null                # where jobs and clients reach the API; null: http://host:port
      virtual_gpus: 4              # used when NVML finds no GPU; at most 4096
      store: null                  # a PostgreSQL URL; null is SQLite in data_dir
      run_as: submitter            # service | submitter | team: the OS user jobs run as
      job_user: null               # its name: {user} and {team} are replaced; null is
                                   # {user} for submitter, gpupool-{team} for team
      executor: local              # or ray: every node of a Ray cluster (docs/cluster.md)
      ray_address: auto            # the Ray cluster's host:port; auto is this machine's
      start_timeout: 60s           # ray: a gang not running by then is placed again
      containment:                 # each attempt in a cgroup (docs/containment.md)
        mode: auto                 # auto | cgroups (required) | off (process groups)
        cgroup_root: gpupool       # under each cgroup hierarchy's root
        mem_per_gpu: null          # default --mem-per-gpu, e.g. 24G; null: a node's
                                   # memory divided by its GPUs
        cpus_per_gpu: null         # default --cpus-per-gpu; null: a node's CPUs / GPUs
        cpu_limit: weight          # or quota: CPUs as a share when busy, or as a cap
        pids: 16384                # processes and threads of one member, at most
        gpu_devices: /dev/nvidia{index}   # each GPU's device node, fenced per job
    sessions:                      # gpupool run, shell, notebook (docs/sessions.md)
      priority: null               # the class of a session that names none; null:
                                   # interactive if there is one, else normal
      detach_grace: 10m            # a shell with no terminal attached ends after this
      idle_notice: 5m              # an idle session is warned this long before its reclaim
      idle_counts_after: 5m        # no activity for this long counts as idle GPU-time

Durations are seconds or a number with a unit: `90s`, `30m`, `1.5h`, `7d`; at most 10 years.

Every value is checked before anything is made, and bounded by what the store holds: a class
`value` fits a 32-bit signed integer (-2147483648 to 2147483647), a team's `weight` is finite,
above 0 and at most 1,000,000, `guaranteed_gpus` at most 1,000,000, `gpu_hours` finite and at
most 1,000,000,000, `max_preemptions` and `max_node_losses` at most 2147483647. `store` must be a `sqlite:///PATH` or
`postgresql://` URL. A key given twice in one mapping is refused with its line.
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpupool.errors import InvalidInput
from gpupool.model import (
    DEFAULT_CLASSES,
    Config,
    FairShare,
    PlacementRule,
    PriorityBudget,
    PriorityClass,
    PriorityScope,
    QueueMode,
    QueueOrder,
    SessionPolicy,
    Team,
)
from gpupool.units import parse_duration, parse_memory


class ConfigError(InvalidInput, ValueError):
    """A configuration that cannot be used; the message names the file and the key."""


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


def build(spec: ConfigSpec) -> Config:
    if spec.classes is None:
        classes = DEFAULT_CLASSES
    else:
        classes = tuple(
            PriorityClass(
                name,
                c.value,
                c.may_preempt,
                c.preemptible,
                c.min_runtime,
                c.grace_period,
                c.time_limit,
                c.idle_after,
                c.on_idle,
            )
            for name, c in sorted(spec.classes.items(), key=lambda item: -item[1].value)
        )
    teams = {
        name: Team(
            name,
            t.weight,
            t.guaranteed_gpus,
            tuple(PriorityBudget(cls, b.gpu_hours, b.window) for cls, b in t.budgets.items()),
        )
        for name, t in spec.teams.items()
    }
    p = spec.policy
    return Config(
        classes,
        teams,
        p.order,
        p.queue,
        p.preemption,
        p.reclaim,
        p.max_preemptions,
        p.max_node_losses,
        priority_preemption=p.priority_preemption,
        fair_share=p.fair_share,
        seniority_after=p.seniority_after,
        placement=p.placement,
        explain_depth=p.explain_depth,
        sessions=SessionPolicy(
            spec.sessions.priority or ("interactive" if any(c.name == "interactive" for c in classes) else "normal"),
            spec.sessions.detach_grace,
            spec.sessions.idle_notice,
            spec.sessions.idle_counts_after,
        ),
    )


def parse_spec(data: Any, source: str = "config") -> ConfigSpec:
    """The whole file, validated; errors name `source` and the key that is wrong."""
    if data is None:
        data = {}
    try:
        return ConfigSpec.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"])
            message = str(error["msg"]).removeprefix("Value error, ")
            shown = error["input"]
            if error["loc"] == ("service", "store") and isinstance(shown, str):
                shown = _masked(shown)
            got = f" (got {shown!r})" if where and not isinstance(shown, dict) else ""
            problems.append(f"{source}: {where + ': ' if where else ''}{message}{got}")
        raise ConfigError("\n".join(problems)) from None


def _masked(url: str) -> str:
    """`url` with its password replaced by `***`, also when it does not parse."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def parse(data: Any, source: str = "config") -> Config:
    """The scheduling `Config` from parsed YAML."""
    return build(parse_spec(data, source))


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a key given twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` merges; its keys may be overridden
            key = self.construct_object(key_node, deep=deep)
            try:
                line = first.get(key)
            except TypeError:
                continue  # unhashable: the constructor says so
            if line is not None:
                raise _DuplicateKey(
                    None, None, f"duplicate key {key!r} (first on line {line + 1})", key_node.start_mark
                )
            first[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


# Booleans as YAML 1.2 has them, true and false alone: `fair_share: off` and `mode: off` are the
# word off, as the documentation writes them, not YAML 1.1's false (nor yes, no, on).
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


SYSTEM_CONFIG = Path("/etc/gpupool")
"""Where an admin puts the service's file (`gpupool.yaml`) and the users' (`client.yaml`)."""


def client_config(given: Path | None, environ: Mapping[str, str], system: Path = SYSTEM_CONFIG) -> Path | None:
    """The file the command line reads to reach the service: `--config`, else
    `$GPUPOOL_CONFIG`, else the machine's `client.yaml`, else the service's own `gpupool.yaml`
    there (its `service.api_url`, or host and port, and its data directory), else none (the
    embedded defaults)."""
    if given is not None:
        return given
    if environ.get("GPUPOOL_CONFIG"):
        return Path(environ["GPUPOOL_CONFIG"])
    return next((p for p in (system / "client.yaml", system / "gpupool.yaml") if os.access(p, os.R_OK)), None)


def service_config(given: Path | None, environ: Mapping[str, str], system: Path = SYSTEM_CONFIG) -> Path | None:
    """The file `gpupool up` runs with: `--config`, else `$GPUPOOL_CONFIG`, else the machine's
    `gpupool.yaml`, else none (the embedded defaults)."""
    if given is not None:
        return given
    if environ.get("GPUPOOL_CONFIG"):
        return Path(environ["GPUPOOL_CONFIG"])
    return system / "gpupool.yaml" if (system / "gpupool.yaml").exists() else None


def load_spec(path: Path | None) -> ConfigSpec:
    """The file at `path`, or the embedded defaults when `path` is None."""
    if path is None:
        return parse_spec({}, "defaults")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: builds only plain data
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        kind = "" if isinstance(exc, _DuplicateKey) else "not valid YAML: "
        raise ConfigError(f"{path}:{where}: {kind}{problem}") from None
    return parse_spec(data, str(path))


def load(path: Path | None) -> Config:
    """The scheduling `Config` in `path`, or the embedded defaults when `path` is None."""
    return build(load_spec(path))
