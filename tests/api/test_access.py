"""Who may see and do what (docs/access.md), route by route: every route of the OpenAPI document
has a rule in `gpupool.api.access.ROUTES` and a case here that calls it with team a's tokens
against team b's jobs (and a's own), so a new route cannot forget the rules."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.routing import APIWebSocketRoute

from gpupool.api.access import ROUTES, check_routes
from gpupool.api.metering import every_route
from tests.support.apiworld import ADMIN, World, auth, opened, populated


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    for api in opened(tmp_path):
        yield populated(api)


BRIEF_FIELDS = {"id", "label", "team", "priority", "state", "gpus", "brief"}


def health(w: World) -> None:
    assert w.api.client.get("/health").status_code == 200


def classes(w: World) -> None:
    assert w.api.client.get("/classes").status_code == 401
    listed = w.api.client.get("/classes", headers=auth(w.tokens["a1"]))
    assert listed.status_code == 200
    assert {c["name"] for c in listed.json()} == {"urgent", "interactive", "high", "normal", "low"}


def metrics(w: World) -> None:
    assert w.api.client.get("/metrics").status_code == 401
    job_token = w.attempt_tokens[w.job_b]
    assert w.api.client.get("/metrics", headers=auth(job_token)).status_code == 401
    for token in (w.tokens["a1"], w.tokens["b"], ADMIN):
        assert w.api.client.get("/metrics", headers=auth(token)).status_code == 200


def pool(w: World) -> None:
    gpus = w.api.client.get("/pool", headers=auth(w.tokens["a"])).json()["nodes"][0]["gpu_states"]
    held = {g["job"]: g for g in gpus if g["job"] is not None}
    assert (held[w.job_a]["team"], held[w.job_a]["user"]) == ("a", "a1")
    theirs = held[w.job_b]
    assert (theirs["team"], theirs["state"], theirs["user"]) == ("b", "allocated", None)
    admin = w.api.client.get("/pool", headers=auth(ADMIN)).json()["nodes"][0]["gpu_states"]
    assert {g["user"] for g in admin if g["job"] == w.job_b} == {"b1"}


def teams(w: World) -> None:
    listed = w.api.client.get("/teams", headers=auth(w.tokens["a"])).json()
    assert {t["name"] for t in listed} >= {"a", "b"}
    assert {t["token"] for t in listed} == {None}
    assert next(t for t in listed if t["name"] == "b")["using_gpus"] == 1


def set_team(w: World) -> None:
    for token in (w.tokens["a"], w.tokens["a1"]):
        for name in ("a", "b", "c"):
            refused = w.api.client.put(f"/teams/{name}", json={"weight": 9}, headers=auth(token))
            assert refused.status_code == 403, refused.text
    assert w.api.store.team("a").weight == 1.0  # type: ignore[union-attr]
    assert w.api.store.team("c") is None


def admin_only(method: str, path: str, body: dict[str, object] | None = None) -> Callable[[World], None]:
    """A change of the pool's policy: the admin's alone; no team's or user's token changes it."""

    def case(w: World) -> None:
        def policy() -> list[tuple[object, ...]]:
            store = w.api.store
            teams = [(t.name, t.weight, t.guaranteed_gpus) for t in store.teams()]
            users = [(u.name, u.team) for u in store.users()]
            budgets = [(b.team, b.priority, b.gpu_hours) for b in store.budget_use(500.0)[0]]
            return [*teams, *users, *budgets]

        before = policy()
        for token in (w.tokens["a"], w.tokens["a1"], w.attempt_tokens[w.job_a]):
            refused = w.api.client.request(method, path, json=body, headers=auth(token))
            assert refused.status_code in (401, 403), (path, refused.text)
        assert policy() == before
        done = w.api.client.request(method, path, json=body, headers=auth(ADMIN))
        assert done.status_code in (200, 204, 404, 409), (path, done.text)

    return case


def users(w: World) -> None:
    for token in (w.tokens["a"], w.tokens["a2"]):
        listed = w.api.client.get("/users", headers=auth(token)).json()
        assert {(u["name"], u["team"]) for u in listed} == {("a1", "a"), ("a2", "a")}
    assert {u["name"] for u in w.api.client.get("/users", headers=auth(ADMIN)).json()} == {"a1", "a2", "b1"}


def set_user(w: World) -> None:
    for body in ({"team": "a"}, {"team": "b", "new_token": True}):
        refused = w.api.client.put("/users/b1", json=body, headers=auth(w.tokens["a"]))
        assert refused.status_code == 403, refused.text
    assert w.api.client.put("/users/a3", json={"team": "a"}, headers=auth(w.tokens["a1"])).status_code == 403


def submit(w: World) -> None:
    body = {"command": ["true"], "workdir": str(w.api.workdir)}
    for token in (w.tokens["a"], w.tokens["a1"]):
        refused = w.api.client.post("/jobs", json={**body, "team": "b"}, headers=auth(token))
        assert refused.status_code == 403, refused.text
        assert "team a" in refused.json()["message"]
        assert "team b" in refused.json()["message"]
    made = w.api.client.post("/jobs", json=body, headers=auth(w.tokens["a2"])).json()
    assert (made["team"], made["user"]) == ("a", "a2")


def list_jobs(w: World) -> None:
    client = w.api.client
    for token in (w.tokens["a"], w.tokens["a1"]):
        listed = {j["id"]: j for j in client.get("/jobs", headers=auth(token)).json()}
        assert listed[w.job_a]["brief"] is False
        assert listed[w.job_a]["command"] == ["true"]
        theirs = listed[w.job_b]
        assert set(theirs) == BRIEF_FIELDS
        assert theirs == {
            "id": w.job_b,
            "label": str(w.job_b),
            "team": "b",
            "priority": "normal",
            "state": "running",
            "gpus": 1,
            "brief": True,
        }
        # Filters on what the brief view does not show cannot find other teams' jobs.
        for query in ("user=b1", "name=b-secret", f"array={w.job_b}", "user=b1&team=b", "name=b-secret&team=b"):
            found = client.get(f"/jobs?{query}", headers=auth(token))
            assert found.status_code == 200, found.text
            assert found.json() == [], query
        assert [j["id"] for j in client.get("/jobs?user=a1", headers=auth(token)).json()] == [w.job_a]
        assert [j["id"] for j in client.get("/jobs?team=b", headers=auth(token)).json()] == [w.job_b]
    admin = {j["id"]: j for j in client.get("/jobs", headers=auth(ADMIN)).json()}
    assert admin[w.job_b]["command"] == ["train", "--key=b-secret"]


def refused_for_team_a(w: World, path: str) -> None:
    for token in (w.tokens["a"], w.tokens["a1"]):
        refused = w.api.client.get(path.format(job=w.job_b), headers=auth(token))
        assert refused.status_code == 403, (path, refused.text)
        message = refused.json()["message"]
        assert "team a" in message
        assert "team b" in message
        assert "b-secret" not in refused.text
        own = w.api.client.get(path.format(job=w.job_a), headers=auth(token))
        assert own.status_code == 200, (path, own.text)


def show(w: World) -> None:
    refused_for_team_a(w, "/jobs/{job}")


def logs(w: World) -> None:
    for stream in ("stdout", "stderr"):
        refused_for_team_a(w, "/jobs/{job}/logs?stream=" + stream)
        own = w.api.client.get(f"/jobs/{w.job_a}/logs?stream={stream}", headers=auth(w.tokens["a"]))
        assert own.text == f"{stream} of job {w.job_a}\n"


def events(w: World) -> None:
    refused_for_team_a(w, "/events?job={job}")
    for token in (w.tokens["a"], w.tokens["a1"]):
        seen = {e["job_id"] for e in w.api.client.get("/events", headers=auth(token)).json()}
        assert seen == {w.job_a}
    assert {e["job_id"] for e in w.api.client.get("/events", headers=auth(ADMIN)).json()} == {w.job_a, w.job_b}


def history(w: World) -> None:
    for job in (w.job_a, w.job_b):
        w.api.executor.finish(job, 1, 0)
    w.api.loop.tick(400.0)
    client = w.api.client
    assert client.get("/history").status_code == 401
    assert client.get("/history", headers=auth(w.attempt_tokens[w.job_b])).status_code == 401

    def rows(token: str) -> list[str]:
        answer = client.get("/history", headers=auth(token))
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith("text/csv")
        return str(answer.text).splitlines()[1:]

    for token in (w.tokens["a"], w.tokens["a1"]):
        (mine,) = rows(token)
        assert mine.startswith(f"{w.job_a},") and ",a1,succeeded,normal,a," in mine
    assert sorted(row.split(",")[0] for row in rows(ADMIN)) == sorted([str(w.job_a), str(w.job_b)])


def report(w: World) -> None:
    mine = w.api.client.get("/report", headers=auth(w.tokens["a"])).json()
    everything = w.api.client.get("/report", headers=auth(ADMIN)).json()
    assert mine["pool"] == everything["pool"]
    assert mine["teams"] == everything["teams"]
    assert mine["classes"] == everything["classes"]
    assert set(everything["users"]) == {"a1", "b1"}
    assert set(mine["users"]) == {"a1"}
    assert {i["job"] for i in everything["interruptions"]} == {w.job_a, w.job_b}
    assert {i["job"] for i in mine["interruptions"]} == {w.job_a}


def cancel(w: World) -> None:
    client = w.api.client
    for token in (w.tokens["a"], w.tokens["a1"]):
        refused = client.post(f"/jobs/{w.job_b}/cancel", headers=auth(token))
        assert refused.status_code == 403, refused.text
        assert "team b" in refused.json()["message"]
    # A user's token cancels only the jobs that user submitted; the team's token any of its team's.
    not_theirs = client.post(f"/jobs/{w.job_a}/cancel", headers=auth(w.tokens["a2"]))
    assert not_theirs.status_code == 403, not_theirs.text
    assert "a1" in not_theirs.json()["message"]
    assert client.post(f"/jobs/{w.job_a}/cancel", headers=auth(w.tokens["a1"])).status_code == 200
    other = w.api.submit(w.tokens["a2"])
    assert client.post(f"/jobs/{other['id']}/cancel", headers=auth(w.tokens["a"])).status_code == 200
    assert w.api.store.job(w.job_b).cancel_requested_at is None


def act(method: str, path: str, body: dict[str, object] | None = None) -> Callable[[World], None]:
    """A change of a job after submit (hold, release, update, requeue): as cancel, its own team's
    alone, a user's token only the jobs that user submitted."""

    def case(w: World) -> None:
        client = w.api.client
        for token in (w.tokens["a"], w.tokens["a1"]):
            refused = client.request(method, path.format(job=w.job_b), json=body, headers=auth(token))
            assert refused.status_code == 403, (path, refused.text)
            assert "team b" in refused.json()["message"]
        not_theirs = client.request(method, path.format(job=w.job_a), json=body, headers=auth(w.tokens["a2"]))
        assert not_theirs.status_code == 403, not_theirs.text
        own = client.request(method, path.format(job=w.job_a), json=body, headers=auth(w.tokens["a1"]))
        assert own.status_code in (200, 409), (path, own.text)  # 409: not in a state it applies to

    return case


def protocol(action: str, body: dict[str, object] | None) -> Callable[[World], None]:
    def case(w: World) -> None:
        path = f"/jobs/{{job}}/attempts/1/{action}"
        for token in (ADMIN, w.tokens["a"], w.tokens["a1"], w.attempt_tokens[w.job_a]):
            refused = w.api.client.post(path.format(job=w.job_b), json=body, headers=auth(token))
            assert refused.status_code == 403, (action, refused.text)
        for token in (ADMIN, w.tokens["a"], w.tokens["a1"]):
            refused = w.api.client.post(path.format(job=w.job_a), json=body, headers=auth(token))
            assert refused.status_code == 403, (action, refused.text)
        own = w.api.client.post(path.format(job=w.job_a), json=body, headers=auth(w.attempt_tokens[w.job_a]))
        assert own.status_code in (200, 204, 409), (action, own.text)

    return case


CASES: dict[tuple[str, str], Callable[[World], None]] = {
    ("GET", "/health"): health,
    ("GET", "/classes"): classes,
    ("GET", "/pool"): pool,
    ("GET", "/teams"): teams,
    ("PUT", "/teams/{name}"): set_team,
    ("GET", "/users"): users,
    ("PUT", "/users/{name}"): set_user,
    ("POST", "/jobs"): submit,
    ("GET", "/jobs"): list_jobs,
    ("GET", "/jobs/{job_id}"): show,
    ("GET", "/jobs/{job_id}/logs"): logs,
    ("GET", "/events"): events,
    ("GET", "/report"): report,
    ("GET", "/history"): history,
    ("GET", "/metrics"): metrics,
    ("POST", "/jobs/{job_id}/cancel"): cancel,
    ("DELETE", "/teams/{name}"): admin_only("DELETE", "/teams/b"),
    ("PUT", "/teams/{name}/budgets/{priority}"): admin_only(
        "PUT", "/teams/b/budgets/normal", {"gpu_hours": 1, "window": 3600}
    ),
    ("DELETE", "/teams/{name}/budgets/{priority}"): admin_only("DELETE", "/teams/b/budgets/normal"),
    ("DELETE", "/users/{name}"): admin_only("DELETE", "/users/b1"),
    ("POST", "/jobs/{job_id}/hold"): act("POST", "/jobs/{job}/hold"),
    ("POST", "/jobs/{job_id}/release"): act("POST", "/jobs/{job}/release"),
    ("PATCH", "/jobs/{job_id}"): act("PATCH", "/jobs/{job}", {"time_limit": 60}),
    ("POST", "/jobs/{job_id}/requeue"): act("POST", "/jobs/{job}/requeue"),
    ("POST", "/jobs/{job_id}/attempts/{attempt}/heartbeat"): protocol("heartbeat", {"step": 1}),
    ("POST", "/jobs/{job_id}/attempts/{attempt}/checkpoint"): protocol("checkpoint", {"step": 1}),
    ("POST", "/jobs/{job_id}/attempts/{attempt}/ack"): protocol("ack", None),
    ("POST", "/jobs/{job_id}/attempts/{attempt}/complete"): protocol("complete", None),
    ("POST", "/jobs/{job_id}/attempts/{attempt}/server"): protocol(
        "server", {"port": 8888, "token": "a-token-of-sixteen-or-more"}
    ),
}


def test_every_route_of_the_openapi_document_has_a_rule_and_a_case_here(world: World) -> None:
    paths = world.api.app.openapi()["paths"]
    routes = {(method.upper(), path) for path, operations in paths.items() for method in operations}
    # WebSockets are not in the OpenAPI document; their cases are in tests/api/test_sessions.py.
    sockets = {("WS", r.path) for r in every_route(world.api.app.routes) if isinstance(r, APIWebSocketRoute)}
    assert sockets == {("WS", "/jobs/{job_id}/terminal"), ("WS", "/ui/notebooks/{job_id}/{path:path}")}
    assert routes - set(ROUTES) == set(), "routes without a rule in gpupool.api.access.ROUTES"
    assert set(ROUTES) - routes - sockets == set(), "rules of routes that do not exist"
    assert ("WS", "/jobs/{job_id}/terminal") in ROUTES  # the notebook's is a page: it checks its cookie
    assert routes - set(CASES) == set(), "routes without a case in this test"


@pytest.mark.parametrize("route", sorted(CASES), ids=" ".join)
def test_a_team_sees_the_pool_and_its_own_jobs_in_full_and_others_jobs_at_most_briefly(
    world: World, route: tuple[str, str]
) -> None:
    CASES[route](world)


def test_a_new_token_keeps_the_teams_policy(world: World) -> None:
    client = world.api.client
    made = client.put("/teams/a", json={"weight": 3, "guaranteed_gpus": 2, "classes": ["low"]}, headers=auth(ADMIN))
    assert made.status_code == 200, made.text
    renewed = client.put("/teams/a", json={"new_token": True}, headers=auth(ADMIN)).json()
    assert (renewed["weight"], renewed["guaranteed_gpus"], renewed["classes"]) == (3.0, 2, ["low"])
    assert renewed["token"]
    assert client.get("/jobs", headers=auth(world.tokens["a"])).status_code == 401
    assert client.get("/jobs", headers=auth(renewed["token"])).status_code == 200


def test_a_route_without_a_rule_stops_the_service_from_starting() -> None:
    check_routes([("GET", "/jobs"), ("GET", "/docs"), ("GET", "/openapi.json")])
    with pytest.raises(RuntimeError, match="secrets"):
        check_routes([("GET", "/jobs"), ("GET", "/jobs/{job_id}/secrets")])
