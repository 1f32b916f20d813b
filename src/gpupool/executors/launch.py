"""The launcher every attempt runs under: `python -m gpupool.executors.launch DIR -- CMD...`.

It starts the command in its own process group (the executor made it), stays alive through the
notice's SIGTERM, waits for the command and writes its exit status to `DIR/exit.json`. So an
attempt's outcome survives a crash of the scheduler: a new scheduler reads it from the file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from gpupool.executors.proc import process_started


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m gpupool.executors.launch ATTEMPT_DIR -- COMMAND...", file=sys.stderr)
        return 2
    attempt_dir, command = Path(argv[0]), argv[2:]
    # Found again by pid and start time if the scheduler dies before it records them.
    me = {"pid": os.getpid(), "started": process_started(os.getpid())}
    (attempt_dir / "launcher.json.tmp").write_text(json.dumps(me))
    os.replace(attempt_dir / "launcher.json.tmp", attempt_dir / "launcher.json")
    # The notice's SIGTERM goes to the whole group: the command handles it, the launcher waits.
    # A handler (not SIG_IGN, which exec would pass on) leaves the command's default intact.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: None)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"gpupool: cannot start {command[0]!r}: {exc.strerror}", file=sys.stderr)
        code = 127
    else:
        code = child.wait()
    record = attempt_dir / "exit.json.tmp"
    record.write_text(json.dumps({"exit_code": code}))
    os.replace(record, attempt_dir / "exit.json")
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
