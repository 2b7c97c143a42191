"""Ray Tune on a search workload (:mod:`benchmarks.search_workloads`): ``OptunaSearch`` (TPE)
and ``ASHAScheduler`` at their defaults (grace period 1, reduction factor 4), ``max_t`` = the
workload's epochs, ``max_concurrent_trials`` at a time, actors reused, one ``tune.report``
per epoch. Runs in a virtual environment of its own (Ray's pins differ from tunehub's), with
only numpy and scikit-learn from this repository's code; a Ray cluster of its own
(``address="local"``) on loopback.

Prints one JSON object: per seed, every epoch report (seconds since ``fit`` started) and every
trial's end; trials ASHA stopped are trained to the end afterwards (the training is
deterministic) so the benchmark can count the ones that would have won.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")


def space() -> dict[str, Any]:
    from ray import tune

    from benchmarks.search_workloads import SPACE

    out: dict[str, Any] = {}
    for name, d in SPACE.items():
        if d["type"] == "categorical":
            out[name] = tune.choice(d["choices"])
        elif d["type"] == "float":
            out[name] = (tune.loguniform if d.get("log") else tune.uniform)(d["low"], d["high"])
        else:
            out[name] = (tune.lograndint if d.get("log") else tune.randint)(
                d["low"], d["high"] + 1)
    return out


def make_trainable(workload: str, marks: str) -> Any:
    def trainable(config: dict[str, Any]) -> None:
        from ray import tune

        from benchmarks.search_workloads import WORKLOADS, epochs

        trial_id = tune.get_context().get_trial_id()
        params = {k: v for k, v in config.items() if k != "_epochs"}
        with open(Path(marks, trial_id), "a") as log:
            for step, (value, _) in enumerate(
                    epochs(WORKLOADS[workload], params, int(config["_epochs"])), start=1):
                log.write(json.dumps({"t": time.time(), "step": step, "value": value}) + "\n")
                log.flush()
                tune.report({"value": value})

    return trainable


def run_seed(args: argparse.Namespace, seed: int, root: Path) -> dict[str, Any]:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    from benchmarks.search_workloads import EPOCHS, WORKLOADS, train

    marks = root / f"marks-{seed}"
    marks.mkdir(parents=True)
    param_space = {**space(), "_epochs": EPOCHS}
    tuner = tune.Tuner(
        make_trainable(args.workload, str(marks)),
        param_space=param_space,
        tune_config=tune.TuneConfig(
            metric="value", mode="max",
            search_alg=OptunaSearch(seed=seed),
            scheduler=ASHAScheduler(max_t=EPOCHS),
            num_samples=args.trials, max_concurrent_trials=args.parallelism,
            # One worker process per slot, not per trial: Ray's default (False) starts a
            # process for every trial, which on a loaded 2-core machine took longer than the
            # training (measured: ~100 s to the first report, tens of seconds per trial).
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(storage_path=str(root / "ray"), name=f"seed-{seed}",
                                  verbose=0),
    )
    started = time.time()
    results = tuner.fit()
    wall = time.time() - started
    reports: list[float] = []
    ends: list[tuple[float, float | None, float, int]] = []
    for result in results:
        log_path = marks / str((result.metrics or {}).get("trial_id", ""))
        if not log_path.is_file():
            continue
        lines = [json.loads(x) for x in log_path.read_text().splitlines() if x.strip()]
        if not lines:
            continue
        reports += [x["t"] - started for x in lines]
        last = lines[-1]
        if last["step"] >= EPOCHS:
            ends.append((last["t"] - started, last["value"], last["value"], EPOCHS))
        else:  # stopped by ASHA: what would it have reached?
            config = {k: v for k, v in result.config.items() if k != "_epochs"}
            final = train(WORKLOADS[args.workload], config)[0][-1]
            ends.append((last["t"] - started, None, final, last["step"]))
    return {"seed": seed, "reports": reports, "ends": ends, "fit_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", required=True)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    args = parser.parse_args()

    import ray

    ray.init(address="local", num_cpus=args.parallelism, include_dashboard=False,
             _node_ip_address="127.0.0.1", log_to_driver=False, logging_level="warning")
    try:
        with tempfile.TemporaryDirectory(prefix="ray-search-") as tmp:
            runs = [run_seed(args, seed, Path(tmp)) for seed in args.seeds]
    finally:
        ray.shutdown()
    import ray as _ray

    print(json.dumps({"runs": runs, "ray": _ray.__version__}))


if __name__ == "__main__":
    main()
