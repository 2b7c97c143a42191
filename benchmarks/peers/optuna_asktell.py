"""Plain Optuna's ask/tell loop on the same storage and sampler configuration as a tunehub
sweep: the floor under tunehub's controller cost (tunehub asks and tells through Optuna).

Keeps ``parallelism`` trials in flight like the controller does, so TPE's constant liar sees
the same number of running trials.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections import deque

import optuna

from tuner.backends.instant import quadratic
from tuner.search.study import make_pruner, make_sampler, storage_for
from tuner.spec import SweepSpec


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, required=True)
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--storage", required=True)
    parser.add_argument("--sampler", default="tpe")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = SweepSpec.from_dict(
        {
            "name": "optuna-peer",
            "command": "true",
            "metric": "score",
            "trials": args.trials,
            "parallelism": args.parallelism,
            "sampler": args.sampler,
            "seed": args.seed,
            "space": {
                "x": {"type": "float", "low": 0.0, "high": 1.0},
                "y": {"type": "float", "low": 0.0, "high": 1.0},
            },
        }
    )
    # The storage exactly as tunehub opens it (SQLite: WAL, synchronous=NORMAL), so the
    # comparison is of the loop, not of fsyncs.
    storage = storage_for(args.storage)
    study = optuna.create_study(
        storage=storage, sampler=make_sampler(spec), pruner=make_pruner(spec),
        direction="maximize",
    )
    dists = spec.distributions()
    asks: list[float] = []
    tells: list[float] = []
    finished: list[float] = []
    in_flight: deque[optuna.trial.Trial] = deque()
    started = time.perf_counter()
    created = 0
    while created < args.trials or in_flight:
        while created < args.trials and len(in_flight) < args.parallelism:
            t0 = time.perf_counter()
            trial = study.ask(dists)
            asks.append(time.perf_counter() - t0)
            in_flight.append(trial)
            created += 1
        trial = in_flight.popleft()
        t0 = time.perf_counter()
        study.tell(trial, quadratic(trial.params))
        t1 = time.perf_counter()
        tells.append(t1 - t0)
        finished.append(t1)
    wall = time.perf_counter() - started
    print(json.dumps({
        "wall_s": wall,
        "ask_s": asks,
        "tell_s": tells,
        "finish_times": finished,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "best_value": study.best_value,
    }))


if __name__ == "__main__":
    main()
