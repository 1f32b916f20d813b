"""The API's limits (docs/access.md, "Limits"), and the checks of what the system would refuse
when a job starts: a request that passes them is never a job that can only fail at launch."""

from __future__ import annotations

INT32 = 2**31 - 1
"""Ids, attempts, steps and counts: the store's integers are 32-bit on PostgreSQL."""
INT64 = 2**63 - 1
"""Byte offsets into a log."""

BODY_BYTES = 2 * 1024 * 1024
"""A request's body, by its Content-Length or counted as it arrives (chunked)."""
SCRIPT_CHARS = 1_000_000
COMMAND_BYTES = 1_000_000
"""The command's arguments together (UTF-8)."""
ENV_BYTES = 1_000_000
"""The job's variables together, as `NAME=value` (UTF-8)."""
ARGUMENTS = 10_000
VARIABLES = 10_000
ARG_BYTES = 128 * 1024 - 1
"""One argument, or one `NAME=value`: Linux's MAX_ARG_STRLEN (32 pages, with its NUL)."""
EXEC_BYTES = 3 * 512 * 1024
"""Arguments and variables as the kernel counts them (each string, its NUL and its pointer):
Linux refuses more than ARG_MAX (2 MiB with the default 8 MiB stack); the rest is left for the
variables gpupool adds."""
NAME_MAX = 255
"""Bytes of one path component (a file or folder name)."""
PATH_MAX = 4095
"""Bytes of a whole path."""
LOG_BYTES = 4 * 1024 * 1024
"""At most this much of a log in one answer; `X-Next-Offset` says where to go on."""

WIDEST = {"j": "9" * 10, "A": "9" * 10, "a": "9" * 10, "t": "9" * 10, "%": "%"}
"""The longest value of each pattern of a log path but `%x` (the job's name): ids are 32-bit."""


def path_problem(path: str) -> str | None:
    """What the system would refuse about `path` (a NUL, a name or a whole path too long), or None."""
    if "\0" in path:
        return "holds a NUL character"
    if not path.strip():
        return "is empty"
    if len(path.encode()) > PATH_MAX:
        return f"is longer than {PATH_MAX} bytes"
    for part in path.split("/"):
        if len(part.encode()) > NAME_MAX:
            return f"has a name longer than {NAME_MAX} bytes ({part[:20]}…)"
    return None


def widest(template: str, name: str) -> str:
    """A log path's template with each pattern at its longest (`%x` is `name`)."""
    out = []
    chars = iter(template)
    for char in chars:
        if char != "%":
            out.append(char)
            continue
        code = next(chars, "")
        out.append(name if code == "x" else WIDEST.get(code, "%" + code))
    return "".join(out)


def exec_bytes(command: list[str], env: dict[str, str]) -> int:
    """What `command` and `env` take of the kernel's ARG_MAX: each string, its NUL and its pointer."""
    strings = [*command, *(f"{k}={v}" for k, v in env.items())]
    return sum(len(s.encode()) + 1 + 8 for s in strings)


def script_problem(script: str) -> str | None:
    """What would keep a batch script from running, or None: as sbatch, it starts with `#!` and
    its interpreter, a path the system takes."""
    if "\0" in script:
        return "holds a NUL character"
    if not script.startswith("#!"):
        return "does not start with #! and the path of its interpreter"
    line = script[2:].split("\n", 1)[0].strip()
    interpreter = line.split(maxsplit=1)[0] if line else ""
    if not interpreter:
        return "names no interpreter after #!"
    problem = path_problem(interpreter)
    return f"its interpreter {problem}" if problem else None
