"""The README's own examples, and those of the pages in docs/, run as written against `gpupool up`
in a fresh data directory.

Every `gpupool submit` line of the shell blocks of the README and then of each page of docs/ (with
the shell lines that set what they use, such as `first=$(gpupool submit --parsable ...)`, and
the lines a trailing backslash continues) and every inline example of one runs verbatim, in
order, in one shell; each must succeed, and so must every job they submit. A line of a page that
is the very line of an earlier page is run once. The few that ask for more than this machine is
(`NEEDS_A_CLUSTER`: GPUs on several nodes) are submitted too, each on its own, and must be
refused for that reason alone: the pool is too small, and nothing else in them is wrong.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gpupool.executors.proc import kill_attempts
from gpupool.up import free_port
from tests.support.live import wait_for

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"

TWO_NODES = (
    "asks for 2 nodes of 8 GPUs (a multi-node gang, docs/cluster.md), and the lab is one machine of 8: "
    "it needs a cluster of GPU servers, which this test does not have"
)
NEEDS_A_CLUSTER = {
    # the first line of the command: why it cannot run here
    "gpupool submit --gpus 16 --gpus-per-node 8 -p high -- python train.py": TWO_NODES,
    "gpupool submit --gpus 16 --gpus-per-node 8 -p high --wrap \\": TWO_NODES,
}
"""Examples of the docs that cannot run on one machine, each with the reason."""


def submit_lines(text: str) -> list[str]:
    """A page's submit examples, in the order they appear."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for line in re.split(r"(?<!\\)\n", block):  # a line a backslash continues is one command
            command = line.split("  #", 1)[0].strip()
            if re.match(r"^(\w+=\$\()?gpupool submit ", command):
                lines.append(command)
    prose = "\n".join(line for line in text.splitlines() if not line.startswith("|"))  # tables name forms
    lines += re.findall(r"`(gpupool submit [^`]+)`", prose)
    return lines


def pages() -> list[Path]:
    """The README, then the pages of docs/ by name: the order their examples run in."""
    return [README, *sorted(DOCS.glob("*.md"))]


def examples() -> list[tuple[Path, str]]:
    """Every page's submit examples, each once (the first page that gives it runs it)."""
    found: dict[str, Path] = {}
    for page in pages():
        for line in submit_lines(page.read_text()):
            found.setdefault(line, page)
    return [(page, line) for line, page in found.items()]


def needs_a_cluster(line: str) -> str | None:
    return NEEDS_A_CLUSTER.get(line.splitlines()[0])


def test_the_readme_has_submit_examples_to_run() -> None:
    lines = submit_lines(README.read_text())
    assert len(lines) >= 6
    assert "gpupool submit -- python -m gpupool.examples.torch_trainer --steps 200" in lines
    assert not [line for line in lines if needs_a_cluster(line)]  # a lab's day runs on one machine


def test_the_docs_pages_have_submit_examples_and_each_that_cannot_run_says_why() -> None:
    from_docs = [(page.name, line) for page, line in examples() if page != README]
    ran = [name for name, line in from_docs if not needs_a_cluster(line)]
    assert {"slurm.md", "job-library.md"} <= set(ran), from_docs
    assert len(ran) >= 5, from_docs
    # every exclusion names a line a page still has (none is left behind when a page changes)
    firsts = {line.splitlines()[0] for _, line in from_docs}
    assert set(NEEDS_A_CLUSTER) <= firsts, set(NEEDS_A_CLUSTER) - firsts


def headings(page: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub makes them (lower case, punctuation but - and _
    dropped, spaces to -, -1 for the second of a name)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    for heading in re.findall(r"^#{1,6} +(.*?) *$", text, flags=re.MULTILINE):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found


def test_every_local_link_of_the_readme_and_the_docs_leads_somewhere() -> None:
    broken = []
    for page in pages():
        text = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue  # a web address
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.name}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in headings(dest):
                broken.append(f"{page.name}: {target}: no such heading")
    assert not broken, broken


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """`gpupool up` with the README's lab configuration, its data in a fresh folder."""
    config = yaml.safe_load((REPO / "examples" / "lab.yaml").read_text())
    port = free_port()
    data = tmp_path / "data"
    config["service"].update(data_dir=str(data), port=port, interval="0.2s", run_as="service")
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(config))
    work = tmp_path / "work"
    shutil.copytree(REPO / "examples", work / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "80"
    process = subprocess.Popen(
        [sys.executable, "-m", "gpupool", "up", "--config", str(path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: (data / "admin.token").exists() and answers(port))
    env["GPUPOOL_API"] = f"http://127.0.0.1:{port}"
    env["GPUPOOL_TOKEN"] = (data / "admin.token").read_text().strip()
    yield work, env
    process.terminate()
    process.wait(timeout=10)
    kill_attempts(data)


def answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health").is_success
    except httpx.TransportError:
        return False


def shell(script: str, work: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_the_readmes_and_the_docs_submit_examples_work_as_written(lab: tuple[Path, dict[str, str]]) -> None:
    work, env = lab
    lines = [line for _, line in examples() if not needs_a_cluster(line)]
    done = shell("set -e\n" + "\n".join(lines) + "\n", work, env)
    assert done.returncode == 0, done.stdout + done.stderr
    headers = {"Authorization": f"Bearer {env['GPUPOOL_TOKEN']}"}
    api = env["GPUPOOL_API"]

    def jobs() -> list[dict[str, object]]:
        found: list[dict[str, object]] = httpx.get(f"{api}/jobs", headers=headers).json()
        return found

    wait_for(lambda: all(j["state"] in ("succeeded", "failed", "cancelled", "timeout") for j in jobs()), timeout=240)
    failed = [(j["id"], j["name"], j["state"]) for j in jobs() if j["state"] != "succeeded"]
    assert not failed, failed
    assert len(jobs()) >= 13 + 8  # the README's, 8 array tasks among them; the docs', 5 array tasks among them
    assert (work / "sweep-2_7.log").is_file()
    assert any(work.glob("line-fit-*.log"))
    assert len(list(work.glob("step-*_*.log"))) == 5  # docs/slurm.md's array, 0-20:5

    # What needs a cluster is refused for the pool's size alone: its options, its shape are right.
    for page, line in examples():
        if needs_a_cluster(line):
            refused = shell(line, work, env)
            assert refused.returncode == 2, (page.name, line, refused.stdout + refused.stderr)
            assert "can never fit" in refused.stderr, (page.name, line, refused.stderr)
            assert "the pool has 1" in refused.stderr, (page.name, line, refused.stderr)


def test_the_test_command_names_the_debian_packages_it_misses_when_it_cannot_install_them() -> None:
    """`make test` as a user who is not root, on a machine without Prometheus and Chromium: it
    stops before anything runs and names the one line that installs them."""
    top = Path(tempfile.mkdtemp(prefix="gpupool-packages-"))  # where `nobody` may pass
    try:
        top.chmod(0o755)
        for tool in ("bash", "ls", "id"):
            found = shutil.which(tool)
            assert found is not None
            (top / tool).symlink_to(found)
        script = top / "system-packages"
        shutil.copy(REPO / "tools" / "system-packages", script)
        done = subprocess.run(
            [str(top / "bash"), str(script)],
            env={"PATH": str(top)},
            user="nobody",
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        shutil.rmtree(top)
    assert done.returncode == 1, done.stderr
    assert "sudo apt-get install prometheus chromium chromium-driver" in done.stderr
    with_them = subprocess.run([str(REPO / "tools" / "system-packages")], capture_output=True, text=True, check=False)
    assert with_them.returncode == 0 and with_them.stderr == "", "this machine has them all: nothing to say"
