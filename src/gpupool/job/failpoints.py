"""Failpoints: named places where a test makes the job die, as a real crash would.

`GPUPOOL_FAILPOINT=save:before-manifest` SIGKILLs the process the first time it reaches that
place; `save:before-manifest@3` the third time; `save:before-manifest@3=SIGTERM` sends SIGTERM
instead (a notice arriving in the middle of a save). Unset (always, outside tests), a failpoint
costs one dictionary lookup. Places: save:between-files, save:before-manifest,
save:before-rename, save:before-latest, save:during-prune.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

ENV = "GPUPOOL_FAILPOINT"
_reached: Counter[str] = Counter()


def failpoint(name: str) -> None:
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    wanted, _, signame = wanted.partition("=")
    place, _, nth = wanted.partition("@")
    if place != name:
        return
    _reached[name] += 1
    if _reached[name] == int(nth or 1):
        os.kill(os.getpid(), signal.Signals[signame or "SIGKILL"])
