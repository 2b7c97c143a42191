"""Plain Optuna's cost of a report: ``trial.report(value, step)`` then ``trial.should_prune()``,
the two calls a trial makes per epoch with Optuna alone, on an RDBStorage (the peer of the
report-throughput benchmark, ``benchmarks/reports.py``).

``--studies S`` studies of ``--trials T`` running trials each (asked up front, random sampler,
one float, the pruner tunehub builds for the same spec), each trial reporting ``--steps R``
values (step 1..R, the same curve as the load generator sends). ``--threads W`` threads share
the trials round-robin; each walks the steps in order and, at each step, reports for each of
its trials in turn, so all trials advance together as concurrent trials would.
``--budget-s``: each thread stops at the first step boundary after that many seconds (plain
Optuna's report cost grows with the study, and a 500-trial study on one machine's RDB storage
takes far longer than the tuner's run); the rates are then of the steps done, which the output
says. The storage is
opened as tunehub opens it (``tuner.search.study.storage_for``: SQLite with WAL and
``synchronous=NORMAL``). Prints one JSON line: reports/s over the timed phase, per-call
(report + should_prune) latency, CPU seconds, and what the storage holds afterwards.
"""

from __future__ import annotations

import argparse
import json
import resource
import threading
import time

import optuna

from tuner.search.study import make_pruner, make_sampler, storage_for
from tuner.spec import SweepSpec


def value_at(step: int) -> float:
    """The curve every simulated trial reports (the same as the load generator's)."""
    return 1.0 - 1.0 / (step + 1)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--studies", type=int, default=1)
    p.add_argument("--trials", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--pruner", default="median")
    p.add_argument("--budget-s", type=float, default=0.0, help="0: no limit")
    args = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage_for(args.storage)
    trials: list[optuna.trial.Trial] = []
    for i in range(args.studies):
        spec = SweepSpec.from_dict({
            "name": f"optuna-report-{i}", "command": "true", "metric": "score",
            "direction": "maximize", "trials": args.trials, "parallelism": args.trials,
            "sampler": "random", "seed": i + 1, "pruner": args.pruner,
            "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        })
        study = optuna.create_study(storage=storage, sampler=make_sampler(spec),
                                    pruner=make_pruner(spec), direction="maximize",
                                    study_name=f"optuna-report-{i}")
        dists = spec.distributions()
        trials += [study.ask(dists) for _ in range(args.trials)]
    threads = max(1, min(args.threads, len(trials)))
    shares = [trials[k::threads] for k in range(threads)]
    latencies: list[list[float]] = [[] for _ in range(threads)]
    pruned = [0] * threads
    bounds: list[tuple[float, float]] = [(0.0, 0.0)] * threads
    done = [0] * threads  # steps each thread finished for all its trials
    barrier = threading.Barrier(threads)

    def work(k: int) -> None:
        lat = latencies[k]
        barrier.wait()
        first = time.perf_counter()
        deadline = first + args.budget_s if args.budget_s > 0 else float("inf")
        for step in range(1, args.steps + 1):
            if time.perf_counter() > deadline:
                break
            value = value_at(step)
            for trial in shares[k]:
                t0 = time.perf_counter()
                trial.report(value, step)
                if trial.should_prune():
                    pruned[k] += 1
                lat.append(time.perf_counter() - t0)
            done[k] = step
        bounds[k] = (first, time.perf_counter())

    r0 = resource.getrusage(resource.RUSAGE_SELF)
    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    wall = max(b for _, b in bounds) - min(a for a, _ in bounds)
    every = [x for lat in latencies for x in lat]
    lost = wrong = 0
    steps_of = {(t.study.study_name, t.number): done[k]
                for k, share in enumerate(shares) for t in share}
    for i in range(args.studies):
        study = optuna.load_study(study_name=f"optuna-report-{i}", storage=storage)
        for ft in study.trials:
            got = ft.intermediate_values
            for step in range(1, steps_of[(study.study_name, ft.number)] + 1):
                if step not in got:
                    lost += 1
                elif got[step] != value_at(step):
                    wrong += 1
    print(json.dumps({
        "studies": args.studies, "trials": args.trials, "steps": args.steps,
        "threads": threads, "reports": len(every), "wall_s": wall,
        "budget_s": args.budget_s, "steps_done": min(done),
        "reports_per_s": len(every) / wall if wall > 0 else None,
        "latency_s": {"p50": percentile(every, 50), "p95": percentile(every, 95),
                      "p99": percentile(every, 99), "max": max(every)},
        "cpu_s": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
        "pruned": sum(pruned), "lost": lost, "wrong": wrong,
    }))


if __name__ == "__main__":
    main()
