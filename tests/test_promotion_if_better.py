""""if-better" under a budget (issue 27, README "Promotion under a serving budget"): the new
model is compared with production under the same constraints, so a production version over the
budget, or never measured against it, does not block a new model within it, however much
better its metric; a production version within the budget still does. The registry is the real
one (SQLite, SavedModel directories copied in); the sweep's end calls the same ``_apply``."""

from __future__ import annotations

from pathlib import Path

from tests.sweeps_helpers import MINIMAL_SAVED_MODEL
from tuner.db import Database, ModelVersion
from tuner.scheduling.budget import directions
from tuner.scheduling.promotion import _apply
from tuner.serving.registry import Registry
from tuner.spec import SweepSpec

SPEC = SweepSpec.from_dict({
    "name": "budget", "command": "python train.py",
    "space": {"units": {"type": "int", "low": 2, "high": 1024}},
    "metrics": [{"name": "val_accuracy", "direction": "maximize"}, {"name": "model_size_mb"}],
    "promote": {"model": "digits", "policy": "if-better", "constraints": {"size_mb": 20}},
})


def test_if_better_lets_a_model_within_budget_past_production_over_it(tmp_path: Path) -> None:
    registry = Registry(Database(f"sqlite:///{tmp_path / 'tunehub.sqlite'}"), tmp_path / "reg")
    source = tmp_path / "src"
    source.mkdir()
    (source / "saved_model.pb").write_bytes(MINIMAL_SAVED_MODEL)
    promote = SPEC.promote
    assert promote is not None
    ways = directions(SPEC)

    def version(accuracy: float, size_mb: float | None, sweep_id: int) -> ModelVersion:
        metrics = None if size_mb is None else {"val_accuracy": accuracy,
                                                 "model_size_mb": size_mb}
        return registry.register(model="digits", source_dir=source, owner="ana",
                                 metric="val_accuracy", direction="maximize",
                                 metric_value=accuracy, sweep_id=sweep_id, metrics=metrics,
                                 trusted=tmp_path)

    def stages() -> dict[int, str | None]:
        return {v.version: v.stage for v in registry.versions("digits")}

    # Production is more accurate but over the budget: the new one within it is promoted.
    wide = version(0.99, 30.0, sweep_id=1)
    registry.promote("digits", wide.version, "production", is_admin=True)
    narrow = version(0.90, 5.0, sweep_id=2)
    assert _apply(registry, narrow, promote, ways) == (
        True, "production v1 is over the budget: model_size_mb 30 > 20 (by 10)")
    assert stages() == {1: "archived", 2: "production"}
    [row] = [v for v in registry.versions("digits") if v.version == 2]
    assert row.history[-1]["reason"] == ("sweep 2, policy if-better: production v1 is over the "
                                         "budget: model_size_mb 30 > 20 (by 10)")

    # Production within the budget and better: "if better" still says no.
    worse = version(0.85, 4.0, sweep_id=3)
    promoted, why = _apply(registry, worse, promote, ways)
    assert not promoted and why == "val_accuracy=0.85 does not beat production v2 (0.9)"
    assert stages()[2] == "production" and stages()[3] is None

    # Production never measured (a version registered before the budget, by hand): the budget
    # is only met by a measurement, so it does not block a measured model within it.
    unmeasured = version(0.99, None, sweep_id=4)
    registry.promote("digits", unmeasured.version, "production", is_admin=True)
    fits = version(0.80, 2.0, sweep_id=5)
    assert _apply(registry, fits, promote, ways) == (
        True, "production v4 is over the budget: model_size_mb not measured")
    assert stages()[4] == "archived" and stages()[5] == "production"
