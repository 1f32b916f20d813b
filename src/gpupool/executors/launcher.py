"""The launcher every attempt runs under (standard library only: it runs as `python -I -S`).

    python -I -S launcher.py ATTEMPT_DIR OWNER USER WORKDIR STDOUT STDERR COMMAND...
    (the job's environment as JSON on standard input)

It records its pid and start time (launcher.json), starts the command, outlives the notice's
SIGTERM (the command keeps the default action), waits for the command and writes its exit
status to exit.json: an attempt's outcome survives a crash of the scheduler. Both records name
their OWNER (store:job:attempt), so that no other store's attempt is taken for this one.

The launcher runs as the scheduler's user, with an environment of its own: the job's
variables (LD_PRELOAD, PATH...) reach only the command, which runs as USER (an OS user name,
or - for the scheduler's own). The command opens its logs and enters WORKDIR as that user, so a
path the job names is reached with the job's rights, never the scheduler's; what goes wrong
before it starts (a log that cannot be opened) goes to the launcher's stderr, launcher.log.

With GPUPOOL_DIE_WITH_PARENT=PID in its own environment (Ray's launcher actors set it to
their own pid), the launcher ends its whole session, the command too, when that parent dies: a member must not run
on when its actor is gone (its node's raylet was killed, or the actor removed). The local
executor's launchers outlive the scheduler instead, which adopts them again.
"""

import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time

AS_JOB = 'exec >>"$2" 2>>"$3"; cd -- "$1" || exit 126; shift 3; exec "$@"'


def write(path: str, record: dict[str, object]) -> None:
    with open(path + ".tmp", "w") as stream:
        json.dump(record, stream)
    os.replace(path + ".tmp", path)


NOT_STARTED = 200
"""The launcher's exit code when the command could not be started for the scheduler's reasons
(its exit record then says `not_started` and why)."""


def die_with_parent(parent: int) -> None:
    """SIGKILL this session, the command with it, as soon as the launcher's parent is gone, or
    the launcher itself is (Ray SIGKILLs a dead actor's children, not their children). A thread
    of the launcher watches its parent, and a watcher process in the session watches the
    launcher; each looks five times a second (a parent-death signal would fire when the parent's
    thread that started the launcher ends, and Ray's actor threads may; it is also lost when
    the command switches user)."""
    launcher = os.getpid()
    if os.getppid() != parent:  # gone already, before this could look
        os.killpg(0, signal.SIGKILL)
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the notice is for the command
        while os.getppid() == launcher:
            time.sleep(0.2)
        os.killpg(0, signal.SIGKILL)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


def main(argv: list[str]) -> int:
    # First of all: a notice may come as soon as the launcher runs, and must not end it.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: None)
    folder, owner, user, workdir, stdout, stderr, *command = argv
    env = json.loads(sys.stdin.read())
    try:
        parent = os.environ.get("GPUPOOL_DIE_WITH_PARENT")
        if parent is not None:
            die_with_parent(int(parent))
        child = start(folder, owner, user, [workdir, stdout, stderr, *command], env)
    except OSError as exc:
        # No space for a record, no process to fork: the scheduler's trouble, not the job's.
        write(os.path.join(folder, "exit.json"), {"exit_code": None, "not_started": str(exc), "owner": owner})
        return NOT_STARTED
    code: int = child.wait()
    if code < 0:
        code = 128 - code  # killed by a signal: as a shell reports it
    write(os.path.join(folder, "exit.json"), {"exit_code": code, "owner": owner})
    return code


def start(folder: str, owner: str, user: str, arguments: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Record the launcher, then start the command (`arguments`: workdir, stdout, stderr, the
    command) as `user`."""
    with open("/proc/self/stat") as stat:
        started = stat.read().rsplit(")", 1)[1].split()[19]
    write(os.path.join(folder, "launcher.json"), {"pid": os.getpid(), "started": started, "owner": owner})
    uid = gid = groups = None
    if user != "-":
        entry = pwd.getpwnam(user)
        uid, gid, groups = entry.pw_uid, entry.pw_gid, os.getgrouplist(entry.pw_name, entry.pw_gid)
    return subprocess.Popen(
        ["/bin/sh", "-c", AS_JOB, "job", *arguments],
        env=env,
        stdin=subprocess.DEVNULL,
        cwd="/",
        umask=0o022,
        user=uid,
        group=gid,
        extra_groups=groups,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
