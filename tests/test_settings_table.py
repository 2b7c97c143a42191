"""The README's settings table is the one table of settings (``tunehub_base/options.py``), and
the hub's options read the variables that table names for them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hub.options import TunehubHub
from tunehub_base.options import BY_OPTION, PROVIDED, SETTINGS, markdown_table, provided_table

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_table_is_the_settings_table() -> None:
    text = README.read_text()
    assert markdown_table() in text, "regenerate with tunehub_base.options.markdown_table()"


def test_every_hub_option_is_in_the_table_and_only_those() -> None:
    traits = set(TunehubHub.class_own_traits(config=True))
    assert traits == set(BY_OPTION)
    assert len({s.env for s in SETTINGS}) == len(SETTINGS)


@pytest.mark.parametrize("option", sorted(BY_OPTION))
def test_each_hub_option_reads_its_variable(option: str, monkeypatch: pytest.MonkeyPatch) -> None:
    setting = BY_OPTION[option]
    value = {"mode": "kubernetes", "tuner_command": "run tuner"}.get(option, "4321")
    monkeypatch.setenv(setting.env, value)
    got = getattr(TunehubHub(), option)
    assert got == (value.split() if option == "tuner_command" else
                   int(value) if isinstance(got, int) else value)
    assert setting.env in TunehubHub.class_traits()[option].help


def _variables_read_in(package: str) -> set[str]:
    """Every ``TUNEHUB_*`` name written as a string in a package's code."""
    root = README.parent / package
    return {m for path in root.rglob("*.py")
            for m in re.findall(r"[\"'](TUNEHUB_[A-Z0-9_]+)[\"']", path.read_text())}


def test_every_variable_the_code_reads_is_in_one_of_the_two_tables() -> None:
    """A variable read anywhere is either a setting (the operator's; the settings table) or
    part of what tunehub sets for notebooks and trials (the SDK's contract): never a third,
    undocumented way to configure tunehub."""
    known = {s.env for s in SETTINGS} | {env for env, _ in PROVIDED}
    prefixes = tuple(s.env.rstrip("*") for s in SETTINGS if s.env.endswith("*"))
    read = set().union(*(_variables_read_in(p) for p in ("tuner", "hub", "tunehub_base")))
    assert sorted(v for v in read if v not in known and not v.startswith(prefixes)) == []
    assert provided_table() in README.read_text(), (
        "regenerate with tunehub_base.options.provided_table()")
