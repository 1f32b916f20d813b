"""docs/admin.md as an admin follows it: each `gpupool` command it shows exists with the options
it gives, each YAML file it shows is a valid configuration, and its backup copies a live store."""

from __future__ import annotations

import re
import shlex
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from gpupool.cli import app, named_values
from gpupool.config import parse_spec
from tests.support.live import Service, running, state, wait_for

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "admin.md"
TEXT = GUIDE.read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", TEXT, flags=re.DOTALL)


def commands() -> list[list[str]]:
    """The guide's `gpupool` command lines, words as a shell splits them (sudo dropped)."""
    found = []
    for block in blocks("bash"):
        for line in block.splitlines():
            words = shlex.split(line.split("  #", 1)[0].replace("$(date +%F)", "DATE"))
            words = words[1:] if words[:1] == ["sudo"] else words
            if words[:1] == ["gpupool"]:
                found.append(words[1:])
    return found


def test_the_guide_shows_commands_and_files() -> None:
    assert len(commands()) >= 10 and len(blocks("yaml")) >= 3


@pytest.mark.parametrize("words", commands(), ids=" ".join)
def test_each_command_of_the_guide_exists_with_the_options_it_gives(words: list[str]) -> None:
    command: Any = named_values(typer.main.get_command(app))
    rest = list(words)
    while rest and rest[0] in getattr(command, "commands", {}):
        command = command.commands[rest.pop(0)]
    assert not getattr(command, "commands", None), f"gpupool {' '.join(words)}: no such command"
    options = {name for param in command.params for name in (*param.opts, *param.secondary_opts)}
    for word in rest:
        if word.startswith("-"):
            assert word.split("=")[0] in options, f"gpupool {' '.join(words)}: no option {word}"


@pytest.mark.parametrize("text", blocks("yaml"), ids=lambda t: t.split("\n")[0])
def test_each_file_of_the_guide_is_a_valid_configuration(text: str) -> None:
    parse_spec(yaml.safe_load(text), "docs/admin.md")


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(Service(tmp_path))


def test_the_backup_copies_the_live_store_for_root_alone(service: Service, tmp_path: Path) -> None:
    job = service.submit("--", "true")
    wait_for(lambda: state(service, job) == "succeeded")
    copy = tmp_path / "backups" / "gpupool.db"
    done = service.cli("backup", str(copy))
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    with sqlite3.connect(copy) as db:
        assert db.execute("SELECT state FROM jobs WHERE id = ?", (job,)).fetchone() == ("succeeded",)
    again = service.cli("backup", str(copy))
    assert again.returncode == 2 and "exists already" in again.stderr
