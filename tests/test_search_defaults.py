"""The sampler and pruner a sweep gets when its spec names none are the ones the README's
"Search defaults" section shows (its YAML block is read here), and Optuna gets them as said."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import yaml

from tuner.search.pruning import EnoughTrialsPruner
from tuner.search.study import make_pruner, make_sampler, tpe_startup_trials
from tuner.spec import SweepSpec

README = Path(__file__).resolve().parent.parent / "README.md"
BASE = {"name": "d", "command": "python t.py", "metric": "acc",
        "space": {"lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True}}}


def readme_defaults() -> dict[str, object]:
    text = README.read_text()
    section = text.split("## Search defaults", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, "README's Search defaults section has no yaml block"
    data = yaml.safe_load(block.group(1))
    assert isinstance(data, dict)
    return data


def test_a_spec_without_sampler_or_pruner_gets_the_readme_defaults() -> None:
    said = readme_defaults()
    spec = SweepSpec.from_dict(BASE)
    assert spec.sampler == said["sampler"]
    pruner = said["pruner"]
    assert isinstance(pruner, dict)
    assert spec.pruner.type == pruner["type"]
    assert dict(spec.pruner.options) == {k: v for k, v in pruner.items() if k != "type"}
    # The stored form says it explicitly, so a sweep resumes with the pruner it started with
    # even if the default changes later.
    assert SweepSpec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict()["pruner"] == pruner


def test_naming_none_still_turns_pruning_off() -> None:
    spec = SweepSpec.from_dict({**BASE, "pruner": "none"})
    assert isinstance(make_pruner(spec), optuna.pruners.NopPruner)


def test_optuna_gets_the_default_objects() -> None:
    said = readme_defaults()
    pruner = said["pruner"]
    assert isinstance(pruner, dict)
    spec = SweepSpec.from_dict({**BASE, "trials": 40, "parallelism": 2, "seed": 3})
    built = make_pruner(spec)
    assert isinstance(built, EnoughTrialsPruner)
    inner = {"hyperband": optuna.pruners.HyperbandPruner,
             "asha": optuna.pruners.SuccessiveHalvingPruner,
             "median": optuna.pruners.MedianPruner}[str(pruner["type"])]
    assert isinstance(built.inner, inner)
    # TPE's random startup is as long as the README says for a 40-trial sweep: that many
    # first trials are random search's (same seed), the next one is TPE's own.
    startup = tpe_startup_trials(40)
    assert startup == said["tpe_startup_trials_at_40"]
    assert tpe_startup_trials(4) == 5 and tpe_startup_trials(1000) == 10
    tpe = optuna.create_study(sampler=make_sampler(spec))
    rnd = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for study in (tpe, rnd):
        study.optimize(lambda t: (t.suggest_float("x", -1, 1) - 0.3) ** 2, n_trials=startup + 1)
    xs = [[t.params["x"] for t in s.trials] for s in (tpe, rnd)]
    assert xs[0][:startup] == xs[1][:startup]
    assert xs[0][startup] != xs[1][startup]
