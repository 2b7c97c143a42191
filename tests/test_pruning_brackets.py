"""``max_resource: auto``: tunehub's minimum-trials rule counts Hyperband's brackets the way
Optuna's ``HyperbandPruner`` derives them, once the first trial has completed."""

from __future__ import annotations

import optuna

from tuner.search.pruning import EnoughTrialsPruner, default_min_trials, hyperband_brackets
from tuner.search.study import make_pruner
from tuner.spec import SweepSpec


def _optuna_brackets(last_step: int, **options: int) -> int:
    """Optuna's own count, after one completed trial reported up to ``last_step``."""
    pruner = optuna.pruners.HyperbandPruner(max_resource="auto", **options)
    study = optuna.create_study(pruner=pruner)
    done = study.ask()
    for step in range(1, last_step + 1):
        done.report(0.5, step)
    study.tell(done, 0.5)
    probe = study.ask()
    probe.report(0.1, 1)
    probe.should_prune()  # Optuna fixes its brackets here
    return int(pruner._n_brackets)  # type: ignore[attr-defined]  # what we must agree with


def test_bracket_count_matches_optuna() -> None:
    for last_step, options in [(27, {}), (26, {}), (8, {}), (80, {}), (242, {}),
                               (30, {"min_resource": 2}), (50, {"reduction_factor": 2})]:
        eta = options.get("reduction_factor", 3)
        ours = hyperband_brackets(options.get("min_resource", 1), last_step + 1, eta)
        assert ours == _optuna_brackets(last_step, **options), (last_step, options)
    assert hyperband_brackets(1, 28, 3) == 4  # 27 epochs: 4 brackets, not the 3 once assumed


def test_auto_max_resource_min_trials_follows_the_first_completed_trial() -> None:
    base = {"name": "t", "command": "python train.py", "metric": "acc", "direction": "maximize",
            "trials": 40, "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}}}
    pruner = make_pruner(SweepSpec.from_dict({**base, "pruner": "hyperband"}))
    assert isinstance(pruner, EnoughTrialsPruner)
    study = optuna.create_study(direction="maximize", pruner=pruner)
    done = study.ask()
    for step in range(1, 28):  # 27 epochs
        done.report(0.9, step)
    study.tell(done, 0.9)
    probe = study.ask()
    probe.report(0.1, 1)
    assert not probe.should_prune()  # one trial at step 1 is not enough
    assert pruner.min_trials == 3 * 4 == default_min_trials("hyperband", {}, 28)
    # An explicit max_resource is counted at once, an explicit min_trials is kept.
    assert default_min_trials("hyperband", {"max_resource": 27}) == 3 * 4
    assert default_min_trials("hyperband", {"max_resource": 243}) == 3 * 5
    fixed = make_pruner(SweepSpec.from_dict({**base, "pruner": {"type": "hyperband",
                                                                 "min_trials": 5}}))
    assert isinstance(fixed, EnoughTrialsPruner) and fixed.min_trials == 5
