"""No lab notes in --help or in the CLI's comments: no run counts, issue numbers, sessions or dates."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path
from typing import Any

import pytest

from pipelines.cli import COMMANDS, build_parser

CLI = Path(__file__).resolve().parents[2] / "pipelines" / "cli"
LAB_NOTE = re.compile(
    r"\b\d+ of \d+ runs?\b|\bissue \d+|\bthis (session|turn)\b|\bin the run before\b|\bonce lost\b", re.IGNORECASE
)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_holds_no_lab_notes(command: str) -> None:
    parser = build_parser([command])
    choices: Any = next(a for a in parser._actions if a.dest == "command").choices
    sub = choices[command]
    text = sub.format_help()
    assert not LAB_NOTE.findall(text), LAB_NOTE.findall(text)


def test_the_cli_comments_hold_no_lab_notes_or_dates() -> None:
    found = []
    for path in sorted(CLI.glob("*.py")):
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if token.type == tokenize.COMMENT and (LAB_NOTE.search(token.string) or DATE.search(token.string)):
                found.append(f"{path.name}:{token.start[0]}: {token.string}")
    assert not found, "\n".join(found)
