"""Ray Tune on the overhead workload: ``num_samples`` trials whose objective sleeps, with
``OptunaSearch`` and ``ASHAScheduler``, ``max_concurrent_trials`` at a time.

Ray is confined to this machine's loopback (``_node_ip_address=127.0.0.1``), its dashboard is
off and usage stats are disabled. Also records, per trial, when Tune started it (a callback on
the driver) and when the trainable's code ran, for the start-latency benchmark (``--import-tf``
imports TensorFlow in the trainable first).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def make_objective(sleep: float, import_tf: bool, marks: str) -> Any:
    def objective(config: dict[str, Any]) -> None:
        from ray import tune

        if import_tf:
            import tensorflow  # noqa: F401  (the point: user code with TensorFlow imported)
        ran = time.time()
        if marks:
            trial_id = tune.get_context().get_trial_id()
            Path(marks, f"ran-{trial_id}").write_text(repr(ran))
        time.sleep(sleep)
        tune.report({"score": 1.0 - (config["x"] - 0.3) ** 2, "ran_at": ran})

    return objective


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, required=True)
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--storage-path", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--import-tf", action="store_true")
    parser.add_argument("--reuse-actors", action="store_true",
                        help="TuneConfig(reuse_actors=True); Ray's default is False")
    args = parser.parse_args()

    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    marks = ""
    starts: dict[str, float] = {}
    if args.import_tf:
        marks = str(Path(args.storage_path) / "marks")
        Path(marks).mkdir(parents=True, exist_ok=True)

    class StartTimes(tune.Callback):
        """When Tune started each trial: the launch moment on the driver."""

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            starts[trial.trial_id] = time.time()

    t0 = time.perf_counter()
    ray.init(
        num_cpus=args.parallelism,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        logging_level="warning",
    )
    t1 = time.perf_counter()
    tuner = tune.Tuner(
        make_objective(args.sleep, args.import_tf, marks),
        param_space={"x": tune.uniform(0.0, 1.0)},
        tune_config=tune.TuneConfig(
            metric="score",
            mode="max",
            search_alg=OptunaSearch(seed=args.seed),
            scheduler=ASHAScheduler(max_t=1, grace_period=1),
            num_samples=args.trials,
            max_concurrent_trials=args.parallelism,
            reuse_actors=args.reuse_actors,
        ),
        run_config=tune.RunConfig(
            storage_path=args.storage_path, name="bench", verbose=0, callbacks=[StartTimes()]
        ),
    )
    results = tuner.fit()
    t2 = time.perf_counter()
    ray.shutdown()
    t3 = time.perf_counter()
    completed = sum(1 for r in results if r.error is None and "score" in (r.metrics or {}))
    latencies = []
    if marks:
        for trial_id, start in starts.items():
            path = Path(marks, f"ran-{trial_id}")
            if path.exists():
                latencies.append(float(path.read_text()) - start)
    print(json.dumps({
        "init_s": t1 - t0,
        "fit_s": t2 - t1,
        "shutdown_s": t3 - t2,
        "completed": completed,
        "trials": args.trials,
        "reuse_actors": args.reuse_actors,
        "best_value": results.get_best_result().metrics.get("score"),
        "start_latency_s": latencies,
        "driver_max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))


if __name__ == "__main__":
    main()
