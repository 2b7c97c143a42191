"""Workloads where the search matters, for :mod:`benchmarks.search`: small scikit-learn MLPs
trained one epoch at a time (``partial_fit``) on data generated with a known structure, with a
search space full of traps (learning rate over five decades, depth and width, L2 strength,
batch size).

Why these and not digits: on ``examples/digits`` about a third of random configurations reach
the target within a few epochs, so luck finds it as fast as any search. Here the good region is
small (the best 5 % of random configurations is the target) and a bad learning rate or batch
size cannot be rescued by training longer.

Training is deterministic for a configuration (weights and batch order seeded by a constant),
so a learning curve is a function of the configuration alone: a pruned trial can be trained to
the end afterwards and its final value is the one it would have had. Imported by the Ray Tune
peer too (``benchmarks/peers/ray_search.py``), so both train exactly the same models.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

EPOCHS = 27
#: The space, in tunehub's spec form (``SweepSpec.space``); every method samples from it.
SPACE: dict[str, dict[str, Any]] = {
    "lr": {"type": "float", "low": 1e-5, "high": 1.0, "log": True},
    "layers": {"type": "int", "low": 1, "high": 3},
    "width": {"type": "int", "low": 8, "high": 128, "log": True},
    "alpha": {"type": "float", "low": 1e-6, "high": 1.0, "log": True},
    "batch_size": {"type": "categorical", "choices": [16, 32, 64, 128, 256, 512]},
}


@dataclass(frozen=True)
class Workload:
    """A data set, a model family and how its validation value is read (higher is better)."""

    name: str
    description: str
    metric: str
    make_data: Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
    classifier: bool
    solver: str


def _classification() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import make_classification

    x, y = make_classification(
        n_samples=1200, n_features=30, n_informative=10, n_redundant=5, n_classes=5,
        n_clusters_per_class=3, class_sep=1.0, flip_y=0.02, random_state=7)
    x = (x - x[:800].mean(0)) / x[:800].std(0)
    return x[:800], y[:800], x[800:], y[800:]


def _friedman() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import make_friedman1

    x, y = make_friedman1(n_samples=1200, n_features=10, noise=1.0, random_state=7)
    y = (y - y[:800].mean()) / y[:800].std()
    return x[:800], y[:800], x[800:], y[800:]


WORKLOADS = {
    "clusters": Workload(
        "clusters", "5-class classification, 30 features (10 informative, 5 redundant), "
        "3 clusters per class (`make_classification`, 800 train / 400 validation); "
        "MLP, SGD with Nesterov momentum", "val_accuracy", _classification, True, "sgd"),
    "friedman": Workload(
        "friedman", "regression on Friedman #1 (`make_friedman1`, 10 features of which 5 "
        "matter, noise 1.0; 800 train / 400 validation); MLP, Adam", "val_r2",
        _friedman, False, "adam"),
}

_DATA: dict[str, tuple[np.ndarray, ...]] = {}


def data(workload: Workload) -> tuple[np.ndarray, ...]:
    if workload.name not in _DATA:
        _DATA[workload.name] = workload.make_data()
    return _DATA[workload.name]


def _model(workload: Workload, params: dict[str, Any]) -> Any:
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    cls = MLPClassifier if workload.classifier else MLPRegressor
    return cls(
        hidden_layer_sizes=(int(params["width"]),) * int(params["layers"]),
        solver=workload.solver, learning_rate_init=float(params["lr"]),
        alpha=float(params["alpha"]), batch_size=int(params["batch_size"]),
        momentum=0.9, nesterovs_momentum=True, random_state=0, max_iter=1, shuffle=True)


def epochs(workload: Workload, params: dict[str, Any],
           count: int = EPOCHS) -> Iterator[tuple[float, float]]:
    """Train ``params`` for ``count`` epochs, yielding each epoch's validation value and
    training seconds. A diverged model (NaN, overflow) scores the floor from then on: 0
    accuracy, or an R² of -1 (also the lowest value any epoch reports)."""
    xt, yt, xv, yv = data(workload)
    model = _model(workload, params)
    classes = np.unique(yt) if workload.classifier else None
    floor = 0.0 if workload.classifier else -1.0
    broken = False
    for _ in range(count):
        t0 = time.perf_counter()
        value = floor
        if not broken:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                try:
                    if classes is not None:
                        model.partial_fit(xt, yt, classes=classes)
                    else:
                        model.partial_fit(xt, yt)
                    value = float(model.score(xv, yv))
                except (ValueError, FloatingPointError, OverflowError):
                    broken = True
            if not math.isfinite(value):
                value, broken = floor, True
        yield max(value, floor), time.perf_counter() - t0


def train(workload: Workload, params: dict[str, Any],
          count: int = EPOCHS) -> tuple[list[float], list[float]]:
    """The whole learning curve: each epoch's validation value, and its training seconds."""
    curve = list(epochs(workload, params, count))
    return [v for v, _ in curve], [s for _, s in curve]
