"""A session's terminal on a Ray node: the node's launcher actor connects to it there
(`NodeLauncher.terminal_open`) and relays its frames, call by call. Each call is waited for,
so keystrokes arrive in the order they were typed (a threaded actor runs calls in any order)."""

from __future__ import annotations

import contextlib
from typing import Any

import ray

CALL_TIMEOUT = 10.0
"""Seconds a call to the launcher actor may take beyond what it was asked to wait."""


class RayTerminal:
    def __init__(self, launcher: Any, owner: str) -> None:
        self.launcher = launcher
        try:
            self.link: str = ray.get(launcher.terminal_open.remote(owner), timeout=CALL_TIMEOUT)
        except Exception as exc:  # Ray's errors and the launcher's own have no common base
            raise OSError(f"the node's launcher could not reach the terminal: {exc}") from None

    def send(self, kind: bytes, payload: bytes = b"") -> None:
        try:
            ray.get(self.launcher.terminal_send.remote(self.link, kind, payload), timeout=CALL_TIMEOUT)
        except Exception as exc:
            raise OSError(f"the terminal is gone: {exc}") from None

    def receive(self, timeout: float) -> list[tuple[bytes, bytes]] | None:
        try:
            found: list[tuple[bytes, bytes]] | None = ray.get(
                self.launcher.terminal_receive.remote(self.link, timeout), timeout=timeout + CALL_TIMEOUT
            )
        except Exception:
            return None
        return found

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.launcher.terminal_close.remote(self.link)
