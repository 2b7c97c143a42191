"""Search quality where the search matters: tunehub's default sampler and pruner against
random search, plain Optuna and Ray Tune, on the workloads of
:mod:`benchmarks.search_workloads`, several seeds each, in one run.

For every method and seed: the epochs (compute) and the seconds spent until the first trial
that *completed* reached the workload's target (the best 5 % of random configurations, from
``search_targets.json``), the best completed value once a fixed budget of epochs was spent, and
how many trials the pruner stopped that would have reached the target had they run on.
Medians over the seeds, with the range.

``python -m benchmarks search`` (``make bench``) runs it among the others; during development
``python -m benchmarks.search --workload clusters --seeds 1 2 3 --methods tunehub random``
prints a table of any methods, :data:`CANDIDATES` included (the settings the defaults were
chosen among).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from benchmarks._base import Benchmark, NotMeasured, RunContext
from benchmarks._common import REPO, ratio
from benchmarks.search_sim import Curves, Trace, run_controller, run_optimize
from benchmarks.search_targets import load as load_targets
from benchmarks.search_workloads import EPOCHS, SPACE, WORKLOADS

PARALLELISM = 2
#: The Ray Tune peer's interpreter: a virtual environment with ``ray[tune]``, optuna, numpy and
#: scikit-learn (``python -m venv DIR && DIR/bin/pip install 'ray[tune]' optuna scikit-learn``).
RAY_PYTHON = os.environ.get("TUNEHUB_BENCH_RAY_PYTHON", "")
#: A directory holding the Ray Tune peer's stored output (``ray-<workload>.json``) to read
#: instead of running it; and one of learning curves kept from an earlier run (the training is
#: deterministic: a stored curve is what training the configuration again gives).
RAY_FROM = os.environ.get("TUNEHUB_BENCH_RAY_FROM", "")
CURVES = os.environ.get("TUNEHUB_BENCH_SEARCH_CURVES", "")
#: The measurement the defaults were chosen by: ``python -m benchmarks.search --json`` with
#: the candidates (see :data:`CANDIDATES`), rendered under the benchmark's table.
CHOSEN_BY = Path(__file__).resolve().parent / "search_candidates.json"

Study = Callable[[int, int], optuna.Study]  # (seed, trials) -> study


def _spec(seed: int, trials: int, **extra: Any) -> Any:
    from tuner.spec import SweepSpec

    return SweepSpec.from_dict({"name": "search", "command": "true", "metric": "value",
                                "space": SPACE, "trials": trials, "parallelism": PARALLELISM,
                                "seed": seed, **extra})


def tunehub_study(**extra: Any) -> Study:
    """The study tunehub builds for a spec that names ``extra`` (nothing: its defaults)."""

    def build(seed: int, trials: int) -> optuna.Study:
        from tuner.search.study import make_pruner, make_sampler

        spec = _spec(seed, trials, **extra)
        return optuna.create_study(sampler=make_sampler(spec), pruner=make_pruner(spec),
                                   direction="maximize")

    return build


def optuna_study(sampler: Callable[[int], optuna.samplers.BaseSampler],
                 pruner: Callable[[], optuna.pruners.BasePruner]) -> Study:
    def build(seed: int, trials: int) -> optuna.Study:
        return optuna.create_study(sampler=sampler(seed), pruner=pruner(),
                                   direction="maximize")

    return build


def _before(seed: int) -> optuna.samplers.BaseSampler:
    """tunehub's default sampler before issue 28: TPE, Optuna's 10 random startup trials."""
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)


#: Methods compared in the benchmark: label, how the study is built, how it is driven.
METHODS: dict[str, tuple[str, Study, str]] = {
    "tunehub": ("tunehub defaults", tunehub_study(), "controller"),
    "tunehub_before": ("tunehub defaults before (TPE, no pruner)",
                       optuna_study(_before, optuna.pruners.NopPruner), "controller"),
    "random": ("random search, no pruning",
               optuna_study(lambda s: optuna.samplers.RandomSampler(seed=s),
                            optuna.pruners.NopPruner), "controller"),
    "optuna": ("plain Optuna: TPE + Hyperband, study.optimize",
               optuna_study(lambda s: optuna.samplers.TPESampler(seed=s),
                            optuna.pruners.HyperbandPruner), "optimize"),
}

def tpe_with(startup: int, **pruner: Any) -> Study:
    """TPE as tunehub builds it, with ``startup`` random trials, and tunehub's pruner for
    the spec's ``pruner`` (none if empty)."""

    def build(seed: int, trials: int) -> optuna.Study:
        from tuner.search.study import make_pruner

        spec = _spec(seed, trials, sampler="tpe", pruner=pruner or "none")
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                             n_startup_trials=startup)
        return optuna.create_study(sampler=sampler, pruner=make_pruner(spec),
                                   direction="maximize")

    return build


_HB = {"type": "hyperband", "max_resource": EPOCHS, "reduction_factor": 3}
#: Settings the defaults were chosen among (``--methods``): TPE's random startup trials, and
#: tunehub's pruners (with its rules for small sweeps) at several minimum resources. ASHA's
#: reduction factor is Optuna's default, 4 (tunehub's ``min_trials`` for it is still 3).
CANDIDATES: dict[str, tuple[str, Study, str]] = {
    f"tpe{n}_{key}": (f"TPE ({n} startup) + {label}", tpe_with(n, **pruner), "controller")
    for n in (5, 10)
    for key, label, pruner in (
        ("none", "no pruner", {}),
        ("hb1", "Hyperband min 1, η 3", {**_HB, "min_resource": 1}),
        ("hb3", "Hyperband min 3, η 3", {**_HB, "min_resource": 3}),
        ("asha1", "ASHA min 1, η 4", {"type": "asha", "min_resource": 1}),
        ("asha3", "ASHA min 3, η 4", {"type": "asha", "min_resource": 3}),
        ("ashaauto", "ASHA min auto, η 4", {"type": "asha"}),
        ("median", "median (5 startup, 3 warm-up)",
         {"type": "median", "n_startup_trials": 5, "n_warmup_steps": 3}),
        # Without the wait for other trials at a step (``min_trials: 1``, about Optuna's own
        # successive halving): how much the rule for small sweeps costs a 40-trial one.
        ("asha1now", "ASHA min 1, η 4, no wait", {"type": "asha", "min_resource": 1,
                                                  "min_trials": 1}),
        ("asha1r3now", "ASHA min 1, η 3, no wait",
         {"type": "asha", "min_resource": 1, "reduction_factor": 3, "min_trials": 1}),
        ("asha3now", "ASHA min 3, η 4, no wait", {"type": "asha", "min_resource": 3,
                                                  "min_trials": 1}),
    )
}


def run_method(key: str, workload: str, seeds: list[int], trials: int, target: float,
               budget: int, curves: Curves) -> list[dict[str, Any]]:
    _, build, how = {**METHODS, **CANDIDATES}[key]
    runs = []
    for seed in seeds:
        study = build(seed, trials)
        trace = (run_controller(study, curves, trials, PARALLELISM) if how == "controller"
                 else run_optimize(study, curves, trials))
        runs.append({"seed": seed, **trace.summary(target, budget)})
    return runs


def run_ray(workload: str, seeds: list[int], trials: int, target: float,
            budget: int, stored: Path | None = None) -> list[dict[str, Any]]:
    """The Ray Tune peer in its own interpreter (:data:`RAY_PYTHON`), or its output stored
    from a run of ``benchmarks.peers.ray_search`` (``stored``: ``ray-<workload>.json``)."""
    if stored is not None:
        return _ray_runs(json.loads(stored.read_text()), target, budget)
    argv = [RAY_PYTHON, "-m", "benchmarks.peers.ray_search", "--workload", workload,
            "--trials", str(trials), "--parallelism", str(PARALLELISM),
            "--seeds", *map(str, seeds)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=3600)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
        raise RuntimeError(f"ray_search exited with {proc.returncode}:\n{tail}")
    return _ray_runs(json.loads(lines[-1]), target, budget)


def _ray_runs(out: dict[str, Any], target: float, budget: int) -> list[dict[str, Any]]:
    runs = []
    for run in out["runs"]:
        trace = Trace(reports=run["reports"], ends=[tuple(e) for e in run["ends"]])
        runs.append({"seed": run["seed"], "fit_s": run["fit_s"],
                     **trace.summary(target, budget)})
    return runs


def _med(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _spread(values: list[Any]) -> list[float] | None:
    vals = [v for v in values if v is not None]
    return [min(vals), max(vals)] if vals else None


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and ranges over seeds. A seed that never reached the target is worse than any
    that did (infinite epochs and seconds to target): counting its whole sweep instead would
    flatter a method that prunes nearly everything and stops early. A median that falls on a
    miss is reported as not reached (None); ranges are over the seeds that reached it."""
    reached = [r for r in runs if r["reached"]]
    return {
        "runs": runs, "reached": len(reached),
        "median_epochs": _med_to_target([r.get("epochs") for r in runs]),
        "epochs_range": _spread([r["epochs"] for r in reached]),
        "median_seconds": _med_to_target([r.get("seconds") for r in runs]),
        "seconds_range": _spread([r["seconds"] for r in reached]),
        "median_best_at_budget": _med([r["best_at_budget"] for r in runs]),
        "best_at_budget_range": _spread([r["best_at_budget"] for r in runs]),
        "median_best": _med([r["best"] for r in runs]),
        "median_total_epochs": _med([r["total_epochs"] for r in runs]),
        "pruned": sum(r["pruned"] for r in runs),
        "pruned_winners": sum(r["pruned_winners"] for r in runs),
        "pruned_after_1": sum(r["pruned_after_1"] for r in runs),
    }


def _med_to_target(values: list[float | None]) -> float | None:
    """The median with a miss (None) as infinitely bad; None when the median is a miss."""
    if not values:
        return None
    m = statistics.median([math.inf if v is None else v for v in values])
    return None if math.isinf(m) or math.isnan(m) else m


def _one_seed(name: str, methods: list[str], seed: int, trials: int, target: float,
              budget: int, cache: Path | None) -> tuple[dict[str, dict[str, Any]], int]:
    """Every method on one workload and seed (a job of :func:`measure`'s pool): the runs by
    method, with their seconds, and how many curves were trained."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    curves = Curves(WORKLOADS[name], cache / f"{name}.jsonl" if cache else None)
    out = {}
    for key in methods:
        started = time.perf_counter()
        run = run_method(key, name, [seed], trials, target, budget, curves)[0]
        out[key] = {**run, "run_s": time.perf_counter() - started}
    return out, curves.trained


def measure(workloads: list[str], methods: list[str], seeds: list[int], trials: int,
            ray: bool, log: Callable[[str], None], jobs: int = 1,
            ray_from: Path | None = None, cache: Path | None = None) -> dict[str, Any]:
    """Every method on every workload and seed; ``jobs`` (workload, seed) pairs at a time in
    processes of their own (each trains its own curves). ``ray_from``: a directory of stored
    Ray Tune peer outputs to read instead of running it; ``cache``: a directory of learning
    curves shared by the processes (:class:`~benchmarks.search_sim.Curves`)."""
    from concurrent.futures import ProcessPoolExecutor

    targets = load_targets()
    missing = [w for w in workloads if w not in targets]
    if missing:
        raise NotMeasured(f"no target for {', '.join(missing)}: run python -m "
                          "benchmarks.search_targets first")
    budget = trials * EPOCHS // 2
    result: dict[str, Any] = {"seeds": seeds, "trials": trials, "parallelism": PARALLELISM,
                              "epochs": EPOCHS, "budget_epochs": budget, "jobs": jobs,
                              "workloads": {}}
    pairs = [(name, seed) for name in workloads for seed in seeds]
    log(f"search: {len(pairs)} (workload, seed) jobs, {jobs} at a time: {', '.join(methods)}")
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pair: pool.submit(_one_seed, pair[0], methods, pair[1], trials,
                                     targets[pair[0]]["target"], budget, cache)
                   for pair in pairs}
        done = {pair: f.result() for pair, f in futures.items()}
    for name in workloads:
        target = targets[name]["target"]
        out: dict[str, Any] = {"target": targets[name], "description":
                               WORKLOADS[name].description, "methods": {},
                               "curves_trained": sum(done[(name, s)][1] for s in seeds)}
        for key in methods:
            out["methods"][key] = aggregate([done[(name, s)][0][key] for s in seeds])
        if ray or ray_from:
            log(f"search: {name}, Ray Tune, seeds {seeds}")
            stored = ray_from / f"ray-{name}.json" if ray_from else None
            try:
                out["methods"]["ray"] = aggregate(
                    run_ray(name, seeds, trials, target, budget, stored))
                out["ray_stored"] = stored is not None
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                out["ray_error"] = str(exc)
        elif not RAY_PYTHON:
            out["ray_error"] = ("not run: set TUNEHUB_BENCH_RAY_PYTHON to a Python with "
                                "ray[tune] (see benchmarks/peers/ray_search.py)")
        result["workloads"][name] = out
    return result


LABELS = {**{k: v[0] for k, v in {**METHODS, **CANDIDATES}.items()},
          "ray": "Ray Tune: OptunaSearch + ASHA"}


def _num(v: float | None, fmt: str = ".0f") -> str:
    return "n/a" if v is None else format(v, fmt)


def _rng(r: list[float] | None, fmt: str = ".0f") -> str:
    return "" if not r else f" ({format(r[0], fmt)}–{format(r[1], fmt)})"


def render_workload(name: str, w: dict[str, Any], seeds: int) -> list[str]:
    t = w["target"]
    lines = [
        f"**{name}**: {w['description']}. Target {t['metric']} ≥ {t['target']:.4f}: "
        f"{t['how']} (median {t['quantiles']['50']:.3f}, best {t['max']:.4f}).", "",
        "| method | seeds reached | epochs to target | time to target | best at budget | "
        "best | pruned | pruned that would have won (after 1 epoch) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, m in w["methods"].items():
        lines.append(
            f"| {LABELS.get(key, key)} | {m['reached']}/{seeds} | "
            f"{_num(m['median_epochs'])}{_rng(m['epochs_range'])} | "
            f"{_num(m['median_seconds'], '.1f')} s{_rng(m['seconds_range'], '.1f')} | "
            f"{_num(m['median_best_at_budget'], '.4f')}"
            f"{_rng(m['best_at_budget_range'], '.3f')} | {_num(m['median_best'], '.4f')} | "
            f"{m['pruned']} | {m['pruned_winners']} ({m['pruned_after_1']} stopped after 1) |")
    if "ray_error" in w:
        lines += ["", f"Ray Tune: {w['ray_error']}"]
    return lines


class SearchBenchmark(Benchmark):
    name = "search"
    title = "Search quality where the search matters"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        seeds = list(range(1, ctx.size("search_seeds", 1, 20) + 1))
        trials = ctx.size("search_trials", 6, 40)
        ray = bool(ctx.size("search_ray", 0, 1)) and bool(RAY_PYTHON)
        jobs = ctx.size("search_jobs", 1, 1)
        return {"quick": ctx.quick, **measure(
                       sorted(WORKLOADS), list(METHODS), seeds, trials, ray, ctx.log, jobs,
                       ray_from=Path(RAY_FROM) if RAY_FROM and not ctx.quick else None,
                       cache=Path(CURVES) if CURVES else ctx.scratch / "curves")}

    def headline(self, result: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
        rows: list[tuple[str, str, bool | None]] = []
        for name, w in result["workloads"].items():
            m = w["methods"]
            ours = m.get("tunehub", {}).get("median_epochs")
            rnd = m.get("random", {}).get("median_epochs")
            peers = [m[k]["median_epochs"] for k in ("optuna", "ray") if k in m
                     and m[k]["median_epochs"] is not None]
            ok = ours is not None and rnd is not None and rnd / ours >= 3
            rows.append((f"{name}: ≥ 3× less compute than random to target",
                         f"{_num(ours)} vs {_num(rnd)} epochs: {ratio(rnd, ours)}", ok))
            if peers and ours is not None:
                rows.append((f"{name}: no more compute than the best peer",
                             f"{_num(ours)} vs {_num(min(peers))} epochs", ours <= min(peers)))
        return rows

    def render(self, result: dict[str, Any]) -> str:
        seeds = len(result["seeds"])
        lines = [
            f"{result['trials']} trials per sweep, {result['epochs']} epochs per full trial, "
            f"{result['parallelism']} at a time (plain Optuna: one at a time, as "
            f"`study.optimize` runs), seeds {result['seeds'][0]}..{result['seeds'][-1]}. "
            "Medians over the seeds, range in brackets (over the seeds that reached the "
            "target); a seed that missed counts as worse than any that reached it, and a "
            "median that falls on a miss reads n/a. Compute = epochs reported by all "
            "trials until the first "
            "*completed* trial at or above the target; time = the measured training seconds "
            "of those epochs spread over the workers, plus the real seconds in the sampler "
            "and pruner (Ray Tune: its real wall time from `fit`). Best at budget: the best "
            f"completed value after {result['budget_epochs']} epochs (half of random "
            "search's sweep). Pruned trials were trained to the end to count those that "
            "would have reached the target.", "",
        ]
        lines += [
            "Why not digits alone: on `examples/digits` about a third of random "
            "configurations reach val_accuracy 0.970 within a few epochs, so luck finds the "
            "target as fast as any search (TPE + Hyperband and random search both needed 72 "
            "epochs in issue 28); here only 1 configuration in 20 reaches the target and a bad "
            "learning rate, batch size or L2 strength cannot be trained out.", "",
            "What this does not show: time is the training seconds of the epochs spent plus "
            "the sampler's and pruner's real seconds, not tunehub's per-trial process start "
            "and report round trips (see `overhead` and `start_latency`); pruned trials are "
            "cheaper in epochs than in wall time there. Event order depends on measured "
            "seconds, and Optuna's Hyperband puts trials in brackets by a hash of the "
            "(random) study name, so a rerun moves single seeds. Hence 20 seeds: with 5, the "
            "median of the same method moved by more than the differences between methods "
            "(the defaults measured 326, 230 and 241 epochs to target on clusters in three "
            "runs of 5 seeds).", "",
        ]
        for name, w in result["workloads"].items():
            lines += render_workload(name, w, seeds) + [""]
            if w.get("ray_stored"):
                lines += ["Ray Tune's rows: its peer run in the same session, read from its "
                          "stored output (`TUNEHUB_BENCH_RAY_FROM`).", ""]
        if CHOSEN_BY.exists() and not result.get("quick"):
            chosen = json.loads(CHOSEN_BY.read_text())
            lines += ["### How the defaults were chosen", "",
                      f"The same benchmark with the candidate settings "
                      f"(`benchmarks/search_candidates.json`, seeds "
                      f"{chosen['seeds'][0]}..{chosen['seeds'][-1]}, "
                      f"{chosen['trials']} trials):", ""]
            for name, w in chosen["workloads"].items():
                w = {k: v for k, v in w.items() if k != "ray_error"}
                lines += render_workload(name, w, len(chosen["seeds"])) + [""]
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="search benchmark, any methods")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    parser.add_argument("--methods", nargs="+", default=list(METHODS),
                        choices=sorted({**METHODS, **CANDIDATES}))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--ray", action="store_true", help="also Ray Tune (RAY_PYTHON)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="(workload, seed) pairs run at a time, each in a process")
    parser.add_argument("--ray-from", type=Path,
                        help="read Ray Tune's runs from DIR/ray-<workload>.json (the peer's "
                             "output) instead of running it")
    parser.add_argument("--curves", type=Path,
                        help="keep learning curves in DIR/<workload>.jsonl, shared by the "
                             "jobs and by later runs")
    parser.add_argument("--json", type=Path, help="write the raw result here")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    result = measure(args.workload or sorted(WORKLOADS), args.methods, args.seeds,
                     args.trials, args.ray and bool(RAY_PYTHON),
                     lambda m: print(f"[search] {m}", file=sys.stderr, flush=True),
                     args.jobs, args.ray_from, args.curves)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(SearchBenchmark().render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
