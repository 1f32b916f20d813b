"""gpupool's Python API, for notebooks and scripts; the command line speaks through it too.

    from gpupool.client import connect

    pool = connect()                      # as the command line finds the service and your token
    job = pool.submit(["python", "train.py"], gpus=2, priority="high", time_limit=3600)
    done = pool.wait(job["id"])           # the job once it has ended
    print(done["state"], pool.output(job["id"]))
    pool.cancel(job["id"])                # notice and its class's grace; now=True kills at once

Every answer is the API's JSON (docs/api.md), and every error a `gpupool.errors.GpupoolError`
saying what went wrong (`Unreachable` when the service cannot be reached). A submission carries
a fresh `Idempotency-Key` and is retried with it when its connection fails (refused, reset, cut
before the answer, timed out) or the store is busy, for about `SUBMIT_RETRY_SECONDS`: the
service makes one job of all the tries.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from gpupool.errors import HTTP_STATUS, GpupoolError, InvalidInput
from gpupool.settle import ENDED


class Unreachable(GpupoolError):
    pass


class Unavailable(GpupoolError):
    """The service answered 503: its store is busy or cannot be written now."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


ERRORS: dict[int, type[GpupoolError]] = {status: error for error, status in HTTP_STATUS.items()} | {
    413: InvalidInput,
    422: InvalidInput,
    503: Unavailable,
}

SUBMIT_RETRY_SECONDS = 30.0
"""How long a submission is tried again after its connection failed (its key makes it safe)."""
RETRIED = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.TimeoutException)
"""Transport errors after which the request may or may not have been received."""


def token_file() -> Path:
    """Where `gpupool login` keeps this user's token: `$XDG_CONFIG_HOME/gpupool/token`, by
    default `~/.config/gpupool/token`, readable by the user alone."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpupool" / "token"


def user_token() -> str | None:
    """The token in this user's token file, if there is one; refused if others may read it."""
    path = token_file()
    try:
        mode = path.stat().st_mode
        if mode & 0o077:
            raise GpupoolError(f"{path} may be read by others (mode {mode & 0o777:o}): chmod 600 {path}")
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise GpupoolError(f"{path}: cannot read the token ({exc.strerror})") from None


def admin_token(data_dir: Path) -> str | None:
    """The service's admin token, where this user may read it (root, on a shared machine)."""
    try:
        return (data_dir / "admin.token").read_text().strip() or None
    except OSError:
        return None


class Client:
    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout)
        self.url = url
        self.token = token
        self.pause: Callable[[float], None] = time.sleep
        """How the client waits between tries (tests replace it)."""

    @classmethod
    def from_env(cls, url: str | None, data_dirs: Sequence[Path]) -> Client:
        """`GPUPOOL_API` and the token: `GPUPOOL_TOKEN`, else the user's token file (`gpupool
        login` writes it), else the admin token of the first of `data_dirs` that has one."""
        # Inside a job, GPUPOOL_TOKEN is its attempt's (the job protocol's): never a person's.
        inside = "GPUPOOL_ATTEMPT" in os.environ
        token = (None if inside else os.environ.get("GPUPOOL_TOKEN")) or user_token()
        token = token or next((t for t in map(admin_token, data_dirs) if t is not None), None)
        if token is None:
            raise GpupoolError(
                f"no token: run `gpupool login` with the token your admin gave you, or set GPUPOOL_TOKEN "
                f"(the admin's is {data_dirs[0] / 'admin.token'}, written by `gpupool up`)"
            )
        return cls(url or os.environ.get("GPUPOOL_API") or "http://127.0.0.1:8470", token)

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The response, or the error it stands for raised."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot reach gpupool at {self.url} ({exc}); is `gpupool up` running?") from None
        return checked(response)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The body of the response: JSON decoded, text, or None."""
        response = self.send(method, path, **kwargs)
        if response.status_code == 204:
            return None
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.text

    def submit(
        self,
        command: Sequence[str],
        *,
        gpus: int = 1,
        priority: str | None = None,
        name: str = "",
        time_limit: float | None = None,
        workdir: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Submit `command` as a job; the job as the API has it. `time_limit` is in seconds;
        `workdir` is this process's folder by default; `env` the job's whole environment
        (none of this process's unless given); `fields` are the API's other fields (`team`,
        `gpus_per_node`, `gpu_type`, `after`, `mem`, `output`, ...: docs/api.md)."""
        body = {
            "command": list(command),
            "gpus": gpus,
            "priority": priority,
            "name": name,
            "time_limit": time_limit,
            "workdir": str(Path(workdir or Path.cwd()).absolute()),
            "env": dict(env or {}),
            **fields,
        }
        return self.submit_body(body)

    def submit_body(self, body: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        """Submit the API's JSON `body` with `idempotency_key` (a new UUID when None), trying
        again with the same key after a connection error or a busy store, for
        `SUBMIT_RETRY_SECONDS`."""
        headers = {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        deadline = time.monotonic() + SUBMIT_RETRY_SECONDS
        wait = 0.25
        while True:
            try:
                job: dict[str, Any] = checked(self.http.request("POST", "/jobs", json=body, headers=headers)).json()
                return job
            except RETRIED as exc:
                problem: Exception = exc
                delay = wait
            except Unavailable as exc:
                problem = exc
                delay = exc.retry_after if exc.retry_after is not None else wait
            except httpx.TransportError as exc:
                raise Unreachable(f"cannot reach gpupool at {self.url} ({exc}); is `gpupool up` running?") from None
            left = deadline - time.monotonic()
            if left <= 0:
                tried = f"retried for {SUBMIT_RETRY_SECONDS:g} s"
                if isinstance(problem, Unavailable):
                    raise Unavailable(f"{problem} ({tried})") from None
                raise Unreachable(
                    f"cannot reach gpupool at {self.url} ({str(problem) or type(problem).__name__}; {tried}); "
                    "is `gpupool up` running? The job may have been submitted: see `gpupool queue`"
                ) from None
            self.pause(min(delay, left))
            wait = min(wait * 2, 4.0)

    def jobs(self, **params: Any) -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = self.request("GET", "/jobs", params={k: v for k, v in params.items() if v})
        return jobs

    def job(self, job_id: int) -> dict[str, Any]:
        job: dict[str, Any] = self.request("GET", f"/jobs/{job_id}")
        return job

    def notebook_status(self, job_id: int) -> dict[str, Any]:
        """Whether a notebook session's server answers (`ready`), and what it was warned of."""
        try:
            answer = self.http.get(f"/ui/notebooks/{job_id}/_gpupool/status")
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot reach gpupool at {self.url} ({exc}); is `gpupool up` running?") from None
        if answer.status_code in (401, 403, 404):
            checked(answer)
        try:
            status: dict[str, Any] = answer.json()
        except ValueError:
            return {"ready": False, "message": f"the service answered {answer.status_code}"}
        return status

    def wait(self, job_id: int, timeout: float | None = None, every: float = 0.5) -> dict[str, Any]:
        """The job once it has ended (`TimeoutError` after `timeout` seconds, when given)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["state"] in ENDED:  # a StrEnum: its states are their names
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job['label']} is still {job['state']} after {timeout:g} s")
            self.pause(every)

    def output(self, job_id: int, attempt: int | None = None, stream: str = "stdout") -> str:
        """All of one attempt's output (the latest by default) as it is now."""
        text, offset, size = self.log_part(job_id, attempt, stream, 0)
        parts = [text]
        while offset < size:
            text, following, size = self.log_part(job_id, attempt, stream, offset)
            if following <= offset:
                break
            parts.append(text)
            offset = following
        return "".join(parts)

    def cancel(self, job_id: int, now: bool = False) -> dict[str, Any]:
        """Cancel a job: a running one gets notice and its class's grace, or is killed at once
        (`now`, also during the grace)."""
        job: dict[str, Any] = self.request("POST", f"/jobs/{job_id}/cancel", params={"now": "true"} if now else None)
        return job

    def act(self, job_id: int, action: str) -> dict[str, Any]:
        """`POST /jobs/{id}/{action}`: cancel, hold, release or requeue; the job after it."""
        job: dict[str, Any] = self.request("POST", f"/jobs/{job_id}/{action}")
        return job

    def update(self, job_id: int, change: dict[str, Any]) -> dict[str, Any]:
        job: dict[str, Any] = self.request("PATCH", f"/jobs/{job_id}", json=change)
        return job

    def logs(self, job_id: int, attempt: int | None, stream: str, offset: int, rank: int = 0) -> tuple[str, int]:
        """The output of a member of the gang (`rank`) from byte `offset` on (as much as one
        answer holds), and the offset to read from next."""
        text, following, _ = self.log_part(job_id, attempt, stream, offset, rank)
        return text, following

    def log_part(
        self, job_id: int, attempt: int | None, stream: str, offset: int, rank: int = 0
    ) -> tuple[str, int, int]:
        """`logs`, and the file's size when it was read: less than the next offset means more."""
        params: dict[str, Any] = {"stream": stream, "offset": offset}
        if rank:
            params["rank"] = rank
        if attempt is not None:
            params["attempt"] = attempt
        response = self.send("GET", f"/jobs/{job_id}/logs", params=params)
        following = int(response.headers.get("X-Next-Offset", offset + len(response.content)))
        return response.text, following, int(response.headers.get("X-Log-Size", following))

    def events(self, job_id: int | None = None, after: int = 0, **filters: Any) -> list[dict[str, Any]]:
        """`GET /events`: `filters` are its other parameters (`limit`, `newest`, `since`, `kind`,
        `hide`); those that are None are left out."""
        params: dict[str, Any] = {"after": after, **{k: v for k, v in filters.items() if v is not None}}
        if job_id is not None:
            params["job"] = job_id
        events: list[dict[str, Any]] = self.request("GET", "/events", params=params)
        return events

    def teams(self) -> list[dict[str, Any]]:
        teams: list[dict[str, Any]] = self.request("GET", "/teams")
        return teams

    def set_team(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        team: dict[str, Any] = self.request("PUT", f"/teams/{name}", json=body)
        return team

    def users(self) -> list[dict[str, Any]]:
        users: list[dict[str, Any]] = self.request("GET", "/users")
        return users

    def set_user(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        user: dict[str, Any] = self.request("PUT", f"/users/{name}", json=body)
        return user

    def classes(self) -> list[dict[str, Any]]:
        classes: list[dict[str, Any]] = self.request("GET", "/classes")
        return classes

    def pool(self) -> dict[str, Any]:
        pool: dict[str, Any] = self.request("GET", "/pool")
        return pool

    def history(self, since: float | None = None) -> str:
        """The ended jobs as CSV (`gpupool.history`)."""
        params = {"since": since} if since is not None else {}
        # A year of jobs is one long answer: more time than an ordinary request's.
        return self.send("GET", "/history", params=params, timeout=HISTORY_TIMEOUT).text

    def report(self, since: float | None = None) -> dict[str, Any]:
        params = {"since": since} if since is not None else {}
        report: dict[str, Any] = self.request("GET", "/report", params=params)
        return report


HISTORY_TIMEOUT = 300.0
"""Seconds `Client.history` waits for its answer."""


def checked(response: httpx.Response) -> httpx.Response:
    """`response`, or the error it stands for raised."""
    if response.status_code >= 400:
        try:
            message = response.json()["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text
        error = ERRORS.get(response.status_code, GpupoolError)
        if error is Unavailable:
            raise Unavailable(message, retry_seconds(response.headers.get("Retry-After")))
        raise error(message)
    return response


def retry_seconds(header: str | None) -> float | None:
    """A Retry-After in seconds (its date form is read as no advice)."""
    try:
        return max(0.0, float(header)) if header is not None else None
    except ValueError:
        return None


def connect(api: str | None = None, config: Path | None = None) -> Client:
    """A client of the service: at `api` (else `$GPUPOOL_API`, else the configuration's), with
    `$GPUPOOL_TOKEN`, else your token file (`gpupool login`), else the admin token where you
    may read it. The configuration is `config`, else `$GPUPOOL_CONFIG`, else /etc/gpupool's
    client.yaml or gpupool.yaml (`config.client_config`)."""
    from gpupool.config import client_config, load_spec, service_config

    path = client_config(config, os.environ)
    spec = load_spec(path)
    # The admin token is in the service's data directory, which a users' client.yaml need not
    # name: as root, the service's own file says where it is.
    data_dirs = [spec.service.data_path]
    service_file = service_config(None, os.environ)
    if service_file is not None and service_file != path and os.access(service_file, os.R_OK):
        data_dirs.append(load_spec(service_file).service.data_path)
    return Client.from_env(api or os.environ.get("GPUPOOL_API") or spec.service.url, data_dirs)
