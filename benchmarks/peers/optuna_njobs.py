"""Plain Optuna on the overhead workload: ``study.optimize(objective, n_jobs=4)`` where the
objective sleeps, on the same kind of storage tunehub uses (an RDB URL) and the same sampler
and pruner configuration (TPE with constant liar, successive halving).

This is what a user gets without a platform: threads in one process, no trial isolation.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import optuna

from tuner.search.study import storage_for


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, required=True)
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--storage", required=True)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # The storage exactly as tunehub opens it (SQLite: WAL, synchronous=NORMAL), so the
    # comparison is of the loop, not of fsyncs.
    storage = storage_for(args.storage)
    study = optuna.create_study(
        storage=storage,
        sampler=optuna.samplers.TPESampler(
            seed=args.seed, constant_liar=args.parallelism > 1, multivariate=True
        ),
        pruner=optuna.pruners.SuccessiveHalvingPruner(),
        direction="maximize",
    )

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", 0.0, 1.0)
        time.sleep(args.sleep)
        return 1.0 - (x - 0.3) ** 2

    started = time.perf_counter()
    study.optimize(objective, n_trials=args.trials, n_jobs=args.parallelism)
    wall = time.perf_counter() - started
    completed = sum(
        1 for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE
    )
    print(json.dumps({
        "wall_s": wall,
        "completed": completed,
        "trials": args.trials,
        "best_value": study.best_value,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))


if __name__ == "__main__":
    main()
