"""Sweep specs: every mistake is refused before anything runs, naming the field."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tuner.spec import FIELDS, REQUIRED, SpecError, SweepSpec, parse_duration
from tuner.spec.values import Promote, Resources

BASE: dict[str, Any] = {
    "name": "digits-mlp",
    "command": "python train.py",
    "metric": "val_accuracy",
    "space": {
        "lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
        "units": {"type": "int", "low": 32, "high": 512},
        "activation": {"type": "categorical", "choices": ["relu", "tanh"]},
    },
}


def spec(**changes: Any) -> dict[str, Any]:
    data = {**BASE, **changes}
    return {k: v for k, v in data.items() if v is not ...}


def test_full_spec_round_trips() -> None:
    s = SweepSpec.from_dict(
        spec(
            trials=40, parallelism=4, sampler="cmaes", direction="minimize",
            pruner={"type": "hyperband", "min_resource": 1, "max_resource": 20},
            resources={"cpu": 2, "memory": "4Gi", "gpu": 1, "gpu_type": "a100"},
            max_retries=2, trial_timeout="1h30m", promote={"model": "digits", "policy": "always"},
            priority="high", seed=7, env={"A": "1"},
        )
    )
    assert s.trial_timeout == 5400
    assert s.pruner.options == {"min_resource": 1, "max_resource": 20}
    assert s.resources.gpu_type == "a100"
    assert SweepSpec.from_dict(s.to_dict()) == s
    dists = s.distributions()
    assert dists["lr"].log and dists["units"].high == 512


def test_the_declaration_drives_fields_defaults_and_to_dict() -> None:
    """One declaration (SweepSpec's fields) is the field list, the required fields, the
    defaults a minimal spec gets and the keys of to_dict: adding a field cannot miss one."""
    declared = [f.name for f in dataclasses.fields(SweepSpec)]
    assert list(FIELDS) == declared
    assert REQUIRED == ("name", "command", "metric", "space")
    s = SweepSpec.from_dict(BASE)
    assert list(s.to_dict()) == declared
    for f in dataclasses.fields(SweepSpec):
        if f.name in REQUIRED:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert getattr(s, f.name) == default, f.name
    assert s.resources == Resources() and s.to_dict()["resources"] == {
        f.name: getattr(Resources(), f.name) for f in dataclasses.fields(Resources)}
    with pytest.raises(SpecError) as err:
        SweepSpec.from_dict(spec(colour="red"))
    assert err.value.message == f"unknown field; expected one of {', '.join(sorted(declared))}"
    with pytest.raises(SpecError, match="promote.x: unknown field; expected one of "
                                        "constraints, model, policy, stage"):
        SweepSpec.from_dict(spec(promote={"model": "m", "x": 1}))
    assert SweepSpec.from_dict(spec(promote={"model": "m"})).promote == Promote("m")


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"colour": "red"}, "colour", "unknown field"),
        ({"name": "Bad Name"}, "name", "lowercase"),
        ({"command": ...}, "command", "required"),
        ({"command": "EPOCHS=3 python train.py"}, "command", "put variables under 'env'"),
        ({"metric": ""}, "metric", "required"),
        ({"direction": "up"}, "direction", "maximize | minimize"),
        ({"trials": 0}, "trials", "at least 1"),
        ({"parallelism": 0}, "parallelism", "at least 1"),
        ({"parallelism": "4"}, "parallelism", "integer"),
        ({"sampler": "bayes"}, "sampler", "tpe | random | grid | cmaes | gp"),
        ({"pruner": "early"}, "pruner", "none | median | hyperband | asha"),
        ({"pruner": {"type": "median", "max_resource": 3}}, "pruner.max_resource", "unknown"),
        ({"space": {}}, "space", "required"),
        ({"space": {"lr": {"type": "float", "low": 0.1, "high": 0.01}}}, "space.lr.low",
         "below high"),
        ({"space": {"lr": {"type": "float", "low": 0.0, "high": 1.0, "log": True}}},
         "space.lr.low", "log scale needs low > 0"),
        ({"space": {"lr": {"type": "float", "low": 0.0, "high": 1.0, "lg": True}}},
         "space.lr.lg", "unknown field"),
        ({"space": {"u": {"type": "int", "low": 1.5, "high": 4}}}, "space.u.low", "integer"),
        ({"space": {"u": {"type": "int", "low": 1}}}, "space.u.high", "required"),
        ({"space": {"a": {"type": "categorical", "choices": []}}}, "space.a.choices",
         "non-empty"),
        ({"space": {"a": {"type": "enum", "choices": [1]}}}, "space.a.type", "float | int"),
        ({"sampler": "grid"}, "space.lr", "grid sampler needs discrete"),
        ({"resources": {"gpu": -1}}, "resources.gpu", "at least 0"),
        ({"resources": {"memory": "2 GB"}}, "resources.memory", "quantity"),
        ({"resources": {"gpu_type": "a100"}}, "resources.gpu_type", "gpu is 0"),
        ({"resources": {"gpus": 1}}, "resources.gpus", "unknown field"),
        ({"resources": {"workers": 0}}, "resources.workers", "at least 1"),
        ({"resources": {"workers": "2"}}, "resources.workers", "integer"),
        ({"resources": {"workers": True}}, "resources.workers", "integer"),
        ({"trial_timeout": "soon"}, "trial_timeout", "duration"),
        ({"max_retries": -1}, "max_retries", "at least 0"),
        ({"promote": {"model": "digits", "policy": "sometimes"}}, "promote.policy",
         "if-better | always | never"),
        ({"priority": "urgent"}, "priority", "low | normal | high"),
    ],
)
def test_invalid_specs_name_the_field(changes: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as info:
        SweepSpec.from_dict(spec(**changes))
    assert info.value.field == field
    assert words in str(info.value)
    assert str(info.value).startswith(f"{field}: ")


def test_grid_accepts_discrete_space_and_enumerates_it() -> None:
    s = SweepSpec.from_dict(
        spec(
            sampler="grid",
            space={
                "lr": {"type": "float", "low": 0.1, "high": 0.3, "step": 0.1},
                "units": {"type": "int", "low": 1, "high": 5, "step": 2},
                "act": {"type": "categorical", "choices": ["relu", "tanh"]},
            },
        )
    )
    grid = s.grid()
    assert grid["lr"] == pytest.approx([0.1, 0.2, 0.3])
    assert grid["units"] == [1, 3, 5]
    assert grid["act"] == ["relu", "tanh"]


def test_durations() -> None:
    assert parse_duration("30m") == 1800
    assert parse_duration("90s") == 90
    assert parse_duration(45) == 45
    assert parse_duration(None) is None
    with pytest.raises(SpecError):
        parse_duration("0s")


def test_yaml_file_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML at line"):
        SweepSpec.from_yaml(bad)
    with pytest.raises(SpecError, match="cannot read"):
        SweepSpec.from_yaml(tmp_path / "missing.yaml")
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="expected a mapping"):
        SweepSpec.from_yaml(listy)


def test_code_directory_defaults_to_the_spec_file_directory(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(BASE))
    assert SweepSpec.from_yaml(path).code == str(tmp_path)


@pytest.mark.parametrize(("extra", "field"), [
    ({"seed": 10**23}, "seed"),
    ({"seed": -5}, "seed"),
    ({"trials": 10**23}, "trials"),
    ({"parallelism": 10**6}, "parallelism"),
    ({"max_retries": 10**23}, "max_retries"),
    ({"trial_timeout": 1e300}, "trial_timeout"),
    ({"trial_timeout": 10**400}, "trial_timeout"),
    ({"resources": {"cpu": 1e300}}, "resources.cpu"),
    ({"resources": {"workers": 10**23}}, "resources.workers"),
    ({"pruner": {"type": "median", "n_startup_trials": 1e300}}, "pruner.n_startup_trials"),
    ({"space": {"x": {"type": "int", "low": 0, "high": 10**26}}}, "space.x.high"),
    ({"space": {"x": {"type": "float", "low": -1e308, "high": 1e308}}}, "space.x.low"),
    ({"space": {"x": {"type": "float", "low": 0, "high": 10**400}}}, "space.x.high"),
])
def test_out_of_range_numbers_are_refused_by_name(extra: dict, field: str) -> None:
    """Numbers beyond what the database, the samplers and timers hold are a 400, not a crash
    of the controller later (a seed of -5 was a 500, a float range of ±1e308 killed it)."""
    base = {"name": "s", "command": "python x.py", "metric": "m",
            "space": {"x": {"type": "float", "low": 0, "high": 1}}}
    with pytest.raises(SpecError) as err:
        SweepSpec.from_dict({**base, **extra})
    assert err.value.field == field
