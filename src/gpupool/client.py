"""A small client of the HTTP API, for the command line (and for scripts)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from gpupool.errors import HTTP_STATUS, GpupoolError, InvalidInput

ERRORS: dict[int, type[GpupoolError]] = {status: error for error, status in HTTP_STATUS.items()} | {422: InvalidInput}


class Unreachable(GpupoolError):
    pass


class Client:
    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout)
        self.url = url

    @classmethod
    def from_env(cls, url: str | None, data_dir: Path) -> Client:
        """`GPUPOOL_API` and `GPUPOOL_TOKEN` when set, else the local service's address and the
        admin token of its data directory."""
        token = os.environ.get("GPUPOOL_TOKEN")
        if token is None:
            path = data_dir / "admin.token"
            try:
                token = path.read_text().strip()
            except OSError:
                raise GpupoolError(f"no token: set GPUPOOL_TOKEN, or start `gpupool up` (it writes {path})") from None
        return cls(url or os.environ.get("GPUPOOL_API") or "http://127.0.0.1:8470", token)

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The response, or the error it stands for raised."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot reach gpupool at {self.url} ({exc}); is `gpupool up` running?") from None
        if response.status_code >= 400:
            try:
                message = response.json()["message"]
            except (ValueError, KeyError):
                message = response.text
            raise ERRORS.get(response.status_code, GpupoolError)(message)
        return response

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The body of the response: JSON decoded, text, or None."""
        response = self.send(method, path, **kwargs)
        if response.status_code == 204:
            return None
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.text

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        job: dict[str, Any] = self.request("POST", "/jobs", json=body)
        return job

    def jobs(self, **params: Any) -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = self.request("GET", "/jobs", params={k: v for k, v in params.items() if v})
        return jobs

    def job(self, job_id: int) -> dict[str, Any]:
        job: dict[str, Any] = self.request("GET", f"/jobs/{job_id}")
        return job

    def cancel(self, job_id: int) -> dict[str, Any]:
        job: dict[str, Any] = self.request("POST", f"/jobs/{job_id}/cancel")
        return job

    def logs(self, job_id: int, attempt: int | None, stream: str, offset: int) -> tuple[str, int]:
        """The output from byte `offset` on, and the offset to read from next."""
        params: dict[str, Any] = {"stream": stream, "offset": offset}
        if attempt is not None:
            params["attempt"] = attempt
        response = self.send("GET", f"/jobs/{job_id}/logs", params=params)
        return response.text, int(response.headers.get("X-Next-Offset", offset + len(response.content)))

    def events(self, job_id: int | None = None, after: int = 0) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"after": after}
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

    def report(self, since: float | None = None) -> dict[str, Any]:
        params = {"since": since} if since is not None else {}
        report: dict[str, Any] = self.request("GET", "/report", params=params)
        return report
