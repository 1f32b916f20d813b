from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from gpupool.service.snapshots import CHECK

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=200)
settings.register_profile("repeatable", derandomize=True, deadline=None, max_examples=100)
settings.register_profile("dev", deadline=None, max_examples=100)
settings.register_profile("stress", deadline=None, max_examples=3000)
# The test command's examples are the same at every run (a share of examples that shows a case
# must not pass or fail by chance); `dev` and `stress` draw new ones, to search.
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "repeatable"))

if TYPE_CHECKING:
    from gpupool.demo.loopback import LoopbackCluster

REPO = Path(__file__).resolve().parents[1]

# Every live loop of the tests (in this process or a `gpupool up` it starts) checks, at every
# decision, that the snapshot it keeps from the store's change journal is the one a whole read
# gives (gpupool.service.snapshots): a write the journal missed fails the test that made it.
os.environ[CHECK] = "1"


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """The public traces of ../shared/data/traces (or $GPUPOOL_TRACES)."""
    path = Path(os.environ.get("GPUPOOL_TRACES", REPO.parent / "shared" / "data" / "traces"))
    if not path.is_dir():
        pytest.fail(f"trace folder {path} is missing: tests read ../shared/data/traces")
    return path


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real PostgreSQL server on loopback, one per test process."""
    from tests.support.pgserver import postgres_server

    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database on each backend: a SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gpupool.db'}"
    import psycopg

    server: str = request.getfixturevalue("postgres_url")
    name = f"t{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return server.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[LoopbackCluster]:
    """A real Ray cluster of three nodes on loopback (127.0.K.2-4, four virtual GPUs each),
    started once per test process that needs one (K is the process's number under xdist)."""
    pytest.importorskip("ray", reason="the Ray executor's tests need gpupool[ray]")
    import shutil
    import tempfile

    import ray

    from gpupool.demo.loopback import LoopbackCluster

    root = Path(tempfile.mkdtemp(prefix="gpupool-ray-"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    cluster = LoopbackCluster(root, k=int(worker.removeprefix("gw") or 0) % 8)
    try:
        cluster.start()
        ray.init(address=cluster.address, namespace="gpupool-tests", log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cluster(ray_cluster: LoopbackCluster) -> Iterator[LoopbackCluster]:
    """The cluster, every node of it up, and nothing of an earlier test's left on it."""
    import ray
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

    if not ray.is_initialized():  # a test's executor may have let go of it
        ray.init(address=ray_cluster.address, namespace="gpupool-tests", log_to_driver=False)
    alive = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}  # type: ignore[no-untyped-call]
    for index in range(ray_cluster.nodes):
        if ray_cluster.ip(index) not in alive:
            ray_cluster.add_node(index)
    yield ray_cluster
    for entry in ray.util.list_named_actors(all_namespaces=True):
        try:
            ray.kill(ray.get_actor(entry["name"], namespace=entry["namespace"]), no_restart=True)
        except ValueError:
            continue
    for group_id, entry in placement_group_table().items():
        if entry["state"] != "REMOVED":
            remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(group_id)))


@pytest.fixture
def jobs_tried(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the jobs a decision's queue pass tries to place, in order: for the tests of
    the jobs it goes by without trying them (they decide once, not both ways)."""
    from gpupool.model import Job
    from gpupool.policy import queue
    from gpupool.policy.decision import Decision, Fit
    from gpupool.policy.drain import Orphans

    tried: list[str] = []
    place = queue._place

    def counted(decision: Decision, job: Job, orphans: Orphans) -> Fit:
        tried.append(job.id)
        return place(decision, job, orphans)

    monkeypatch.setattr(queue, "_place", counted)
    return tried
