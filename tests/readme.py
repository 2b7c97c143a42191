"""The README's own words, for the tests that run them as written.

Why parse instead of copying: a test that holds its own copy of the quick start passes while the
README drifts. These read the text each run, so a changed README is the text tested.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def _quick_start() -> str:
    text = README.read_text()
    start = text.index("## Quick start")
    return text[start:text.index("\n## ", start + 1)]


def _blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def quick_start_commands() -> list[str]:
    """The shell commands of the quick start's first block, comments dropped."""
    lines = _blocks(_quick_start(), "bash")[0].splitlines()
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def notebook_cell() -> str:
    """The Python cell the quick start tells people to run in a notebook."""
    return _blocks(_quick_start(), "python")[0]


def entry_point(command: str) -> str:
    """The text of the quick start's "Other entry points" row for ``command``."""
    for row in _quick_start().splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) == 2 and cells[0] == f"`{command}`":
            return cells[1]
    raise AssertionError(f"the README's quick start has no entry-point row for {command!r}")


def commands_in(text: str) -> list[str]:
    """The code spans of ``text`` (a table cell), as written."""
    return re.findall(r"`([^`]+)`", text)
