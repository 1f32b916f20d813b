"""Priority classes, teams and policy options, from one YAML file (or the embedded defaults).

    classes:                       # replaces the defaults when given
      urgent: {value: 1000, may_preempt: true, preemptible: false, grace_period: 60s}
      low:    {value: 0, may_preempt: false, preemptible: true, min_runtime: 2m}
    teams:
      nlp: {weight: 2, guaranteed_gpus: 16, budgets: {high: {gpu_hours: 100, window: 7d}}}
    policy:
      queue: backfill              # or strict
      reclaim: true
      max_preemptions: 10          # per job; null for no cap
    service:                       # `gpupool up`
      data_dir: ~/.gpupool         # store, logs, checkpoints, the admin token
      host: 127.0.0.1
      port: 8470
      virtual_gpus: 4              # used when NVML finds no GPU
      store: null                  # a PostgreSQL URL; null is SQLite in data_dir

Durations are seconds or a number with a unit: `90s`, `30m`, `1.5h`, `7d`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from gpupool.errors import InvalidInput
from gpupool.model import DEFAULT_CLASSES, Config, PriorityBudget, PriorityClass, QueueMode, QueueOrder, Team
from gpupool.units import parse_duration


class ConfigError(InvalidInput, ValueError):
    """A configuration that cannot be used; the message names the file and the key."""


Duration = Annotated[float, BeforeValidator(parse_duration)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClassSpec(_Strict):
    value: int
    may_preempt: bool
    preemptible: bool
    min_runtime: Duration = 0.0
    grace_period: Duration = 30.0


class BudgetSpec(_Strict):
    gpu_hours: float = Field(ge=0)
    window: Duration


class TeamSpec(_Strict):
    weight: float = Field(default=1.0, gt=0)
    guaranteed_gpus: int = Field(default=0, ge=0)
    budgets: dict[str, BudgetSpec] = Field(default_factory=dict)


class PolicySpec(_Strict):
    order: QueueOrder = QueueOrder.PRIORITY
    queue: QueueMode = QueueMode.BACKFILL
    preemption: bool = True
    reclaim: bool = True
    max_preemptions: int | None = Field(default=10, ge=0)


class ServiceSpec(_Strict):
    data_dir: str = "~/.gpupool"
    host: str = "127.0.0.1"
    port: int = Field(default=8470, ge=1, le=65535)
    virtual_gpus: int = Field(default=4, ge=0)
    store: str | None = None
    interval: Duration = 1.0

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class ConfigSpec(_Strict):
    classes: dict[str, ClassSpec] | None = None
    teams: dict[str, TeamSpec] = Field(default_factory=dict)
    policy: PolicySpec = Field(default_factory=PolicySpec)
    service: ServiceSpec = Field(default_factory=ServiceSpec)

    @model_validator(mode="after")
    def _budgets_name_known_classes(self) -> ConfigSpec:
        known = set(self.classes) if self.classes is not None else {c.name for c in DEFAULT_CLASSES}
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


def build(spec: ConfigSpec) -> Config:
    if spec.classes is None:
        classes = DEFAULT_CLASSES
    else:
        classes = tuple(
            PriorityClass(name, c.value, c.may_preempt, c.preemptible, c.min_runtime, c.grace_period)
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
    return Config(classes, teams, p.order, p.queue, p.preemption, p.reclaim, p.max_preemptions)


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
            got = f" (got {error['input']!r})" if where and not isinstance(error["input"], dict) else ""
            problems.append(f"{source}: {where + ': ' if where else ''}{message}{got}")
        raise ConfigError("\n".join(problems)) from None


def parse(data: Any, source: str = "config") -> Config:
    """The scheduling `Config` from parsed YAML."""
    return build(parse_spec(data, source))


def load_spec(path: Path | None) -> ConfigSpec:
    """The file at `path`, or the embedded defaults when `path` is None."""
    if path is None:
        return parse_spec({}, "defaults")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}:{where}: not valid YAML: {problem}") from None
    return parse_spec(data, str(path))


def load(path: Path | None) -> Config:
    """The scheduling `Config` in `path`, or the embedded defaults when `path` is None."""
    return build(load_spec(path))
