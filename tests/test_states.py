"""The lifecycle's vocabulary and rules (tuner/lifecycle/states.py): no state spelled outside it,
every transition in its table allowed and every other refused, and the ledger refusing before it
writes."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from tuner.lifecycle.states import (
    SWEEP_TRANSITIONS,
    TRIAL_TRANSITIONS,
    EventKind,
    IllegalTransition,
    SweepState,
    TrialState,
    check_sweep,
    check_trial,
)

ROOT = Path(__file__).resolve().parent.parent
WORDS = {str(s) for s in (*SweepState, *TrialState, *EventKind)}
#: The one module that spells states; migrations are frozen history (they must not change
#: when the code does).
EXEMPT = {Path("tuner/lifecycle/states.py")}
EXEMPT_DIRS = (Path("tuner/db/migrations"),)
#: Strings that are equal to a state but mean something else, each with what it is.
NOT_STATES = {
    (Path("tuner/backends/kubernetes/status.py"), "waiting"): "a Kubernetes container state key",
}


def state_literals(source: str) -> list[tuple[int, str]]:
    """(line, word) of each string constant in ``source`` equal to a state or event kind,
    docstrings left out."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and node.value in WORDS and id(node) not in docstrings
    ]


def test_the_scan_finds_a_state_literal() -> None:
    source = 'def f(row):\n    """failed"""\n    return row.state == "failed" or {"pending": 1}\n'
    assert state_literals(source) == [(3, "failed"), (3, "pending")]


def test_no_state_literal_outside_the_states_module() -> None:
    found = []
    for path in sorted([*ROOT.glob("tuner/**/*.py"), *ROOT.glob("hub/**/*.py")]):
        rel = path.relative_to(ROOT)
        if rel in EXEMPT or any(d in rel.parents for d in EXEMPT_DIRS):
            continue
        for line, word in state_literals(path.read_text()):
            if (rel, word) not in NOT_STATES:
                found.append(f"{rel}:{line}: {word!r}")
    assert not found, "use tuner.lifecycle.states instead of spelling a state:\n" + "\n".join(found)


def test_states_keep_their_strings() -> None:
    """The database, the API and the JSON hold these strings: renaming one is a migration."""
    assert [str(s) for s in SweepState] == [
        "queued", "running", "cancelling", "completed", "failed", "cancelled"]
    assert [str(s) for s in TrialState] == [
        "pending", "running", "completed", "pruned", "failed", "cancelled"]
    assert SweepState.finished() == (
        SweepState.COMPLETED, SweepState.FAILED, SweepState.CANCELLED)
    assert TrialState.unfinished() == (TrialState.PENDING, TrialState.RUNNING)


@pytest.mark.parametrize(("states", "table", "check"), [
    (SweepState, SWEEP_TRANSITIONS, check_sweep),
    (TrialState, TRIAL_TRANSITIONS, check_trial),
], ids=["sweep", "trial"])
def test_every_pair_is_allowed_by_the_table_or_refused_naming_both(
    states: type[SweepState] | type[TrialState], table: dict, check: object,
) -> None:
    assert callable(check)
    for old, new in itertools.product(states, states):
        if (old, new) in table:
            assert check(str(old), new) == new  # as the database hands it: a string
        else:
            with pytest.raises(IllegalTransition) as err:
                check(str(old), new)
            assert f"{old} -> {new}" in str(err.value)


@pytest.mark.parametrize("table", [SWEEP_TRANSITIONS, TRIAL_TRANSITIONS], ids=["sweep", "trial"])
def test_nothing_leaves_a_finished_state(table: dict) -> None:
    assert all(not old.is_finished() for old, _ in table)
    assert all(why for why in table.values())  # every change says why it happens
