"""Upgrade canary: the Optuna behaviour tunehub relies on below Optuna's user-facing API
(:mod:`tuner.search.optuna_adapter` lists it). Each test names what changed; when one fails after an
Optuna upgrade, re-check the seam it names before widening the range in ``pyproject.toml``."""

from __future__ import annotations

import ast
import inspect
import re
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.storages import InMemoryStorage, RDBStorage
from optuna.trial import TrialState
from packaging.requirements import Requirement
from packaging.version import Version

from tuner.search.optuna_adapter import GridSampler, create_trial_once, trial_for

REPO = Path(__file__).resolve().parent.parent
GRID = {"x": [0.1, 0.2, 0.3]}
X = {"x": CategoricalDistribution([0.1, 0.2, 0.3])}


def _declared() -> str:
    """The first ``"optuna..."`` requirement of ``pyproject.toml``: the project's dependency."""
    found = re.search(r'"(optuna[^"]*)"', (REPO / "pyproject.toml").read_text())
    assert found, "pyproject.toml declares no Optuna dependency"
    return found.group(1)


def test_installed_optuna_is_in_the_declared_range() -> None:
    declared = _declared()
    versions = Requirement(declared).specifier
    assert any(s.operator in ("<", "<=", "~=", "==") for s in versions), (
        f"{declared}: pyproject.toml must bound the Optuna versions we test from above"
    )
    assert Version(optuna.__version__) in versions, (
        f"Optuna {optuna.__version__} is outside {declared}: run tests/test_optuna_adapter.py, "
        "tests/test_mirror.py and the engine tests on it, then widen the range"
    )
    readme = (REPO / "README.md").read_text()
    assert f"`{declared}`" in readme, "the README states the tested Optuna range"


def test_tpe_arguments_we_pass_are_stable() -> None:
    """Every TPE sweep passes ``multivariate`` and ``constant_liar`` (``tuner.search.study``);
    before Optuna 5.0 both were experimental and warned on every sweep."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", optuna.exceptions.ExperimentalWarning)
        optuna.samplers.TPESampler(seed=0, multivariate=True, constant_liar=True)


def test_grid_sampler_override_only_drops_the_stop() -> None:
    # Why the override exists: Optuna's own after_trial stops the study once the grid is used
    # up, which outside ``optimize`` raises.
    base = optuna.samplers.GridSampler.after_trial
    assert list(inspect.signature(base).parameters) == [
        "self", "study", "trial", "state", "values"
    ], "GridSampler.after_trial changed its signature"
    plain = optuna.create_study(sampler=optuna.samplers.GridSampler(GRID, seed=0))
    for _ in range(2):
        plain.tell(plain.ask(X), 1.0)
    with pytest.raises(RuntimeError, match="stop"):
        plain.tell(plain.ask(X), 1.0)

    # Ours: every grid point exactly once through ask/tell, no stop, study still usable.
    ours = optuna.create_study(sampler=GridSampler(GRID, seed=0))
    seen = []
    for _ in range(3):
        trial = ours.ask(X)
        seen.append(trial.params["x"])
        ours.tell(trial, 1.0)
    assert sorted(seen) == GRID["x"]
    assert ours.ask(X).params["x"] in GRID["x"]  # past the grid: a repeat, not an error


def test_trial_for_is_a_handle_on_an_existing_trial() -> None:
    assert list(inspect.signature(optuna.trial.Trial.__init__).parameters) == [
        "self", "study", "trial_id"
    ], "optuna.trial.Trial's constructor changed"
    storage = InMemoryStorage()
    grid = {**GRID, "y": [0.0, 0.5]}
    study = optuna.create_study(storage=storage, sampler=GridSampler(grid, seed=0))
    asked = study.ask(X)  # as if the controller died before suggesting y
    trial_id = storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(study.study_name), asked.number
    )
    before = storage.get_trial(trial_id).system_attrs

    handle = trial_for(study, trial_id)
    assert handle.number == asked.number
    assert storage.get_trial(trial_id).system_attrs == before, "the grid point was reassigned"
    handle.report(0.5, 1)
    assert storage.get_trial(trial_id).intermediate_values == {1: 0.5}
    assert handle.should_prune() is False
    # A parameter the trial lacks is suggested and stored, one it has is returned as is.
    assert handle.suggest_categorical("x", [0.1, 0.2, 0.3]) == asked.params["x"]
    y = handle.suggest_categorical("y", [0.0, 0.5])
    assert y in grid["y"]
    assert storage.get_trial(trial_id).params == {"x": asked.params["x"], "y": y}
    study.tell(asked, 1.0)
    assert storage.get_trial(trial_id).state == TrialState.COMPLETE


def test_storage_calls_of_the_mirror(tmp_path: Path) -> None:
    """What :mod:`tuner.search.mirror` does with the storage interface: copy a trial asked in memory
    into the database study in one insert (``RDBStorage._get_prepared_new_trial`` in a transaction
of ours, through :func:`create_trial_once`), find ids by number, add a parameter."""
    db = RDBStorage(f"sqlite:///{tmp_path / 'optuna.sqlite'}")
    optuna.create_study(study_name="db", storage=db)
    db_study = db.get_study_id_from_name("db")
    memory = InMemoryStorage()
    study = optuna.create_study(storage=memory, sampler=GridSampler(GRID, seed=0))
    asked = study.ask(X)
    asked.set_user_attr("attempt", 1)
    frozen = memory.get_trial(
        memory.get_trial_id_from_study_id_trial_number(
            memory.get_study_id_from_name(study.study_name), asked.number
        )
    )

    copied_id = create_trial_once(db, db_study, frozen)
    assert create_trial_once(db, db_study, frozen) == copied_id  # a retry adds nothing
    copied = db.get_trial(copied_id)
    assert copied.number == frozen.number == 0
    assert copied.state == TrialState.RUNNING
    assert copied.params == frozen.params and copied.distributions == frozen.distributions
    assert copied.user_attrs == {"attempt": 1}
    assert copied.system_attrs == frozen.system_attrs  # the grid point travels with it
    assert db.get_trial_id_from_study_id_trial_number(db_study, 0) == copied_id

    lr = FloatDistribution(1e-4, 1e-1, log=True)
    db.set_trial_param(copied_id, "lr", lr.to_internal_repr(0.01), lr)
    assert db.get_trial(copied_id).params["lr"] == pytest.approx(0.01)
    everything = db.get_all_trials(db_study, deepcopy=False)
    assert [t.number for t in everything] == [0]


ADAPTER = Path("tuner/search/optuna_adapter.py")


def optuna_private_uses(source: str) -> list[str]:
    """What a module uses of Optuna below its user-facing API: a private module or name
    imported (``optuna.samplers._tpe``, ``from optuna.x import _y``), a private member read on
    anything but ``self``/``cls``/``super()`` in a module that imports Optuna (``trial._trial_id``),
    and a subclass of a concrete Optuna class (overriding its behaviour, like our grid sampler's
    ``after_trial``; its abstract ``Base*`` interfaces are public and fine)."""
    tree = ast.parse(source)
    found: list[str] = []
    optuna_names: set[str] = set()  # names bound to Optuna modules or classes here

    def private(dotted: str) -> bool:
        return any(p.startswith("_") and not p.startswith("__") for p in dotted.split("."))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "optuna":
                    optuna_names.add((alias.asname or alias.name).split(".")[0])
                    if private(alias.name):
                        found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "optuna":
            for alias in node.names:
                optuna_names.add(alias.asname or alias.name)
                if private(f"{node.module}.{alias.name}"):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
    if not optuna_names:
        return found

    def root(expr: ast.expr) -> str | None:
        while isinstance(expr, ast.Attribute):
            expr = expr.value
        return expr.id if isinstance(expr, ast.Name) else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            owner = node.value
            is_super = (isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name)
                        and owner.func.id == "super")
            if not (is_super or (isinstance(owner, ast.Name) and owner.id in ("self", "cls"))):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if root(base) in optuna_names and not name.startswith("Base"):
                    found.append(f"{node.lineno}: class {node.name}({ast.unparse(base)})")
    return sorted(found, key=lambda use: int(use.split(":")[0]))


def test_the_scan_finds_each_kind_of_private_use() -> None:
    source = """
import optuna
from optuna.samplers._tpe.sampler import _split_trials
from optuna.samplers import BaseSampler, GridSampler
class Ours(BaseSampler): ...
class Grid(GridSampler): ...
class Tpe(optuna.samplers.TPESampler):
    def after_trial(self, study):
        self._private = super()._hook(study._storage)
def f(trial):
    return trial._trial_id
"""
    assert optuna_private_uses(source) == [
        "3: from optuna.samplers._tpe.sampler import _split_trials",
        "6: class Grid(GridSampler)",
        "7: class Tpe(optuna.samplers.TPESampler)",
        "9: study._storage",
        "11: trial._trial_id",
    ]
    assert optuna_private_uses("def f(x):\n    return x._y\n") == []  # no Optuna here


def test_only_the_adapter_uses_optuna_below_its_api() -> None:
    """Everything that leans on Optuna's internals stays in :mod:`tuner.search.optuna_adapter`,
    where the tests above pin it; anywhere else an Optuna upgrade would break it silently."""
    found = []
    for path in sorted([*REPO.glob("tuner/**/*.py"), *REPO.glob("hub/**/*.py")]):
        rel = path.relative_to(REPO)
        if rel != ADAPTER:
            found += [f"{rel}:{use}" for use in optuna_private_uses(path.read_text())]
    assert not found, "move these into tuner/search/optuna_adapter.py:\n" + "\n".join(found)
    assert optuna_private_uses((REPO / ADAPTER).read_text()), "the scan sees the adapter's seam"
