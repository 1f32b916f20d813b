"""Every command's `--help` as a person reads it: at 80 columns, through a pipe, with its words
intact (no markup eaten), its paragraphs filled (no line ending mid-sentence where the next word
would have fit) and its values named (`--team TEAM`, never `<str>` nor `<bool>`)."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from typing import Any

import pytest
import typer.main

from gpupool.cli import app, named_values

WIDTH = 80


def commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found += commands(sub, (*path, name))
    return found


EVERY = commands(named_values(typer.main.get_command(app)))


def test_every_command_is_listed() -> None:
    names = {" ".join(path) for path, _ in EVERY}
    assert {"submit", "queue", "show", "cancel", "logs", "demo", "team set", "user add"} <= names


@pytest.mark.parametrize(("path", "command"), EVERY, ids=[" ".join(p) or "gpupool" for p, _ in EVERY])
def test_help_at_80_columns_keeps_its_words_fills_its_lines_and_names_its_values(
    path: tuple[str, ...], command: Any
) -> None:
    env = dict(os.environ, COLUMNS=str(WIDTH), TERM="dumb")
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", *path, "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert all(len(line) <= WIDTH for line in text.splitlines()), text
    assert not re.search(r"<(bool|str|int|float|path|list\[[^>]*\])>", text), text
    usage = text.splitlines()[0]
    assert "{" not in usage and "[[" not in usage, usage
    flat = " ".join(text.split())
    for paragraph in (command.help or "").split("\n\n"):
        words = " ".join(paragraph.replace("\b", "").split())
        assert words in flat, f"lost or changed: {words!r}"
    description = text.split("\nArguments:")[0].split("\nOptions:")[0].split("\nCommands:")[0]
    lines = description.splitlines()[1:]
    for line, following in itertools.pairwise(lines):
        if line.strip() and following.strip() and not following.startswith("    "):
            room = WIDTH - 2 - len(line) - 1  # click fills to two columns short of the width
            assert len(following.split()[0]) > room, f"a line ends early, as if wrapped by hand: {line!r}"
