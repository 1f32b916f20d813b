"""The dashboard's pages as HTML (the test client, no browser): no token no data, a team's token
sees the pool and its own team's jobs, nothing is loaded from elsewhere, the sign-in cannot be
driven from another site, and the API never takes the page's cookie."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.support.apiworld import ADMIN, World, auth, opened, populated

PAGES = ["/ui/pool", "/ui/queue", "/ui/teams", "/ui/interruptions", "/ui/jobs/1"]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    for api in opened(tmp_path):
        yield populated(api)


def signed_in(world: World, token: str) -> TestClient:
    client = TestClient(world.api.app)
    answer = client.post("/ui/signin", data={"token": token, "next": "/ui/queue"}, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/ui/queue"
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert "Path=/ui" in cookie
    return client


@pytest.mark.parametrize("page", PAGES)
def test_no_token_no_data(world: World, page: str) -> None:
    client = TestClient(world.api.app)
    answer = client.get(page, follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/ui/signin?next={page}"
    assert client.get(page + "?fragment=1").status_code == 401
    client.cookies.set("gpupool_token", "not-a-token")
    assert client.get(page, follow_redirects=False).status_code == 303


def test_a_wrong_token_or_a_jobs_token_does_not_sign_in(world: World) -> None:
    client = TestClient(world.api.app)
    wrong = client.post("/ui/signin", data={"token": "guess"})
    assert wrong.status_code == 401
    assert "not the admin" in wrong.text
    job = client.post("/ui/signin", data={"token": world.attempt_tokens[world.job_a]})
    assert job.status_code == 401
    assert "set-cookie" not in job.headers


def test_a_team_sees_the_pool_and_its_own_jobs_and_others_only_briefly(world: World) -> None:
    team_a = signed_in(world, world.tokens["a"])
    pool = team_a.get("/ui/pool").text
    assert f'href="/ui/jobs/{world.job_a}"' in pool
    assert f'href="/ui/jobs/{world.job_b}"' not in pool  # another team's job: named, not linked
    assert "b1" not in pool  # nor its user
    queue = team_a.get("/ui/queue").text
    assert "a-job" in queue
    assert "b-secret" not in queue
    theirs = team_a.get(f"/ui/jobs/{world.job_b}")
    assert theirs.status_code == 403
    assert f"may not see job {world.job_b} of team b" in theirs.text
    assert "b-secret" not in theirs.text
    assert "stdout of job" not in theirs.text  # its log neither
    mine = team_a.get(f"/ui/jobs/{world.job_a}")
    assert mine.status_code == 200
    assert f"stdout of job {world.job_a}" in mine.text
    admin = signed_in(world, ADMIN)
    assert "b-secret" in admin.get(f"/ui/jobs/{world.job_b}").text
    assert "b1" in admin.get("/ui/pool").text


def test_pages_load_only_their_own_files(world: World) -> None:
    client = signed_in(world, ADMIN)
    for page in [*PAGES, "/ui/signin"]:
        html = client.get(page).text
        for url in re.findall(r"""(?:src|href|action)=["']([^"']+)["']""", html):
            assert url.startswith("/"), f"{page} refers to {url}"
            assert not url.startswith("//"), f"{page} refers to {url}"
        for asset in re.findall(r"""(?:src|href)=["'](/ui/static/[^"']+)["']""", html):
            assert client.get(asset).status_code == 200, asset


def test_sign_in_from_another_site_is_refused_and_goes_nowhere_else(world: World) -> None:
    client = TestClient(world.api.app)
    evil = client.post("/ui/signin", data={"token": world.tokens["a"]}, headers={"Origin": "https://evil.example"})
    assert evil.status_code == 403
    for target in ("https://evil.example/", "//evil.example/", "/\\evil.example", "/jobs"):
        answer = client.post("/ui/signin", data={"token": ADMIN, "next": target}, follow_redirects=False)
        assert answer.headers["location"] == "/ui/pool", target


def test_the_api_never_takes_the_pages_cookie(world: World) -> None:
    client = signed_in(world, ADMIN)
    assert client.get("/jobs").status_code == 401
    assert client.post("/jobs", json={"command": ["true"]}).status_code == 401
    assert client.get("/jobs", headers=auth(ADMIN)).status_code == 200


def test_the_queue_shows_each_pending_jobs_place_in_line_and_why(world: World) -> None:
    api = world.api
    first = api.submit(world.tokens["a"], name="waits-first", gpus=4)
    second = api.submit(world.tokens["a"], name="waits-second", gpus=4)
    api.loop.tick(400.0)
    assert api.lineup is not None
    assert api.lineup.places == {first["id"]: 1, second["id"]: 2}
    html = signed_in(world, world.tokens["a"]).get("/ui/queue").text
    rows = re.findall(r'<tr data-job="(\d+)">\s*<td>(\d+|—)</td>', html)
    assert rows[:2] == [(str(first["id"]), "1"), (str(second["id"]), "2")]
    assert "<code>" in html  # each with its reason's code and words


def test_interruptions_are_the_teams_own_with_their_cost(world: World) -> None:
    team_a = signed_in(world, world.tokens["a"]).get("/ui/interruptions").text
    rows = re.findall(r'<tr data-job="(\d+)">', team_a)
    assert rows == [str(world.job_a)]  # each job failed once and was retried: only a's is a's to see
    assert "of team a" in team_a
    admin = signed_in(world, ADMIN).get("/ui/interruptions").text
    assert sorted(re.findall(r'<tr data-job="(\d+)">', admin)) == sorted([str(world.job_a), str(world.job_b)])
    assert "<svg" in admin
    # The chart, its axis and the total above it say GPU time in one unit, scaled for people.
    (total,) = re.findall(r"cost <b>([\d.]+) (GPU·\w+)</b>", admin)
    assert f"{total[1]} lost to interruptions, per" in admin
    top, bottom = re.findall(r'text-anchor="end">([^<]+)</text>', admin)[:2]
    assert float(top) > 0 and bottom == "0", "a y axis labelled 0 and 0 says nothing"


def test_the_pool_counts_every_gpu_and_shows_the_nodes_asked_for(world: World) -> None:
    client = signed_in(world, ADMIN)
    everything = client.get("/ui/pool").text
    assert re.findall(r"<b>(\d+)</b> (idle|allocated)", everything) == [("2", "idle"), ("2", "allocated")]
    assert 'aria-label="node gpu0"' in everything
    assert 'aria-label="node gpu0"' in client.get("/ui/pool?state=allocated").text
    assert 'aria-label="node gpu0"' not in client.get("/ui/pool?state=draining").text
    assert client.get("/ui/pool?state=nonsense").status_code == 400


# --- review findings ----------------------------------------------------------------------------


def test_a_job_whose_output_is_endless_shows_its_last_part(world: World) -> None:
    api = world.api
    job = api.submit(world.tokens["a"], name="zeros", output="/dev/zero")
    api.loop.tick(500.0)
    page = signed_in(world, world.tokens["a"]).get(f"/ui/jobs/{job['id']}")
    assert page.status_code == 200
    assert len(page.content) < 200_000


def test_another_teams_jobs_show_no_times_nor_places(world: World) -> None:
    html = signed_in(world, world.tokens["a"]).get("/ui/queue").text
    theirs = re.search(rf'<tr data-job="{world.job_b}">(.*?)</tr>', html, re.S)
    assert theirs is not None
    cells = re.findall(r"<td>(.*?)</td>", theirs.group(1), re.S)
    assert "gpu0" not in theirs.group(1)
    assert not any(re.search(r"\d+ (s|min|h|d)\b", c) for c in cells), cells


@pytest.mark.parametrize(
    "page",
    ["/ui/pool?page=0", "/ui/pool?state=bogus", "/ui/jobs/abc", "/ui/jobs/99999999999", "/ui/interruptions?days=0",
     "/ui/interruptions?days=nan", "/ui/queue?team=" + "x" * 300],
)  # fmt: skip
def test_a_bad_address_gets_a_page_that_says_what_is_wrong(world: World, page: str) -> None:
    answer = signed_in(world, ADMIN).get(page)
    assert answer.status_code in (400, 404, 422)
    assert answer.headers["content-type"].startswith("text/html")
    assert 'role="alert"' in answer.text


def test_a_store_that_does_not_answer_gets_a_page_not_a_traceback(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.exc import OperationalError

    client = signed_in(world, ADMIN)

    def locked(*_: object, **__: object) -> None:
        raise OperationalError("SELECT", {}, Exception("database is locked"))

    monkeypatch.setattr(world.api.store, "listing", locked)
    answer = client.get("/ui/queue")
    assert answer.status_code == 503
    assert answer.headers["content-type"].startswith("text/html")
    monkeypatch.setattr(world.api.store, "holder_of", locked)
    team = TestClient(world.api.app)
    team.cookies.set("gpupool_token", world.tokens["a"])
    for attempt in (team.get("/ui/pool"), team.post("/ui/signin", data={"token": world.tokens["a"]})):
        assert attempt.status_code == 503
        assert attempt.headers["content-type"].startswith("text/html")


def test_signing_in_keeps_the_filters_asked_for(world: World) -> None:
    client = TestClient(world.api.app)
    answer = client.get("/ui/queue?team=b&class=low", follow_redirects=False)
    assert answer.headers["location"] == "/ui/signin?next=/ui/queue%3Fteam%3Db%26class%3Dlow"
    signin = client.get(answer.headers["location"]).text
    assert 'value="/ui/queue?team=b&amp;class=low"' in signin
    assert "http-equiv" not in signin  # no reload while a token is typed


def test_the_live_part_is_fetched_from_the_same_page(world: World) -> None:
    html = signed_in(world, ADMIN).get("/ui/pool?%23=1&state=allocated").text
    live = re.search(r'data-live="([^"]+)"', html)
    assert live is not None
    assert "#" not in live.group(1)
    assert live.group(1).startswith("/ui/pool?")
    assert live.group(1).endswith("fragment=1")


def test_no_place_in_line_is_shown_once_no_decision_is_made(world: World) -> None:
    api = world.api
    first = api.submit(world.tokens["a"], name="waits", gpus=4)
    api.loop.tick(400.0)
    assert api.lineup is not None
    assert api.lineup.places == {first["id"]: 1}
    api.store.cancel(int(str(first["id"])), 401.0)
    api.loop.tick(402.0)
    assert api.lineup.places == {}
