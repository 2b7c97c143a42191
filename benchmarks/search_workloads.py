"""Workloads where the search matters, for :mod:`benchmarks.search`: small NumPy MLPs
trained one epoch at a time on data generated with a known structure, with a
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

# One BLAS thread: these matrices are tiny, and on a shared machine BLAS's threads spin
# against each other (measured here: 52 ms an epoch with its default threads, 3.5 ms with one).
threadpool_limits(1)

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


class MLP:
    """A small NumPy MLP (ReLU, SGD with Nesterov momentum 0.9 or Adam, L2 ``alpha``), one
    epoch per :meth:`epoch`: scikit-learn's ``partial_fit`` spends more time validating its
    input than training models this small, and the benchmark trains thousands of epochs."""

    def __init__(self, workload: Workload, params: dict[str, Any], n_in: int,
                 n_out: int) -> None:
        rng = np.random.default_rng(0)
        sizes = [n_in] + [int(params["width"])] * int(params["layers"]) + [n_out]
        self.w = [rng.normal(0, math.sqrt(2 / a), (a, b))
                  for a, b in zip(sizes, sizes[1:], strict=False)]
        self.b = [np.zeros(b) for b in sizes[1:]]
        self.lr, self.alpha = float(params["lr"]), float(params["alpha"])
        self.batch = int(params["batch_size"])
        self.adam = workload.solver == "adam"
        self.classifier = workload.classifier
        self.m = [np.zeros_like(p) for p in self.w + self.b]
        self.v = [np.zeros_like(p) for p in self.w + self.b]
        self.t = 0
        self.rng = np.random.default_rng(1)

    def forward(self, x: np.ndarray) -> list[np.ndarray]:
        acts = [x]
        for i, (w, b) in enumerate(zip(self.w, self.b, strict=True)):
            z = acts[-1] @ w + b
            acts.append(np.maximum(z, 0) if i < len(self.w) - 1 else z)
        return acts

    def epoch(self, x: np.ndarray, y: np.ndarray) -> None:
        order = self.rng.permutation(len(x))
        for start in range(0, len(x), self.batch):
            idx = order[start:start + self.batch]
            acts = self.forward(x[idx])
            out = acts[-1]
            if self.classifier:
                e = np.exp(out - out.max(1, keepdims=True))
                grad = e / e.sum(1, keepdims=True)
                grad[np.arange(len(idx)), y[idx]] -= 1
            else:
                grad = out - y[idx, None]
            grad /= len(idx)
            grads_w, grads_b = [], []
            for i in range(len(self.w) - 1, -1, -1):
                grads_w.append(acts[i].T @ grad + self.alpha * self.w[i] / len(idx))
                grads_b.append(grad.sum(0))
                if i:
                    grad = (grad @ self.w[i].T) * (acts[i] > 0)
            self._step(grads_w[::-1] + grads_b[::-1])

    def _step(self, grads: list[np.ndarray]) -> None:
        params = self.w + self.b
        self.t += 1
        for k, (p, g) in enumerate(zip(params, grads, strict=True)):
            if self.adam:
                self.m[k] = 0.9 * self.m[k] + 0.1 * g
                self.v[k] = 0.999 * self.v[k] + 0.001 * g * g
                mhat = self.m[k] / (1 - 0.9 ** self.t)
                vhat = self.v[k] / (1 - 0.999 ** self.t)
                p -= self.lr * mhat / (np.sqrt(vhat) + 1e-8)
            else:  # Nesterov momentum
                self.m[k] = 0.9 * self.m[k] - self.lr * g
                p += 0.9 * self.m[k] - self.lr * g

    def score(self, x: np.ndarray, y: np.ndarray) -> float:
        out = self.forward(x)[-1]
        if self.classifier:
            return float((out.argmax(1) == y).mean())
        pred = out[:, 0]
        return float(1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum())


def epochs(workload: Workload, params: dict[str, Any],
           count: int = EPOCHS) -> Iterator[tuple[float, float]]:
    """Train ``params`` for ``count`` epochs, yielding each epoch's validation value and
    training seconds. A diverged model (NaN, overflow) scores the floor from then on: 0
    accuracy, or an R² of -1 (also the lowest value any epoch reports)."""
    xt, yt, xv, yv = data(workload)
    n_out = int(yt.max()) + 1 if workload.classifier else 1
    model = MLP(workload, params, xt.shape[1], n_out)
    floor = 0.0 if workload.classifier else -1.0
    broken = False
    for _ in range(count):
        t0 = time.perf_counter()
        value = floor
        if not broken:
            with np.errstate(all="ignore"):
                model.epoch(xt, yt)
                value = model.score(xv, yv)
            if not math.isfinite(value):
                value, broken = floor, True
        yield max(value, floor), time.perf_counter() - t0


def train(workload: Workload, params: dict[str, Any],
          count: int = EPOCHS) -> tuple[list[float], list[float]]:
    """The whole learning curve: each epoch's validation value, and its training seconds."""
    curve = list(epochs(workload, params, count))
    return [v for v, _ in curve], [s for _, s in curve]
