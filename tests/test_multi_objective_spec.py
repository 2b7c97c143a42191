"""Multi-objective specs and promotion budgets: what a spec may say, the error naming the
field when it is wrong, the study Optuna gets, and how a budget chooses (issue 27)."""

from __future__ import annotations

from typing import Any

import optuna
import pytest

from tuner.scheduling.budget import Candidate, choose, directions
from tuner.scheduling.objectives import BadReport, check_final_report, objective_values
from tuner.search.study import create_study, make_pruner
from tuner.spec import Objective, SpecError, SweepSpec

BASE: dict[str, Any] = {
    "name": "mo", "command": "python train.py",
    "space": {"units": {"type": "int", "low": 2, "high": 1024}},
}
METRICS = [{"name": "val_accuracy", "direction": "maximize"}, {"name": "latency_p95_ms"}]


def spec(**changes: Any) -> SweepSpec:
    return SweepSpec.from_dict({**BASE, **changes})


def test_metrics_make_the_first_the_primary_and_round_trip() -> None:
    s = spec(metrics=METRICS, promote={"model": "digits", "constraints": {"latency_p95_ms": 5,
                                                                          "size_mb": 20}})
    assert (s.metric, s.direction) == ("val_accuracy", "maximize")
    # The serving figures' short names are their full names, and costs are minimized.
    assert s.objectives == (Objective("val_accuracy", "maximize"),
                            Objective("serving_latency_p95_ms", "minimize"))
    assert s.multi_objective and s.serving_figures()
    assert s.promote is not None
    assert dict(s.promote.constraints) == {"serving_latency_p95_ms": 5.0, "model_size_mb": 20.0}
    assert SweepSpec.from_dict(s.to_dict()) == s
    # One metric as before: one objective, no serving figures measured.
    one = spec(metric="val_accuracy")
    assert one.objectives == (Objective("val_accuracy", "maximize"),)
    assert not one.multi_objective and not one.serving_figures()
    assert SweepSpec.from_dict(one.to_dict()) == one


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"metric": "a", "metrics": "a"}, "metrics", "expected a list"),
        ({"metrics": [{"name": "a", "direction": "up"}]}, "metrics[0].direction", "maximize"),
        ({"metrics": [{"name": "a"}, {"name": "a"}]}, "metrics[1].name", "named twice"),
        ({"metrics": [{"name": "a", "colour": 1}]}, "metrics[0].colour", "unknown field"),
        ({"metrics": [{"name": "latency_p95_ms"}, {"name": "a"}]}, "metrics[0].name",
         "first metric"),
        ({"metrics": [{"name": "a"}, {"name": "model_size_mb", "direction": "maximize"}]},
         "metrics[1].direction", "only be minimized"),
        ({"metrics": [{"name": "a"}, {"name": "b"}], "pruner": "median"}, "pruner",
         "not pruned"),
        ({"metrics": [{"name": "a"}, {"name": "b"}], "sampler": "cmaes"}, "sampler", "CMA-ES"),
        ({"metric": "b", "metrics": [{"name": "a"}]}, "metric", "first of metrics"),
        ({"metric": "a", "direction": "minimize", "metrics": [{"name": "a"}]}, "direction",
         "first metric's direction"),
        ({"metric": "serving_latency_p95_ms"}, "metric", "measured by tunehub"),
        ({"metric": "a", "promote": {"model": "m", "constraints": {"flops": 1}}},
         "promote.constraints.flops", "not a metric of this sweep"),
        ({"metric": "a", "promote": {"model": "m", "constraints": {"size_mb": "big"}}},
         "promote.constraints.size_mb", "finite number"),
        ({"metric": "a", "promote": {"model": "m", "constraints": [1]}},
         "promote.constraints", "mapping"),
        ({"metric": "a", "promote": {"model": "m", "stage": "staging"}},
         "promote.stage", "production | canary"),
    ],
)
def test_a_wrong_multi_objective_spec_names_its_field(changes: dict[str, Any], field: str,
                                                      words: str) -> None:
    with pytest.raises(SpecError) as err:
        spec(**changes)
    assert err.value.field == field and words in err.value.message, str(err.value)


def test_the_study_is_multi_objective_and_never_pruned(tmp_path: Any) -> None:
    s = spec(metrics=[*METRICS, {"name": "size_mb"}])
    url = f"sqlite:///{tmp_path / 'o.sqlite'}"
    study = create_study(s, "mo-study", url)
    assert study.directions == [optuna.study.StudyDirection.MAXIMIZE,
                                optuna.study.StudyDirection.MINIMIZE,
                                optuna.study.StudyDirection.MINIMIZE]
    assert isinstance(make_pruner(s), optuna.pruners.NopPruner)
    # The values it is told: what the trial reported, then what tunehub measured.
    figures = {"val_accuracy": 0.9, "serving_latency_p95_ms": 3.0, "model_size_mb": 0.5}
    assert objective_values(s, 0.9, figures) == [0.9, 3.0, 0.5]
    assert objective_values(s, 0.9, {"val_accuracy": 0.9}) is None  # not measured
    assert objective_values(spec(metric="val_accuracy"), 0.9, figures) is None
    trial = study.ask()
    study.tell(trial, objective_values(s, 0.9, figures))
    assert study.trials[0].values == [0.9, 3.0, 0.5]


def test_a_final_report_must_hold_every_reported_objective() -> None:
    s = spec(metrics=[{"name": "val_accuracy"}, {"name": "params_k", "direction": "minimize"},
                      {"name": "size_mb"}])
    assert check_final_report(s, {"val_accuracy": 0.8, "params_k": 3.0, "extra": 1.0}) == 0.8
    with pytest.raises(BadReport, match="must include 'params_k'"):
        check_final_report(s, {"val_accuracy": 0.8})
    with pytest.raises(BadReport, match="measured by tunehub"):
        check_final_report(s, {"val_accuracy": 0.8, "params_k": 1.0, "model_size_mb": 0.1})


def test_the_budget_picks_the_best_within_it_or_says_what_failed_by_how_much() -> None:
    s = spec(metric="acc", promote={"model": "m", "constraints": {"latency_p95_ms": 5,
                                                                  "size_mb": 20}})
    assert s.promote is not None
    ways = directions(s)
    wide = Candidate(0, 0.99, {"serving_latency_p95_ms": 9.0, "model_size_mb": 30.0})
    mid = Candidate(1, 0.95, {"serving_latency_p95_ms": 4.0, "model_size_mb": 2.0})
    narrow = Candidate(2, 0.80, {"serving_latency_p95_ms": 1.0, "model_size_mb": 0.1})
    unmeasured = Candidate(3, 0.999, {})
    chosen, why = choose([wide, mid, narrow, unmeasured], s.promote.constraints, ways, "maximize")
    assert chosen == mid
    assert why == ("best within the budget (serving_latency_p95_ms <= 5, model_size_mb <= 20); "
                   "2 of 4 models over it")
    slow = Candidate(4, 0.9, {"serving_latency_p95_ms": 6.5, "model_size_mb": 1.0})
    chosen, why = choose([wide, slow], s.promote.constraints, ways, "maximize")
    assert chosen is None
    assert why == (
        "no model meets the budget (serving_latency_p95_ms <= 5, model_size_mb <= 20): "
        "serving_latency_p95_ms: 2 of 2 over; nearest trial 4 serving_latency_p95_ms 6.5 > 5 "
        "(by 1.5); model_size_mb: 1 of 2 over; nearest trial 0 model_size_mb 30 > 20 (by 10)")
    # A bound on a metric to maximize is a floor.
    floor = spec(metric="acc", promote={"model": "m", "constraints": {"acc": 0.97}})
    assert floor.promote is not None
    chosen, why = choose([Candidate(1, 0.95, {"acc": 0.95}), Candidate(2, 0.8, {"acc": 0.8})],
                         floor.promote.constraints, directions(floor),
                         "maximize")
    assert chosen is None and "nearest trial 1 acc 0.95 < 0.97 (by 0.02)" in why


def test_the_pareto_chart_has_the_front_the_budget_and_the_chosen_model() -> None:
    from tuner.sdk.pareto import pareto_data, pareto_figure

    s = spec(metrics=METRICS, promote={"model": "m", "constraints": {"latency_p95_ms": 5}})

    def trial(n: int, acc: float, p95: float, state: str = "completed") -> dict[str, Any]:
        return {"number": n, "state": state, "value": acc, "has_model": True,
                "metrics": {"val_accuracy": acc, "serving_latency_p95_ms": p95}}

    trials = [trial(0, 0.99, 9.0), trial(1, 0.95, 4.0), trial(2, 0.80, 1.0),
              trial(3, 0.90, 4.5), trial(4, 0.5, 0.1, "failed")]
    data = pareto_data(s, trials)
    assert data is not None
    assert (data.x, data.y, data.bound, data.chosen) == ("serving_latency_p95_ms",
                                                         "val_accuracy", 5.0, 1)
    # Trial 3 is dominated by trial 1 (faster and more accurate); the failed one is not drawn.
    assert [p[0] for p in data.front] == [2, 1, 0]
    assert sorted(p[0] for p in data.points) == [0, 1, 2, 3]
    fig = pareto_figure(data)
    names = [t.name for t in fig.data]
    assert names == ["trials", "Pareto front", "chosen: trial 1"]
    assert list(fig.data[2].x) == [4.0] and list(fig.data[2].y) == [0.95]
    assert [shape.x0 for shape in fig.layout.shapes] == [5.0]  # the budget line
    # One metric and no budget: no chart.
    assert pareto_data(spec(metric="val_accuracy"), trials) is None


def test_the_code_digest_follows_content_and_never_a_link(tmp_path: Any) -> None:
    from tuner.serving.intake import ModelRefused
    from tuner.serving.lineage import tree_digest

    trusted = tmp_path / "sweeps"
    code = trusted / "1" / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "train.py").write_text("print(1)\n")
    (code / "pkg" / "util.py").write_text("X = 1\n")
    first = tree_digest(code, trusted)
    assert first.startswith("sha256:") and first == tree_digest(code, trusted)
    (code / "pkg" / "util.py").write_text("X = 2\n")
    changed = tree_digest(code, trusted)
    assert changed != first
    # A link to a secret is named, not followed: the secret's bytes do not change the digest.
    secret = tmp_path / "secret"
    secret.write_text("one")
    (code / "leak").symlink_to(secret)
    with_link = tree_digest(code, trusted)
    secret.write_text("two")
    assert tree_digest(code, trusted) == with_link != changed
    # The snapshot's own directory swapped for a link is refused, not walked.
    (trusted / "2").mkdir()
    (trusted / "2" / "code").symlink_to(code)
    with pytest.raises(ModelRefused, match="not a directory"):
        tree_digest(trusted / "2" / "code", trusted)
    with pytest.raises(ModelRefused, match="not inside"):
        tree_digest(tmp_path, trusted)
