"""The target of each search workload: the best 5 % of random configurations' final value,
measured once and kept in ``search_targets.json`` with how it was made.

``python -m benchmarks.search_targets [--configs 500] [--workload NAME]`` trains that many
configurations drawn by Optuna's ``RandomSampler`` (seed 1000, which no benchmark seed uses)
from :data:`benchmarks.search_workloads.SPACE` to the end, and records the 95th percentile of
their final values (nearest rank) with the whole distribution's quantiles.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.search_workloads import EPOCHS, SPACE, WORKLOADS, train

TARGETS = Path(__file__).resolve().parent / "search_targets.json"
SAMPLER_SEED = 1000


def distributions() -> dict[str, Any]:
    from tuner.spec import SweepSpec

    return SweepSpec.from_dict({"name": "targets", "command": "true", "metric": "value",
                                "space": SPACE}).distributions()


def measure(name: str, configs: int) -> dict[str, Any]:
    import optuna

    from benchmarks._common import percentile

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    workload = WORKLOADS[name]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=SAMPLER_SEED),
                                direction="maximize")
    dists = distributions()
    finals: list[float] = []
    epoch_s: list[float] = []
    started = time.perf_counter()
    for _ in range(configs):
        trial = study.ask(dists)
        values, seconds = train(workload, trial.params)
        study.tell(trial, values[-1])
        finals.append(values[-1])
        epoch_s.extend(seconds)
    return {
        "target": percentile(finals, 95),
        "how": f"95th percentile (nearest rank) of the final ({EPOCHS}-epoch) value of "
               f"{configs} configurations drawn by optuna.samplers.RandomSampler"
               f"(seed={SAMPLER_SEED}) from the benchmark's space",
        "configs": configs, "epochs": EPOCHS, "metric": workload.metric,
        "quantiles": {str(q): percentile(finals, q) for q in (10, 25, 50, 75, 90, 95, 99)},
        "max": max(finals), "median_epoch_s": statistics.median(epoch_s),
        "measure_s": time.perf_counter() - started,
    }


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(TARGETS.read_text()) if TARGETS.exists() else {}
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=500)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    args = parser.parse_args()
    for name in args.workload or sorted(WORKLOADS):
        result = measure(name, args.configs)
        data = load()  # re-read: another workload may have been measured meanwhile
        data[name] = result
        TARGETS.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        print(name, json.dumps(result))


if __name__ == "__main__":
    main()
