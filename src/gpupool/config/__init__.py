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
    elastic:                       # jobs of several sizes (docs/elastic.md)
      min_time_at_size: 10m        # a job runs this long at one size before it may grow

What each key may hold is `specs.py`'s (pydantic models); reading the file, and building the
core's `Config` from it, is this module's.

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpupool.config.specs import ConfigSpec
from gpupool.errors import InvalidInput
from gpupool.model import DEFAULT_CLASSES, Config, ElasticPolicy, PriorityBudget, PriorityClass, SessionPolicy, Team


class ConfigError(InvalidInput, ValueError):
    """A configuration that cannot be used; the message names the file and the key."""


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
        elastic=ElasticPolicy(spec.elastic.min_time_at_size),
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
