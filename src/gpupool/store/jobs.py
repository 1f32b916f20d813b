"""Jobs and their events in the store: submissions (one, many, arrays; idempotency keys),
listings and cancels. The pool, its teams and users are `pool.py`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.errors import Conflict, Forbidden, GpupoolError, InvalidInput, NotFound
from gpupool.settle import ENDED, JobState
from gpupool.shapes import gang_split_problem, gpus_per_node_of, session_problem, sizes_problem
from gpupool.store.base import StoreBase
from gpupool.store.holds import KINDS as DEPENDENCY_KINDS
from gpupool.store.pool import DEFAULT_TEAM
from gpupool.store.schema import EventRow, JobRow, PriorityClassRow, TeamRow


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a person asks for when they submit a job."""

    command: Sequence[str]
    team: str = DEFAULT_TEAM
    priority: str = "normal"
    gpus: int = 1
    name: str = ""
    gpus_per_node: int | None = None
    gpu_type: str | None = None
    workdir: str = "."
    env: dict[str, str] = field(default_factory=dict)
    max_failures: int = 0
    max_preemptions: int | None = None
    time_limit: float | None = None
    """Seconds of run time over all attempts; None for no limit."""
    user: str | None = None
    dependencies: Sequence[tuple[str, int]] = ()
    """(kind, job id): `ok`, `notok` or `any`; an array's id stands for all its tasks."""
    script: str | None = None
    """A batch script's text: `command[0]` names it, the rest are its arguments."""
    output: str | None = None
    error: str | None = None
    array: Sequence[int] = ()
    """Indexes of a job array: one task per index, each a job of its own."""
    array_limit: int | None = None
    idempotency_key: str | None = None
    """The client's key for this submission: another with the same key (in the same team) is
    the same submission, retried. An array keeps it on its first task."""
    notify: str | None = None
    """A URL told of the job's start, end and each notice (a Slack-compatible webhook)."""
    mem: int | None = None
    """Bytes of memory on each node (`--mem`)."""
    mem_per_gpu: int | None = None
    cpus_per_gpu: float | None = None
    session: str | None = None
    """`run`, `shell` or `notebook` (`model.SessionKind`) for a session; None for a batch job."""
    sizes: Sequence[int] = ()
    """An elastic job's sizes in GPUs, smallest first, `gpus` the largest (`shapes.parse_sizes`);
    () for a job of one size."""


class DuplicateSubmission(Conflict):
    """A job of the team already has the submission's idempotency key (see `earlier_submission`)."""

    def __init__(self, team: str, key: str, job_id: int) -> None:
        super().__init__(f"team {team} submitted job {job_id} with Idempotency-Key {key!r} already")
        self.job_id = job_id


REQUEST_FIELDS = (
    "command",
    "priority",
    "gpus",
    "gpus_per_node",
    "gpu_type",
    "name",
    "workdir",
    "env",
    "max_failures",
    "max_preemptions",
    "time_limit",
    "user",
    "dependencies",
    "script",
    "output",
    "error",
    "array",
    "array_limit",
    "mem",
    "mem_per_gpu",
    "cpus_per_gpu",
    "session",
    "sizes",
)
"""What makes two submissions the same request (the team is the key's own)."""
FIELD_NAMES = {"dependencies": "after", "array_limit": "array"}
"""Fields of a spec by the names a submission gives them."""


def job_name(name: str, command: Sequence[str]) -> str:
    """The name a job goes by: the one given, else its command's file name."""
    return (name or (command[0].rsplit("/", 1)[-1] if command else "job"))[:200]


def submitted_by(spec: JobSpec) -> str:
    return f"submitted by {spec.user} of team {spec.team}" if spec.user else f"submitted by team {spec.team}"


class JobsStore(StoreBase):
    # --- jobs ----------------------------------------------------------------------------

    def submit(self, spec: JobSpec, now: float) -> JobRow:
        """Record a new pending job, or raise `InvalidInput` saying what is wrong with it."""
        result = self.submit_many([spec], now)[0]
        if isinstance(result, GpupoolError):
            raise result
        return result

    def submit_many(self, specs: Sequence[JobSpec], now: float) -> list[JobRow | GpupoolError]:
        """Record new pending jobs in one transaction (one commit for all of them). Each spec gets
        its job, or the error that says what is wrong with it; a bad spec harms no other. A spec
        whose idempotency key the team used already gets `DuplicateSubmission`."""
        try:
            return self._submit_many(specs, now)
        except IntegrityError:
            # Another transaction took a key between our check and our insert (PostgreSQL's
            # read committed): the unique index refused it. A lone spec says so; a batch is
            # retried spec by spec by its caller.
            if len(specs) != 1 or specs[0].idempotency_key is None:
                raise
            taken = self.job_with_key(specs[0].team, specs[0].idempotency_key)
            if taken is None:
                raise
            return [DuplicateSubmission(specs[0].team, specs[0].idempotency_key, taken)]

    def _submit_many(self, specs: Sequence[JobSpec], now: float) -> list[JobRow | GpupoolError]:
        results: list[JobRow | GpupoolError] = []
        with self.transaction() as s:
            teams, classes, known = self._submit_context(s, specs)
            keys: dict[tuple[str, str], JobRow] = {}
            for spec in specs:
                try:
                    missing = sorted({job for _, job in spec.dependencies} - known)
                    if missing:
                        raise NotFound(f"after: no job {', '.join(map(str, missing))}")
                    if spec.array:
                        raise InvalidInput("array: submit an array with submit_array")
                    job = self._new_job(spec, teams, classes, now)
                    if spec.idempotency_key is not None:
                        key = (spec.team, spec.idempotency_key)
                        earlier = keys[key].id if key in keys else self._key_taken(s, *key)
                        if earlier is not None:
                            raise DuplicateSubmission(*key, earlier)
                        keys[key] = job
                except (InvalidInput, NotFound, Forbidden, DuplicateSubmission) as exc:
                    results.append(exc)
                    continue
                s.add(job)
                if spec.idempotency_key is not None:
                    s.flush()  # its id, for a duplicate later in this batch
                results.append(job)
            s.flush()
            for spec, result in zip(specs, results, strict=True):
                if isinstance(result, JobRow):
                    s.add(EventRow(time=now, kind="submitted", job_id=result.id, message=submitted_by(spec)))
        return results

    def submit_array(self, spec: JobSpec, now: float) -> list[JobRow]:
        """Record one pending job per index of `spec.array`, in one transaction; every task has
        the first task's id as its `array_id`, and the first task the idempotency key. Raises
        what is wrong with the spec (`DuplicateSubmission` when the team used the key already)."""
        if not spec.array:
            raise InvalidInput("array: give at least one index")
        try:
            return self._submit_array(spec, now)
        except IntegrityError:
            taken = self.job_with_key(spec.team, spec.idempotency_key) if spec.idempotency_key else None
            if taken is None or spec.idempotency_key is None:
                raise
            raise DuplicateSubmission(spec.team, spec.idempotency_key, taken) from None

    def _submit_array(self, spec: JobSpec, now: float) -> list[JobRow]:
        with self.transaction() as s:
            teams, classes, known = self._submit_context(s, [spec])
            missing = sorted({job for _, job in spec.dependencies} - known)
            if missing:
                raise NotFound(f"after: no job {', '.join(map(str, missing))}")
            if spec.idempotency_key is not None:
                earlier = self._key_taken(s, spec.team, spec.idempotency_key)
                if earlier is not None:
                    raise DuplicateSubmission(spec.team, spec.idempotency_key, earlier)
            tasks: list[JobRow] = []
            for index in spec.array:
                task = self._new_job(spec, teams, classes, now)
                task.array_index, task.array_limit = index, spec.array_limit
                task.idempotency_key = spec.idempotency_key if not tasks else None
                s.add(task)
                tasks.append(task)
            s.flush()
            for task in tasks:
                task.array_id = tasks[0].id
                message = f"{submitted_by(spec)}: task {task.array_index} of array {tasks[0].id}"
                s.add(EventRow(time=now, kind="submitted", job_id=task.id, message=message))
            return tasks

    @staticmethod
    def _key_taken(s: Session, team: str, key: str) -> int | None:
        """The job of `team` submitted with idempotency key `key`, inside a transaction."""
        found: int | None = s.scalar(select(JobRow.id).where(JobRow.team == team, JobRow.idempotency_key == key))
        return found

    def job_with_key(self, team: str, key: str) -> int | None:
        with self.reading() as s:
            found: int | None = s.scalar(select(JobRow.id).where(JobRow.team == team, JobRow.idempotency_key == key))
            return found

    def earlier_submission(self, spec: JobSpec) -> JobRow | None:
        """The job an earlier submission with `spec`'s idempotency key made (the first task of
        an array), or None; `Conflict` if that submission asked for something else."""
        if spec.idempotency_key is None:
            return None
        with self.reading() as s:
            job = s.scalars(
                select(JobRow).where(JobRow.team == spec.team, JobRow.idempotency_key == spec.idempotency_key)
            ).first()
            if job is None:
                return None
            indexes: list[int] = []
            if job.array_id is not None:
                query = select(JobRow.array_index).where(JobRow.array_id == job.array_id).order_by(JobRow.id)
                indexes = [i for i in s.scalars(query) if i is not None]
        asked = {
            **{name: getattr(spec, name) for name in REQUEST_FIELDS},
            "name": job_name(spec.name, spec.command),
            "command": list(spec.command),
            "dependencies": [[kind, target] for kind, target in spec.dependencies] or None,
            "array": list(spec.array),
            "array_limit": spec.array_limit if spec.array else None,
            "sizes": list(spec.sizes) or None,
        }
        made = {**{name: getattr(job, name, None) for name in REQUEST_FIELDS}, "array": indexes}
        differ = list(dict.fromkeys(FIELD_NAMES.get(n, n) for n in REQUEST_FIELDS if asked[n] != made[n]))
        if differ:
            raise Conflict(
                f"Idempotency-Key {spec.idempotency_key!r} was used for another request (job {job.id}): "
                f"{', '.join(differ)} differ; send a new key for a new submission"
            )
        return job

    @staticmethod
    def _submit_context(s: Session, specs: Sequence[JobSpec]) -> tuple[dict[str, TeamRow], list[str], set[int]]:
        """What checking new jobs needs, read once: teams, class names (most important first),
        and which of the jobs they depend on exist."""
        # Shared locks (PostgreSQL): a team is not removed while a job is being submitted to it.
        live = select(TeamRow).where(TeamRow.removed_at.is_(None)).with_for_update(read=True)
        teams = {team.name: team for team in s.scalars(live)}
        classes = list(s.scalars(select(PriorityClassRow.name).order_by(PriorityClassRow.value.desc())))
        named = {job for spec in specs for _, job in spec.dependencies}
        known = set(s.scalars(select(JobRow.id).where(JobRow.id.in_(named)))) if named else set()
        return teams, classes, known

    @staticmethod
    def _new_job(spec: JobSpec, teams: Mapping[str, TeamRow], classes: Sequence[str], now: float) -> JobRow:
        if not spec.command:
            raise InvalidInput("command: give the command to run")
        for kind, _ in spec.dependencies:
            if kind not in DEPENDENCY_KINDS:
                raise InvalidInput(f"after: unknown kind {kind!r} (known: {', '.join(DEPENDENCY_KINDS)})")
        if spec.time_limit is not None and not spec.time_limit > 0:
            raise InvalidInput(f"time_limit: {spec.time_limit} is not a positive number of seconds")
        if spec.gpus < 1:
            raise InvalidInput(f"gpus: {spec.gpus} is not a positive number of GPUs")
        problem = session_problem(spec.session, spec.gpus, spec.gpus_per_node, bool(spec.array))
        if problem is not None:
            raise InvalidInput(problem)
        problem = gang_split_problem(spec.gpus, spec.gpus_per_node)
        if problem is not None:
            raise InvalidInput(f"gpus_per_node: {problem}")
        problem = sizes_problem(spec.gpus, spec.sizes, spec.gpus_per_node, spec.session)
        if problem is not None:
            raise InvalidInput(problem)
        team = teams.get(spec.team)
        if team is None:
            raise NotFound(f"team: unknown team {spec.team!r}")
        if spec.priority not in classes:
            raise NotFound(f"priority: unknown priority class {spec.priority!r} (known: {', '.join(classes)})")
        if team.allowed_classes is not None and spec.priority not in team.allowed_classes:
            allowed = ", ".join(team.allowed_classes)
            raise Forbidden(f"team {spec.team} may not use class {spec.priority} (allowed: {allowed})")
        return JobRow(
            name=job_name(spec.name, spec.command),
            team=spec.team,
            priority=spec.priority,
            gpus=spec.gpus,
            sizes=list(spec.sizes) or None,
            gpus_per_node=gpus_per_node_of(spec.session, spec.gpus, spec.gpus_per_node),
            gpu_type=spec.gpu_type,
            command=list(spec.command),
            workdir=spec.workdir,
            env=dict(spec.env),
            state=JobState.PENDING.value,
            submit_time=now,
            max_failures=spec.max_failures,
            max_preemptions=spec.max_preemptions,
            time_limit=spec.time_limit,
            user=spec.user,
            dependencies=[[kind, job] for kind, job in spec.dependencies] or None,
            script=spec.script,
            output=spec.output,
            error=spec.error,
            idempotency_key=spec.idempotency_key,
            notify=spec.notify,
            mem=spec.mem,
            mem_per_gpu=spec.mem_per_gpu,
            cpus_per_gpu=spec.cpus_per_gpu,
            session=spec.session,
        )

    def job(self, job_id: int) -> JobRow:
        with self.reading() as s:
            job = s.get(JobRow, job_id)
            if job is None:
                raise NotFound(f"no job {job_id}")
            return job

    def jobs(
        self,
        *,
        states: Sequence[JobState] = (),
        team: str | None = None,
        user: str | None = None,
        array: int | None = None,
        name: str | None = None,
        limit: int | None = None,
    ) -> list[JobRow]:
        query = select(JobRow).order_by(JobRow.id)
        if limit is not None:
            query = query.limit(limit)
        if user is not None:
            query = query.where(JobRow.user == user)
        if array is not None:
            query = query.where(JobRow.array_id == array)
        if name is not None:
            query = query.where(JobRow.name == name)
        if states:
            query = query.where(JobRow.state.in_([s.value for s in states]))
        if team is not None:
            query = query.where(JobRow.team == team)
        with self.reading() as s:
            return list(s.scalars(query))

    def cancel(self, job_id: int, now: float, *, kill: bool = False, why: str = "") -> JobRow:
        """Cancel a job: at once if it holds no GPUs, else ask the control loop to stop its
        attempt (the job is CANCELLED when the attempt has ended): with its class's grace, or
        killed at once (`kill`, also after a cancel with grace). Ended jobs are a `Conflict`.
        `why`, when given, is said in the events (an idle session reclaimed)."""
        with self.transaction() as s:
            job = self.locked_job(s, job_id)
            because = f" ({why})" if why else ""
            if job.state == JobState.PENDING.value:
                self.move(s, job, JobState.CANCELLED, now, f"cancelled{because}")
                job.ended_at = now
            elif JobState(job.state) in ENDED:
                raise Conflict(f"job {job.label} has already ended ({job.state})")
            elif job.cancel_requested_at is None or (kill and job.kill_requested_at is None):
                first = job.cancel_requested_at is None
                job.cancel_requested_at = job.cancel_requested_at or now
                if kill:
                    job.kill_requested_at = now
                how = "killed at once" if kill else "being stopped"
                kind = "cancel_requested" if first else "kill_requested"
                message = f"cancel requested{because}: its attempt is {how}"
                s.add(EventRow(time=now, kind=kind, job_id=job_id, message=message))
            return job

    def events_to_tell(
        self, after: int, gaps: Sequence[int] = (), limit: int = 200
    ) -> list[tuple[EventRow, JobRow | None]]:
        """The events after the id `after`, and those of the ids `gaps` (`store.tail.Tail`),
        oldest first, each with its job (for the webhooks: its label, team, name and the URL it
        named)."""
        query = select(EventRow, JobRow).outerjoin(JobRow, JobRow.id == EventRow.job_id)
        query = query.where((EventRow.id > after) | EventRow.id.in_(list(gaps))).order_by(EventRow.id).limit(limit)
        with self.reading() as s:
            return [(event, job) for event, job in s.execute(query)]

    def last_event(self) -> int:
        """The id of the newest event (0: none yet)."""
        with self.reading() as s:
            return int(s.scalar(select(func.max(EventRow.id))) or 0)

    def events(
        self,
        *,
        job_id: int | None = None,
        after: int = 0,
        limit: int = 1000,
        team: str | None = None,
        newest: bool = False,
        since: float | None = None,
        kinds: Sequence[str] = (),
        hidden: Sequence[str] = (),
    ) -> list[EventRow]:
        """Events after the id `after` (and at or after the time `since`), oldest first: of one
        job, or of `team`'s jobs (and of no job), or all; of `kinds` only, none of `hidden`;
        the first `limit` of them, or with `newest` the last."""
        order = EventRow.id.desc() if newest else EventRow.id
        query = select(EventRow).where(EventRow.id > after).order_by(order).limit(limit)
        if since is not None:
            query = query.where(EventRow.time >= since)
        if kinds:
            query = query.where(EventRow.kind.in_(list(kinds)))
        if hidden:
            query = query.where(EventRow.kind.not_in(list(hidden)))
        if job_id is not None:
            query = query.where(EventRow.job_id == job_id)
        if team is not None:
            theirs = select(JobRow.id).where(JobRow.team == team)
            query = query.where(EventRow.job_id.is_(None) | EventRow.job_id.in_(theirs))
        with self.reading() as s:
            found = list(s.scalars(query))
        return found[::-1] if newest else found
