"""Search quality of TPE on its bounded view (``tuner/search/sampling_view.py``) against TPE on the
whole study, over several seeds: the same sampler configuration the controller uses (TPE
multivariate with constant liar, 4 trials in flight), on Hartmann-6, a standard multimodal
6-dimensional test function whose minimum is known, so quality is a regret (distance of the
best value found to the optimum) after N trials. The view only changes what TPE sees past
320 finished trials; what it costs per ask is measured beside the regret.

Runs in this process on Optuna's in-memory storage: quality does not depend on the database,
and the controller's own cost is the scale benchmark's subject.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from typing import Any

from benchmarks._base import Benchmark, RunContext
from benchmarks._common import ms, percentile

PARALLELISM = 4
HARTMANN6_MIN = -3.32237
_A = [[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14],
      [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]]
_P = [[0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
      [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
      [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
      [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381]]
_ALPHA = [1.0, 1.2, 3.0, 3.2]


def hartmann6(x: list[float]) -> float:
    """Hartmann-6 on [0, 1]^6; its minimum is -3.32237."""
    return -sum(
        alpha * math.exp(-sum(a * (xi - p) ** 2 for a, xi, p in zip(row, x, prow, strict=True)))
        for alpha, row, prow in zip(_ALPHA, _A, _P, strict=True)
    )


def spec_for(seed: int) -> Any:
    from tuner.spec import SweepSpec

    return SweepSpec.from_dict({
        "name": "tpe-view", "command": "python -c pass", "metric": "loss",
        "direction": "minimize", "trials": 1, "parallelism": PARALLELISM, "sampler": "tpe",
        "seed": seed,
        "space": {f"x{i}": {"type": "float", "low": 0.0, "high": 1.0} for i in range(6)},
    })


def run_once(seed: int, trials: int, bounded: bool, checkpoints: list[int]) -> dict[str, Any]:
    """One sweep's worth of asks and tells as the controller makes them (the oldest of the
    trials in flight told first); regret at each checkpoint, per-ask seconds."""
    import optuna

    from tuner.search.mirror import bounded as bounded_sampler
    from tuner.search.sampling_view import BoundedTPE
    from tuner.search.study import make_sampler

    spec = spec_for(seed)
    sampler = make_sampler(spec)
    if bounded:
        sampler = bounded_sampler(sampler, seed)
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, sampler=sampler, direction="minimize")
    if isinstance(sampler, BoundedTPE):
        sampler.load(storage, [], study.direction)
    dists = spec.distributions()
    flight: deque[optuna.Trial] = deque()
    best, regret, asks = math.inf, {}, []
    for i in range(1, trials + 1):
        t0 = time.perf_counter()
        trial = study.ask(dists)
        asks.append(time.perf_counter() - t0)
        flight.append(trial)
        if len(flight) == PARALLELISM:
            done = flight.popleft()
            value = hartmann6([done.params[f"x{k}"] for k in range(6)])
            study.tell(done, value)
            best = min(best, value)
        if i in checkpoints:
            regret[str(i)] = best - HARTMANN6_MIN
    return {"regret": regret, "ask_late_p50_s": percentile(asks[-100:], 50)}


class TpeViewBenchmark(Benchmark):
    name = "tpe_view"
    title = "Search quality of TPE on a bounded view"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        trials = ctx.size("view_trials", 500, 2000)
        seeds = ctx.size("view_seeds", 2, 5)
        checkpoints = sorted({min(trials, c) for c in (250, 500, 1000, trials)})
        runs: dict[str, list[dict[str, Any]]] = {"whole": [], "bounded": []}
        for seed in range(1, seeds + 1):
            for kind in ("whole", "bounded"):
                ctx.log(f"tpe_view: seed {seed}, {kind} study, {trials} trials")
                runs[kind].append(run_once(seed, trials, kind == "bounded", checkpoints))
        return {"trials": trials, "seeds": seeds, "checkpoints": checkpoints,
                "parallelism": PARALLELISM, "runs": runs}

    @staticmethod
    def _regrets(result: dict[str, Any], kind: str, at: int) -> list[float]:
        return [r["regret"][str(at)] for r in result["runs"][kind]]

    def headline(self, result: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
        n = result["trials"]
        whole, bounded = self._regrets(result, "whole", n), self._regrets(result, "bounded", n)
        if not whole or not bounded:
            return []
        upper = percentile(whole, 75)
        return [(
            f"no loss of search quality: median regret after {n:,} trials (bounded view) "
            "≤ the whole study's upper quartile",
            f"{statistics.median(bounded):.4f} vs {statistics.median(whole):.4f} "
            f"(upper quartile {upper:.4f}), {result['seeds']} seeds",
            statistics.median(bounded) <= upper,
        )]

    def render(self, result: dict[str, Any]) -> str:
        n, seeds = result["trials"], result["seeds"]
        lines = [
            f"Hartmann-6 (minimize; regret = best value found − global minimum), {n:,} "
            f"trials, TPE as the controller configures it (multivariate, constant liar, "
            f"{result['parallelism']} trials in flight), seeds 1–{seeds}. *Whole study*: TPE "
            "reads every trial on every ask (Optuna's behaviour). *Bounded view*: what the "
            "controller runs (`tuner/search/sampling_view.py`): TPE's good-set candidates, "
            "the newest "
            "128 finished trials, a uniform sample of 160 older ones and the running trials; "
            "identical to the whole study up to 320 finished trials.",
            "",
            "| study TPE sees | " + " | ".join(
                f"median regret @{c:,}" for c in result["checkpoints"]) +
            f" | regret @{n:,} per seed | ask p50, last 100 |",
            "|---|" + "---|" * (len(result["checkpoints"]) + 2),
        ]
        for kind, label in (("whole", "whole study"), ("bounded", "bounded view")):
            runs = result["runs"][kind]
            cells = [f"{statistics.median(self._regrets(result, kind, c)):.4f}"
                     for c in result["checkpoints"]]
            per_seed = ", ".join(f"{r['regret'][str(n)]:.4f}" for r in runs)
            ask = statistics.median(r["ask_late_p50_s"] for r in runs)
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {per_seed} | {ms(ask)} |")
        lines += ["", "Target (issue 15): no loss of search quality from the bounded view."]
        return "\n".join(lines)
