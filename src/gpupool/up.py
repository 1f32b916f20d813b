"""`gpupool up`: the store, the control loop, the local executor and the API, in one process:
the one place that puts the service (`gpupool.service`) and the API (`gpupool.api`) together.

Before anything is decided: the data directory is checked (its own, private, writable), locked
against a second scheduler, and matched with the store (`leader`); jobs' users are checked to
be reachable (`executors/users.py`). The port is bound before the loop starts, so a service
that cannot serve never schedules.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

import uvicorn

from gpupool.api import Context, create_app
from gpupool.config import ConfigError, build
from gpupool.config.specs import ConfigSpec, ContainmentSpec, ServiceSpec
from gpupool.executors import Executor, NodeState, executor_of
from gpupool.executors.cgroups import node_cpus, node_memory
from gpupool.executors.containment import Containment, ContainmentUnavailable, detect
from gpupool.executors.local import LocalExecutor
from gpupool.executors.local.gpus import discover
from gpupool.executors.local.nvml import GpuWatch
from gpupool.executors.users import can_switch_users
from gpupool.model import Config
from gpupool.service.leader import IDENTITY, Guard, NotLeader, StoreLease, claim_data_dir, lock_data_dir
from gpupool.service.loop import ControlLoop
from gpupool.service.notify import Notifier
from gpupool.service.observer import Lineup, Observers
from gpupool.service.workspace import token_hash
from gpupool.store import Store
from gpupool.store.engine import DATABASE, open_engine, sqlite_url
from gpupool.telemetry import Telemetry
from gpupool.units import plural

ADMIN_TOKEN = "admin.token"
log = logging.getLogger("gpupool.up")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (for demos and tests on loopback)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def admin_token(data_dir: Path) -> str:
    """The admin token of this data directory, made on first use (readable by its owner only)."""
    path = data_dir / ADMIN_TOKEN
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as stream:
            stream.write(secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


def prepare_data_dir(service: ServiceSpec) -> Path:
    """The data directory, made private if new; refused if others may read or write it or what
    it holds, if it is another user's, or if it cannot be written. Jobs of other OS users may
    pass through it (mode 0711) to reach their own folders, never list or read it."""
    data_dir = service.data_path
    reach = 0o711 if service.run_as != "service" else 0o700
    if not data_dir.exists():
        data_dir.mkdir(parents=True, mode=0o700)
    info = data_dir.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"service.data_dir: {data_dir} is not a folder")
    if info.st_uid != os.geteuid():
        raise ConfigError(f"service.data_dir: {data_dir} belongs to another user (uid {info.st_uid}), not to gpupool's")
    for path in (data_dir, *(data_dir / name for name in (ADMIN_TOKEN, DATABASE, f"{DATABASE}-wal", IDENTITY))):
        if path.exists() and path.stat().st_mode & 0o066:
            mode = stat.S_IMODE(path.stat().st_mode)
            fix = f"chmod {(f'{reach:o}' if path == data_dir else '600')} {path}"
            raise ConfigError(
                f"service.data_dir: {path} may be read or written by others (mode {mode:o}): it holds the "
                f"store and the tokens; {fix}"
            )
    if reach == 0o711:
        closed = next((p for p in data_dir.resolve().parents if not p.stat().st_mode & stat.S_IXOTH), None)
        if closed is not None:
            raise ConfigError(
                f"service.data_dir: jobs run as other users and must reach their folders in {data_dir}, but "
                f"{closed} is closed to them (chmod o+x {closed}, or use a data_dir such as /var/lib/gpupool)"
            )
    if not _writable(data_dir):
        raise ConfigError(f"service.data_dir: {data_dir} cannot be written (a read-only file system, or no space)")
    data_dir.chmod(reach)
    jobs = data_dir / "jobs"
    if jobs.is_dir() and not jobs.is_symlink():
        # Folders made by earlier versions with the default umask are closed up too.
        for folder in (jobs, *jobs.iterdir()):
            if folder.is_dir() and not folder.is_symlink() and folder.stat().st_mode & 0o066:
                folder.chmod(reach)
    return data_dir


def _writable(folder: Path) -> bool:
    probe = folder / f".probe-{os.getpid()}"
    try:
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError:
        return False
    return True


def warn_of_guarantees(store: Store) -> None:
    """Say loudly when the teams' guarantees add up to more than the pool (the file may say so,
    or nodes may be down): the scheduler still starts, and reclaims what it can
    (docs/configuration.md, "Guarantees")."""
    over = store.guarantees_over_pool()
    if over is not None:
        guaranteed, pool = over
        log.warning(
            "the teams' guarantees add up to %s and the pool has %s: not every team can have its "
            "guarantee at once (gpupool team list; lower one with gpupool team set NAME --guaranteed-gpus N)",
            plural(guaranteed, "GPU"),
            plural(pool, "GPU"),
        )


def check_run_as(service: ServiceSpec) -> None:
    """Refuse a `run_as` this process cannot carry out; warn loudly about `service`."""
    if service.run_as == "service":
        log.warning(
            "service.run_as is 'service': jobs run as gpupool's own user and can read its store and tokens; "
            "only for a machine with a single user (on a shared one: run_as: submitter or team)"
        )
        return
    if not can_switch_users():
        raise ConfigError(
            f"service.run_as: {service.run_as!r} runs jobs as other OS users, which needs gpupool up to run "
            "as root. On a machine with a single user, set service.run_as: service "
            "(or gpupool up --run-as service): jobs then run as you and can read the scheduler's data"
        )


class Server(uvicorn.Server):
    """uvicorn, stopped the same way by SIGTERM and SIGINT: it stops answering, and `run`
    returns so that the caller shuts down in order (uvicorn itself raises the signal again once
    it has stopped, which ends the process before any code of ours runs)."""

    stopped_by: int | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop(self, sig: int, _frame: FrameType | None) -> None:
        self.stopped_by = self.stopped_by or sig
        self.should_exit = True


@dataclass(frozen=True, slots=True)
class Pool:
    """What `gpupool up` says of the GPUs it schedules."""

    detail: str
    virtual: bool
    containment: str = ""
    """How attempts are contained, in a sentence (cgroups, or why not)."""
    contained: bool = False


@dataclass
class Running:
    """A started service: what `gpupool up` prints, and what tests need to stop it."""

    store: Store
    loop: ControlLoop
    gpus: Pool
    server: Server
    stop: threading.Event
    loop_thread: threading.Thread
    sockets: list[socket.socket] = field(default_factory=list)
    lock: int | None = None
    lease: StoreLease | None = None
    telemetry: Telemetry | None = None
    telemetry_thread: threading.Thread | None = None

    def serve(self) -> None:
        """Answer the API until `server.should_exit` (a signal, see `gpupool.cli.up`)."""
        self.server.run(sockets=self.sockets)


def start(spec: ConfigSpec) -> Running:
    """Check and lock the data directory, open the store, register this machine's GPUs, bind
    the port and start the control loop in a thread. The caller runs `serve()` (it blocks until
    the server is told to exit), then `shut_down`."""
    service = spec.service
    config = build(spec)
    check_run_as(service)
    if service.store is not None and service.store.startswith("sqlite"):
        raise ConfigError(
            "service.store: a SQLite store lives in the data directory (leave service.store out); "
            "service.store is for PostgreSQL, whose lease keeps one scheduler per store"
        )
    if service.store is not None:
        open_engine(service.store).dispose()  # a store that cannot be reached: nothing is made
    data_dir = prepare_data_dir(service)
    os.umask(0o077)  # what the scheduler writes is its own; jobs' folders are given modes
    lock = lock_data_dir(data_dir)
    try:
        return _start(spec, config, data_dir, lock)
    except BaseException:
        os.close(lock)
        raise


def _start(spec: ConfigSpec, config: Config, data_dir: Path, lock: int) -> Running:
    service = spec.service
    store = Store.open(service.store or sqlite_url(data_dir))
    lease = None
    if store.engine.dialect.name == "postgresql":
        lease = StoreLease(store.engine)
        if not lease.acquire():
            store.close()
            raise NotLeader(f"another gpupool up leads the store {service.store}: one scheduler per store")
    identity = store.identity()
    claim_data_dir(data_dir, identity.id, fresh_store=identity.legacy_below == 1)
    store.sync_config(config)
    database = data_dir / DATABASE if service.store is None else None
    check_executor(store, service)
    wakeup = threading.Event()
    attempts, pool = executor(service, identity.id, wakeup.set)
    loop = ControlLoop(
        store,
        config,
        attempts,
        data_dir,
        service.url,
        service.interval,
        wakeup=wakeup,
        job_user=service.job_user_template,
        guard=Guard(data_dir, identity.id, database, lease),
    )
    loop.sync_nodes()
    warn_of_guarantees(store)
    telemetry, lineup = Telemetry(store), Lineup()
    loop.observer = Observers([telemetry, lineup])
    app = create_app(Context(store, loop, token_hash(admin_token(data_dir)), telemetry=telemetry, lineup=lineup))
    listening = socket.create_server((service.host, service.port), reuse_port=False)
    server = Server(uvicorn.Config(app, host=service.host, port=service.port, log_level="warning", lifespan="off"))
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), name="control-loop", daemon=True)
    thread.start()
    metrics = threading.Thread(target=telemetry.run, args=(stop,), name="telemetry", daemon=True)
    metrics.start()
    notifier = Notifier(store, service.webhooks, data_dir)
    threading.Thread(target=notifier.run, args=(stop,), name="webhooks", daemon=True).start()
    return Running(store, loop, pool, server, stop, thread, [listening], lock, lease, telemetry, metrics)


def check_executor(store: Store, service: ServiceSpec) -> None:
    """Refuse another executor than the one whose attempts still run: it could not find them,
    and would requeue jobs whose processes go on."""
    others: dict[str, list[int]] = {}
    for attempt in store.live_attempts():
        kind = executor_of(attempt.handle)
        if kind is not None and kind != service.executor:
            others.setdefault(kind, []).append(attempt.job_id)
    for kind, jobs in others.items():
        shown = ", ".join(str(j) for j in jobs[:10]) + (", …" if len(jobs) > 10 else "")
        raise ConfigError(
            f"service.executor: {service.executor}, but {plural(len(jobs), 'attempt')} the {kind} executor started "
            f"still run (jobs {shown}): keep executor {kind} until they end, or cancel them first"
        )


def executor(service: ServiceSpec, store_id: str, wake: Callable[[], None]) -> tuple[Executor, Pool]:
    """The executor `service.executor` names, and what to say of its GPUs."""
    if service.executor == "ray":
        try:
            from gpupool.executors.ray.executor import RayExecutor
        except ImportError:
            raise ConfigError("service.executor: ray needs Ray: pip install 'gpupool[ray]'") from None
        containment, said = contain(service.containment, store_id)
        try:
            ray_executor = RayExecutor(
                service.ray_address, store_id, wake, service.start_timeout, containment=containment
            )
        except ConnectionError as exc:
            raise ConfigError(f"service.ray_address: no Ray cluster at {service.ray_address} ({exc})") from None
        nodes = ray_executor.nodes()
        far = [ip for ip in ray_executor.pool.addresses() if not ip.startswith("127.")]
        here_only = ("127.", "localhost", "0.0.0.0", "::")
        if far and (urlsplit(service.url).hostname or "").startswith(here_only):
            log.warning(
                "the API is at %s, which the ranks on %s cannot reach: set service.api_url (docs/cluster.md)",
                service.url,
                ", ".join(far),
            )
        gpus = sum(n.node.gpus for n in nodes)
        detail = f"Ray cluster at {service.ray_address}: {plural(len(nodes), 'node')} with GPUs, {gpus} GPUs"
        virtual = bool(nodes) and all(n.virtual for n in nodes)
        return ray_executor, Pool(detail, virtual, f"{said} (where each node allows)", containment is not None)
    gpus_here = discover(socket.gethostname(), service.virtual_gpus)
    containment, said = contain(service.containment, store_id)
    node = NodeState(gpus_here.node, gpus_here.virtual, node_memory(), node_cpus())
    watch = None if gpus_here.virtual else GpuWatch(containment.root if containment else None, store_id)
    local = LocalExecutor(node, on_exit=wake, store_id=store_id, containment=containment, watch=watch)
    return local, Pool(gpus_here.detail, gpus_here.virtual, said, containment is not None)


def contain(spec: ContainmentSpec, store_id: str) -> tuple[Containment | None, str]:
    """The containment the configuration asks for and this host allows, and what to say of it."""
    wanted = Containment(
        store_id,
        spec.cgroup_root,
        spec.mem_per_gpu,
        spec.cpus_per_gpu,
        spec.cpu_limit == "quota",
        spec.pids,
        spec.gpu_devices,
    )
    try:
        return detect(spec.mode, wanted)
    except ContainmentUnavailable as exc:
        raise ConfigError(f"service.containment: {exc}") from None


def shut_down(running: Running) -> None:
    """Stop deciding; running attempts go on and are adopted by the next `gpupool up`."""
    running.stop.set()
    running.loop.wakeup.set()
    if running.telemetry is not None:
        running.telemetry.poke.set()
    running.loop_thread.join(timeout=10)
    if running.loop_thread.is_alive():
        # Still acting on a decision: the lock and lease stay held until the process ends.
        log.error("the control loop did not stop within 10 s; its locks go with the process")
        running.store.close()
        return
    running.loop.executor.close()
    if running.telemetry_thread is not None:
        running.telemetry_thread.join(timeout=10)
    if running.lease is not None:
        running.lease.release()
    running.store.close()
    if isinstance(running.loop.guard, Guard):
        running.loop.guard.close()
    for sock in running.sockets:
        sock.close()
    if running.lock is not None:
        os.close(running.lock)
        running.lock = None
