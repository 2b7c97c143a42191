"""Promotion under a serving budget (issue 27): a digits sweep where width buys accuracy and
costs latency. tunehub measures every saved model on the ``model serve`` path (not
the trial), the study is multi-objective in Optuna, the most accurate model is over the budget
and is not promoted, the best one within it is; a budget nothing meets promotes nothing and
says which constraint failed and by how much."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest

from tests.conftest import Home
from tests.sweeps_helpers import parse_json, write_sweep
from tuner.serving.lineage import tree_digest

pytestmark = pytest.mark.slow

TRAIN_TEMPLATE = """
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
import tuner

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
units = int(tuner.params({"units": 32})["units"])
keras.utils.set_random_seed(0)


class Passes(keras.layers.Layer):
    # Serving time without size: one small square matrix applied `times` times when the
    # model serves (the identity: the answer is unchanged), never in training.

    def __init__(self, times, **kwargs):
        super().__init__(**kwargs)
        self.times = times

    def build(self, shape):
        if self.times:
            self.w = self.add_weight(shape=(shape[-1], shape[-1]), initializer="identity",
                                     trainable=False)

    def call(self, x, training=False):
        if training or not self.times:
            return x
        return tf.while_loop(lambda i, y: i < self.times,
                             lambda i, y: (i + 1, tf.matmul(y, self.w)),
                             [tf.constant(0), x])[1]


x, y = load_digits(return_X_y=True)
x_train, x_val, y_train, y_val = train_test_split(
    (x / 16.0).astype("float32"), y, test_size=0.25, random_state=0, stratify=y)
model = keras.Sequential([
    keras.Input((64,), name="pixels"),
    keras.layers.Dense(units, activation="relu"),
    keras.layers.Dense(units, activation="relu"),
    Passes(SLOW_PASSES if units >= WIDE else 0),
    keras.layers.Dense(10, activation="softmax"),
])
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
history = model.fit(x_train, y_train, validation_data=(x_val, y_val), epochs=4,
                    batch_size=32, verbose=0)
tuner.save_model(model)
tuner.report({"val_accuracy": float(history.history["val_accuracy"][-1]),
              "params_k": model.count_params() / 1000})
"""

#: Width buys accuracy and costs latency: the wide model serves through SLOW_PASSES extra
#: products (tens of milliseconds a prediction on any machine, the narrow ones a few), its
#: size within the budget, so the latency bound is what leaves it out.
WIDE, SLOW_PASSES, LATENCY_BUDGET_MS, SIZE_BUDGET_MB = 256, 5000, 40.0, 2.0


def train_code(wide: int, passes: int) -> str:
    """The trial's code: models ``wide`` units wide or more serve through ``passes`` extra
    products (0: none, the model is its layers alone)."""
    return TRAIN_TEMPLATE.replace("WIDE", str(wide)).replace("SLOW_PASSES", str(passes))


TRAIN = train_code(WIDE, SLOW_PASSES)
SPACE = {"units": {"type": "categorical", "choices": [2, 32, WIDE]}}


def _run(home: Home, spec: Path) -> dict[str, Any]:
    proc = home.cli("sweep", "run", str(spec), "--wait", "--json", timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = parse_json(proc.stdout)
    assert out["state"] == "completed", (out, proc.stderr[-3000:])
    return out


def test_the_most_accurate_model_over_budget_is_not_promoted(sqlite_home: Home,
                                                             tmp_path: Path) -> None:
    spec = write_sweep(
        tmp_path / "code", TRAIN, name="budget", trials=3, parallelism=1, sampler="grid",
        metric="val_accuracy", space=SPACE,
        metrics=[{"name": "val_accuracy", "direction": "maximize"},
                 {"name": "serving_latency_p95_ms"}, {"name": "model_size_mb"}],
        promote={"model": "digits", "policy": "if-better",
                 "constraints": {"size_mb": SIZE_BUDGET_MB,
                                 "latency_p95_ms": LATENCY_BUDGET_MS}},
    )
    out = _run(sqlite_home, spec)
    trials = {t["params"]["units"]: t for t in out["trials_detail"]}
    for units, t in trials.items():
        m = t["metrics"]
        # What the trial reported, and what tunehub measured of its model.
        assert set(m) == {"val_accuracy", "params_k", "serving_latency_p50_ms",
                          "serving_latency_p95_ms", "model_size_mb"}, (units, t)
        assert t["value"] == m["val_accuracy"]
        assert 0 < m["serving_latency_p50_ms"] <= m["serving_latency_p95_ms"]
    # Width buys accuracy: the widest model is the most accurate, and over the latency
    # budget (within the size one: latency alone leaves it out).
    best_overall = max(trials.values(), key=lambda t: t["value"])
    assert best_overall["params"]["units"] == WIDE, trials
    wide = trials[WIDE]["metrics"]
    assert wide["model_size_mb"] <= SIZE_BUDGET_MB, trials
    assert wide["serving_latency_p95_ms"] > LATENCY_BUDGET_MS, trials
    assert trials[32]["metrics"]["serving_latency_p95_ms"] <= LATENCY_BUDGET_MS, trials

    # Optuna holds a three-objective study with every trial's three values.
    study = optuna.load_study(study_name=optuna.get_all_study_names(sqlite_home.db_url)[0],
                              storage=sqlite_home.db_url)
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE", "MINIMIZE"]
    for ot in study.trials:
        m = trials[ot.params["units"]]["metrics"]
        assert ot.values == pytest.approx([m["val_accuracy"], m["serving_latency_p95_ms"],
                                           m["model_size_mb"]])

    # The promoted model is the best within the budget, with the figures it was chosen on.
    within = [t for t in trials.values()
              if t["metrics"]["serving_latency_p95_ms"] <= LATENCY_BUDGET_MS]
    chosen = max(within, key=lambda t: t["value"])
    assert "best within the budget" in out["reason"] and "1 of 3 models over it" in out["reason"]
    show = sqlite_home.cli("model", "show", "digits", "--json", check=True)
    [version] = json.loads(show.stdout)
    assert version["stage"] == "production"
    assert version["trial_number"] == chosen["number"] != best_overall["number"]
    assert version["metrics"] == chosen["metrics"]
    # Lineage: the content digest of the sweep's code snapshot, and the move with its reason.
    assert version["code_digest"] == tree_digest(
        sqlite_home.path / "sweeps" / str(out["id"]) / "code", sqlite_home.path / "sweeps")
    assert version["history"][-1]["reason"] == (
        f"sweep {out['id']}, policy if-better: first production version")

    # A second sweep whose only model breaks a tiny budget promotes nothing and says by how
    # much; production stays where it was.
    spec = write_sweep(
        tmp_path / "code2", TRAIN, name="tiny-budget", trials=1, parallelism=1, sampler="grid",
        metric="val_accuracy", space={"units": {"type": "categorical", "choices": [32]}},
        promote={"model": "digits", "constraints": {"size_mb": 0.001}},
    )
    second = _run(sqlite_home, spec)
    [trial] = second["trials_detail"]
    size = trial["metrics"]["model_size_mb"]
    assert second["reason"] == (
        "nothing promoted: no model meets the budget (model_size_mb <= 0.001): model_size_mb: "
        f"1 of 1 over; nearest trial 0 model_size_mb {size:.4g} > 0.001 (by {size - 0.001:.4g})")
    shown = sqlite_home.cli("sweep", "show", str(second["id"]), check=True).stdout
    assert "no model meets the budget" in shown
    after = json.loads(sqlite_home.cli("model", "show", "digits", "--json", check=True).stdout)
    assert [(v["version"], v["stage"]) for v in after] == [(1, "production")]

    # A sweep may send its model to canary first (``model serve`` releases it gradually):
    # production stays, the history says which sweep and policy put it there.
    spec = write_sweep(
        tmp_path / "code3", TRAIN, name="to-canary", trials=1, parallelism=1, sampler="grid",
        metric="val_accuracy", space={"units": {"type": "categorical", "choices": [8]}},
        promote={"model": "digits", "policy": "always", "stage": "canary",
                 "constraints": {"size_mb": 1.0}},
    )
    third = _run(sqlite_home, spec)
    assert third["reason"].startswith("digits v2 promoted to canary"), third["reason"]
    after = json.loads(sqlite_home.cli("model", "show", "digits", "--json", check=True).stdout)
    stages = {v["version"]: v for v in after}
    assert (stages[1]["stage"], stages[2]["stage"]) == ("production", "canary")
    assert stages[2]["history"][-1]["reason"] == f"sweep {third['id']}, policy always"
