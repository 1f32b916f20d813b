"""The launcher every attempt's member runs under, forked from a fork server of launchers
(standard library only: it runs as `python -I -S launcher.py --serve`, started and imported
once; a Python start of its own per attempt would cost most of an attempt's CPU on a small
machine).

The fork server reads requests, a JSON line each: an id, the launcher's arguments (ATTEMPT_DIR
OWNER USER WORKDIR STDOUT STDERR COMMAND...), the job's environment (`env`), its cgroup
(`contain`), its folder, and whether it is `detach`ed; it answers each (`{"id": ID, "pid":
PID}`) once the launcher leads its own session.

- A **detached** launcher (the local executor's) is forked twice, a child of no process of the
  scheduler's: it outlives the fork server and the scheduler, which adopts it again after a
  restart. Its end is not told; the scheduler watches its pid.
- Any other (each Ray node's launcher actor's) is the fork server's child: the fork server
  tells when it ends (`{"exited": PID, "code": CODE}`, CODE negative for a signal, as
  `subprocess` has it), and it ends its member, cgroup and session, when the fork server is
  gone (its actor is: the node's raylet was killed, or the actor removed).

The launcher records its pid and start time (launcher.json) before its pid is told, starts the
command, outlives the notice's SIGTERM (the command keeps the default action), waits for the
command and writes its exit status to exit.json: an attempt's outcome survives a crash of the
scheduler. Both records name their OWNER (store:job:attempt), so that no other store's attempt
is taken for this one.

The launcher runs as the scheduler's user, with an environment of its own: the job's
variables (LD_PRELOAD, PATH...) reach only the command, which runs as USER (an OS user name,
or - for the scheduler's own). The command opens its logs and enters WORKDIR as that user, so a
path the job names is reached with the job's rights, never the scheduler's; what goes wrong
before it starts (a log that cannot be opened) goes to the launcher's stderr, launcher.log.

Where the scheduler contains its attempts (`contain`: a cgroup's path and its limits, see
`cgroups.py`), the command is born in the member's cgroup, and the launcher, outside it, kills
whatever is left in it when the command ends, however the command ended (a daemon it left, a
process that changed its session), and exits only once the cgroup is empty: the attempt's end,
and its GPUs' release, wait for that. Its exit record says what the cgroup counted (peak memory,
CPU time, processes killed for memory).
"""

import errno
import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpupool.executors import cgroups, terminal
else:  # run as a script, with no package: its neighbours
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    import cgroups
    import terminal

AS_JOB = 'exec >>"$2" 2>>"$3"; cd -- "$1" || exit 126; shift 3; exec "$@"'
AT_TERMINAL = 'cd -- "$1" || exit 126; shift 3; exec "$@"'
"""A session's command: its output is its terminal's, not the logs'."""


def write(path: str, record: dict[str, object]) -> None:
    with open(path + ".tmp", "w") as stream:
        json.dump(record, stream)
    os.replace(path + ".tmp", path)


NOT_STARTED = 200
"""The launcher's exit code when the command could not be started for the scheduler's reasons
(its exit record then says `not_started` and why)."""


def contained(contain: dict[str, object] | None) -> cgroups.Cgroup | None:
    """The member's cgroup, if the scheduler contains it (not made yet)."""
    if not contain:
        return None
    return cgroups.Cgroup(cgroups.Layout.read(), str(contain["cgroup"]))


def kill_all(cgroup: cgroups.Cgroup | None) -> None:
    """Kill the member whole: its session, its terminal's (a shell leads one of its own), and
    every process in its cgroup."""
    if cgroup is not None:
        cgroup.kill()
    for session in AT_TERMINAL_SESSIONS:
        terminal.kill_session(session)  # with its background jobs, which a cgroup would hold
    os.killpg(0, signal.SIGKILL)


AT_TERMINAL_SESSIONS: list[int] = []
"""The session a shell's command leads on its terminal, once started (`kill_all` kills it)."""


def die_with_parent(parent: int, cgroup: cgroups.Cgroup | None) -> None:
    """SIGKILL this session, the command with it, as soon as the launcher's parent (the fork
    server) is gone, or the launcher itself is. A thread of the launcher watches its parent, and
    a watcher process in the session watches the launcher; each looks five times a second (a
    parent-death signal is lost when the command switches user, and would not outlive the
    launcher)."""
    launcher = os.getpid()
    if os.getppid() != parent:  # gone already, before this could look
        kill_all(cgroup)
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the notice is for the command
        while os.getppid() == launcher:
            time.sleep(0.2)
        kill_all(cgroup)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        kill_all(cgroup)

    threading.Thread(target=watch, daemon=True).start()


def main(
    argv: list[str], env: dict[str, str], contain: dict[str, object] | None = None, ready: int = -1, tty: bool = False
) -> int:
    """Run the attempt's command to its end; `ready`, where given, is told this launcher's pid
    once its record is written (a fork server's detached launcher). With `tty` the command
    runs on a terminal of its own, which the launcher serves (`terminal.Relay`)."""
    folder, owner, user, workdir, stdout, stderr, *command = argv
    cgroup = contained(contain)
    over = False  # over its memory limit before the limit was written (`memory_limited`)
    relay: terminal.Relay | None = None
    try:
        record(folder, owner)
        if ready >= 0:
            os.write(ready, str(os.getpid()).encode())
            os.close(ready)
        slave = None
        if tty:
            master, slave = terminal.opened(pwd.getpwnam(user).pw_uid if user != "-" else None)
            relay = terminal.Relay(owner, master)
        arguments = [workdir, stdout, stderr, *command]
        if cgroup is not None:
            assert contain is not None
            limits = cgroups.Request.from_json(contain).limits()
            cgroup.create(limits)
            if not cgroup.layout.fences_devices():
                cgroups.hide(limits.hidden)
            child = cgroup.started(lambda: start(folder, owner, user, arguments, env, slave))
            over = memory_limited(cgroup, limits)
        else:
            child = start(folder, owner, user, arguments, env, slave)
        if slave is not None:
            os.close(slave)
            AT_TERMINAL_SESSIONS.append(child.pid)
            write(os.path.join(folder, "terminal.json"), {"session": child.pid, "owner": owner})
    except OSError as exc:
        # No space for a record, no process to fork, no cgroup: the scheduler's trouble, not
        # the job's.
        if relay is not None:
            relay.close()
        if cgroup is not None:
            emptied(cgroup)
        write(os.path.join(folder, "exit.json"), {"exit_code": None, "not_started": str(exc), "owner": owner})
        return NOT_STARTED
    code = waited(child, relay)
    if relay is not None:
        relay.finish(code)
    ending: dict[str, object] = {"exit_code": code, "owner": owner}
    if cgroup is not None:
        usage = ending["usage"] = emptied(cgroup)
        if over:
            usage["oom_kills"] = max(1, int(usage.get("oom_kills") or 0))
    write(os.path.join(folder, "exit.json"), ending)
    return code


def waited(child: subprocess.Popen[bytes], relay: terminal.Relay | None) -> int:
    """The command's exit code once it ended (128 + the signal that killed it, as a shell says),
    its terminal served meanwhile by `relay`, where it has one, and the notices passed on."""
    if relay is not None:
        try:
            code = relay.run(child, lambda: len(NOTICED))
        except Exception as exc:  # the relay broke: its command must not outlive it, unrecorded
            print(f"launcher: the terminal failed ({exc}); its session is killed", flush=True)
            terminal.signal_group(child.pid, signal.SIGKILL)
            code = child.wait()
    else:
        if NOTICED:  # given before the command ran: it has it now
            child.send_signal(signal.SIGTERM)
        code = child.wait()
    return 128 - code if code < 0 else code


def memory_limited(cgroup: cgroups.Cgroup, limits: cgroups.Limits) -> bool:
    """Write the member's memory limit; True when it was over it already (EBUSY, on v1): it is
    killed then, and ends out of memory, as on v2, where the kernel kills it."""
    try:
        cgroup.limit_memory(limits)
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        cgroup.kill(None)
        return True
    return False


def emptied(cgroup: cgroups.Cgroup) -> dict[str, int | float | None]:
    """Kill what is left in the member's cgroup, for as long as it takes (a process the kernel
    holds in uninterruptible sleep keeps it, and the attempt's GPUs, until it dies: said in
    launcher.log every `EMPTY_WITHIN` seconds); then what it counted, and it is removed."""
    while not cgroup.kill(cgroups.EMPTY_WITHIN):
        left = len(cgroup.pids())
        print(f"launcher: {left} processes left in the attempt's cgroup after SIGKILL; killing again", flush=True)
    usage = cgroup.usage()
    cgroup.remove()
    return usage


NOTICED: list[int] = []
"""Notices (SIGTERM) the launcher got, for one that came before its command started."""


def ignore_notice() -> None:
    """First of all: a notice may come as soon as the launcher runs, and must not end it (the
    command, started afterwards, gets the default action back, and the notice)."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: NOTICED.append(signum))


def serve() -> None:
    """The fork server (see above). Single-threaded, so that forking it is safe. A launcher
    that ends at once may be told to have ended before its pid is (its end is reaped whenever
    SIGCHLD's handler runs)."""

    def tell(message: dict[str, object]) -> None:
        os.write(1, (json.dumps(message) + "\n").encode())  # one write: a line is never split

    def reap(_signum: int, _frame: object) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            tell({"exited": pid, "code": os.waitstatus_to_exitcode(status)})

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the notice is for the commands
    signal.signal(signal.SIGCHLD, reap)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())  # a SIGCHLD blocked where it was started
    for line in sys.stdin.buffer:
        request = json.loads(line)
        try:
            tty = bool(request.get("tty"))
            if request.get("detach"):
                pid = detached(request["argv"], request["env"], request["folder"], request.get("contain"), tty)
            else:
                pid = fork(request["argv"], request["env"], request["folder"], request.get("contain"), tty)
            tell({"id": request["id"], "pid": pid})
        except OSError as exc:
            tell({"id": request["id"], "error": str(exc)})


def fork(
    argv: list[str], env: dict[str, str], folder: str, contain: dict[str, object] | None, tty: bool = False
) -> int:
    """A launcher forked from the fork server: the leader of a session of its own, with its
    output in the folder's launcher.log; returns its pid once it leads its session."""
    log = os.open(os.path.join(folder, "launcher.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:
        ready_r, ready_w = os.pipe()
    except OSError:
        os.close(log)
        raise
    server = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        for fd in (log, ready_r, ready_w):
            os.close(fd)
        raise
    if pid == 0:
        code = 1
        try:
            os.close(ready_r)
            become_launcher(log, folder)  # its end of the pipe closes with the others
            die_with_parent(server, contained(contain))
            code = main(argv, env, contain, tty=tty)
        finally:
            os._exit(code)
    os.close(log)
    os.close(ready_w)
    os.read(ready_r, 1)  # its end of the pipe closes once it leads its session
    os.close(ready_r)
    return pid


def become_launcher(log: int, folder: str, keep: int = -1) -> None:
    """What a forked process does first to be a launcher: the notice kept for its command, the
    leader of a session of its own, its output to `log`, no other descriptor of the fork
    server's but `keep`, in its folder. Signals the scheduler was started ignoring (SIGHUP under
    `nohup`, SIGINT and SIGQUIT with `&` from a script) get their default action back: a process
    passes what it ignores on to what it starts, and the command must get them (a shell is hung
    up, Ctrl-C reaches its program). A launcher leads a session without a terminal: no terminal
    sends it any of them. Nor is any signal blocked, which the command would inherit too (the
    notice itself, where a library had blocked it in the thread that started the scheduler)."""
    ignore_notice()
    for inherited in (signal.SIGCHLD, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        signal.signal(inherited, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    if keep >= 3:
        os.closerange(3, keep)
        os.closerange(keep + 1, 256)
    else:
        os.closerange(3, 256)
    os.chdir(folder)


def record(folder: str, owner: str) -> None:
    """The launcher's pid and start time, by which a scheduler finds it again."""
    with open("/proc/self/stat") as stat:
        started = stat.read().rsplit(")", 1)[1].split()[19]
    write(os.path.join(folder, "launcher.json"), {"pid": os.getpid(), "started": started, "owner": owner})


def detached(
    argv: list[str], env: dict[str, str], folder: str, contain: dict[str, object] | None, tty: bool = False
) -> int:
    """A launcher forked twice from the fork server: a child of no process of the scheduler's
    (init, or the nearest subreaper, reaps it), the leader of a session of its own, living on
    when the fork server and the scheduler are gone (the local executor's, which a restarted
    scheduler adopts); returns its pid once its record is written. Its end is not told: the
    caller watches its pid. SIGCHLD is held while the fork in between is reaped here, so that
    it is never told for a launcher."""
    log = os.open(os.path.join(folder, "launcher.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    ready: tuple[int, int] | None = None
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        ready = ready_r, ready_w = os.pipe()
        between = os.fork()
        if between == 0:
            code = 1
            try:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
                if os.fork() != 0:
                    os._exit(0)
                os.close(ready_r)
                become_launcher(log, folder, keep=ready_w)
                code = main(argv, env, contain, ready_w, tty)
            finally:
                os._exit(code)
        os.close(ready_w)
        ready = ready_r, -1
        said = b""
        while chunk := os.read(ready_r, 32):
            said += chunk
        os.waitpid(between, 0)
    finally:
        for fd in (log, *(ready or ())):
            if fd >= 0:
                os.close(fd)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    if not said:
        raise OSError("the launcher ended before it could start")
    return int(said)


def start(
    folder: str, owner: str, user: str, arguments: list[str], env: dict[str, str], tty: int | None = None
) -> subprocess.Popen[bytes]:
    """Start the command (`arguments`: workdir, stdout, stderr, the command) as `user`; on the
    terminal whose slave is `tty`, where given: the leader of a session of its own, which has
    that terminal."""
    uid = gid = groups = None
    if user != "-":
        entry = pwd.getpwnam(user)
        uid, gid, groups = entry.pw_uid, entry.pw_gid, os.getgrouplist(entry.pw_name, entry.pw_gid)
    if tty is None:
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
    return subprocess.Popen(
        ["/bin/sh", "-c", AT_TERMINAL, "job", *arguments],
        env=env,
        stdin=tty,
        stdout=tty,
        stderr=tty,
        cwd="/",
        umask=0o022,
        user=uid,
        group=gid,
        extra_groups=groups,
        start_new_session=True,
        preexec_fn=terminal.take_terminal,  # noqa: PLW1509 - a launcher's own threads only sleep
    )


if __name__ == "__main__":
    if sys.argv[1:] != ["--serve"]:
        sys.exit("usage: python -I -S launcher.py --serve (gpupool's fork server of launchers)")
    serve()
