"""Scale of the controller: a 10,000-trial sweep of a trivial objective, on SQLite and on
PostgreSQL. Per-trial controller time (ask + launch + tell) around trial 100 against around the
last trial, Optuna's suggestion latency, and throughput in windows; beside it, plain Optuna's
ask/tell loop on the same storage and sampler (the floor tunehub builds on).

Trials run on :class:`tuner.backends.instant.InstantBackend` so the numbers are the controller's
own cost, not process start-up (that is the start-latency benchmark's subject).
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import io
import pstats
import resource
import time
from pathlib import Path
from typing import Any

from benchmarks._base import Benchmark, RunContext
from benchmarks._common import (
    database_url,
    ms,
    ratio,
    run_peer,
    secs,
    summary,
    throughput,
    tunehub_env,
    window,
)

FULL_TRIALS = 10_000
QUICK_TRIALS = 300
PARALLELISM = 4
EARLY = 100


STEPS = 3  # intermediate reports per trial, judged by the pruner


def scale_spec(trials: int, steps: int = STEPS) -> dict[str, Any]:
    """``steps`` > 0: every trial reports that many intermediate values and successive
    halving (ASHA) prunes on them, as the issue's target asks (TPE and a pruner on)."""
    pruner = ({"pruner": {"type": "asha", "min_resource": 1, "reduction_factor": 3}}
              if steps else {})
    return {
        **pruner,
        "name": "scale",
        "command": "python -c pass",  # never run: the instant backend evaluates in-process
        "metric": "score",
        "trials": trials,
        "parallelism": PARALLELISM,
        "sampler": "tpe",
        "seed": 1,
        "space": {
            "x": {"type": "float", "low": 0.0, "high": 1.0},
            "y": {"type": "float", "low": 0.0, "high": 1.0},
        },
    }


def run_tunehub(home: Path, url: str, trials: int, profile: Path | None,
                steps: int = STEPS) -> dict[str, Any]:
    """One sweep on the instant backend with the controller's steps timed."""
    from benchmarks._tunehub import Probe, optuna_probe, patched, run_sweep, settings_for
    from tuner.backends.instant import InstantBackend
    from tuner.db import Database
    from tuner.search.study import forget_storages, storage_for
    from tuner.spec import SweepSpec

    settings = settings_for(home, url)
    db = Database(url)
    spec = SweepSpec.from_dict(scale_spec(trials, steps))
    probe = Probe()
    profiler = cProfile.Profile() if profile is not None else None
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    try:
        with patched(optuna_probe(), probe):
            if profiler is not None:
                profiler.enable()
            run = asyncio.run(run_sweep(settings, db, spec, InstantBackend(steps), [probe]))
            if profiler is not None:
                profiler.disable()
    finally:
        db.dispose()
        with contextlib.suppress(Exception):
            storage_for(url).engine.dispose()
        forget_storages()
    if profiler is not None and profile is not None:
        profile.parent.mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(str(profile))
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(30)
        profile.with_suffix(".txt").write_text(out.getvalue())
    memory = mirror_memory(spec, url, run.sweep_id)
    ask, launch, tell = probe.seconds("ask"), probe.seconds("launch"), probe.seconds("tell")
    per_trial = [a + b + c for a, b, c in zip(ask, launch, tell, strict=False)]
    finishes = [start + d for start, d in probe.calls.get("tell", [])]
    return {
        "state": run.state,
        "trials": trials,
        "wall_s": run.wall_s,
        "per_trial_s": per_trial,
        "ask_s": ask,
        "launch_s": launch,
        "tell_s": tell,
        "optuna_ask_s": probe.seconds("optuna_ask"),
        "optuna_tell_s": probe.seconds("optuna_tell"),
        "report_s": probe.seconds("report"),
        "steps": steps,
        "finish_times": finishes,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_mib": rss_before,
        "mirror": memory,
    }


def mirror_memory(spec: Any, url: str, sweep_id: int) -> dict[str, float]:
    """What a controller resuming the finished sweep pays to hold its study in memory: the
    load's wall time (``load_mirror``, the database read and the in-memory copy) and the
    Python memory the mirror holds afterwards (tracemalloc), once per run, after the timed
    sweep so tracing slows nothing measured."""
    import gc
    import tracemalloc

    from tuner.db import Database, SweepRow
    from tuner.search.mirror import load_mirror

    db = Database(url, migrate=False)
    try:
        with db.session() as s:
            sweep = s.get(SweepRow, sweep_id)
            assert sweep is not None
            study_name = sweep.study_name
    finally:
        db.dispose()
    t0 = time.perf_counter()
    mirror = load_mirror(spec, study_name, url)
    load_s = time.perf_counter() - t0
    n = len(mirror.get_trials(deepcopy=False))
    del mirror
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        mirror = load_mirror(spec, study_name, url)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del mirror
    return {"trials": n, "load_s": load_s, "held_bytes": held, "bytes_per_trial": held / max(n, 1)}


def digest(raw: dict[str, Any], trials: int) -> dict[str, Any]:
    """Summaries by window; the raw lists are dropped from the stored result (too big)."""
    out: dict[str, Any] = {
        k: v for k, v in raw.items() if not isinstance(v, list)
    }
    late = trials
    for key in ("per_trial_s", "ask_s", "launch_s", "tell_s", "optuna_ask_s", "optuna_tell_s",
                "report_s"):
        values = raw.get(key)
        if not values:
            continue
        out[key] = {
            "all": summary(values),
            "early": summary(window(values, EARLY)),
            "late": summary(window(values, late)),
        }
    if raw.get("finish_times"):
        out["throughput_per_s"] = {
            "early": throughput(raw["finish_times"], EARLY),
            "late": throughput(raw["finish_times"], late),
        }
    return out


class ScaleBenchmark(Benchmark):
    name = "scale"
    title = "Scale of the controller"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        trials = ctx.size("scale_trials", QUICK_TRIALS, FULL_TRIALS)
        peer_trials = ctx.size("scale_peer_trials", trials, trials)
        profile = bool(ctx.options.get("profile"))
        steps = ctx.size("scale_steps", STEPS, STEPS)
        result: dict[str, Any] = {"trials": trials, "peer_trials": peer_trials, "steps": steps,
                                  "parallelism": PARALLELISM, "databases": {}}
        # scale_databases=1: SQLite only (the smoke test); 2 (default): also PostgreSQL.
        names = ("sqlite", "postgresql")[: ctx.size("scale_databases", 2, 2)]
        for db_name in names:
            ctx.log(f"scale: {trials} trials on {db_name} (tunehub, instant backend)")
            entry: dict[str, Any] = {}
            with database_url(db_name, ctx.scratch / f"scale-{db_name}-tunehub",
                              "bench_scale") as url:
                prof = ctx.profile_dir / f"scale-{db_name}.prof" if profile else None
                t0 = time.perf_counter()
                raw = run_tunehub(ctx.scratch / f"scale-{db_name}-home", url, trials, prof,
                                  steps)
                ctx.log(f"scale: tunehub on {db_name} took {time.perf_counter() - t0:.0f} s")
                entry["tunehub"] = digest(raw, trials)
            ctx.log(f"scale: {peer_trials} trials on {db_name} (plain Optuna ask/tell)")
            with database_url(db_name, ctx.scratch / f"scale-{db_name}-optuna",
                              "bench_scale") as url:
                peer = run_peer(
                    "optuna_asktell",
                    ["--trials", str(peer_trials), "--parallelism", str(PARALLELISM),
                     "--storage", url],
                    env=tunehub_env(ctx.scratch, url),
                )
                peer["per_trial_s"] = [
                    a + t for a, t in zip(peer["ask_s"], peer["tell_s"], strict=False)
                ]
                peer["command"] = peer["command"].replace(url, f"<{db_name} url>")
                entry["optuna"] = digest(peer, peer_trials)
            result["databases"][db_name] = entry
        return result

    def headline(self, result: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
        rows: list[tuple[str, str, bool | None]] = []
        n = result["trials"]
        for db_name, entry in result["databases"].items():
            th = entry.get("tunehub", {})
            per, sugg = th.get("per_trial_s"), th.get("optuna_ask_s")
            if not per or not sugg:
                continue
            growth = per["late"]["p50"] / per["early"]["p50"]
            rows.append((f"{db_name}: per-trial controller time flat (≤ 2×), trial 100 → "
                         f"{n:,}", f"{ms(per['early']['p50'])} → {ms(per['late']['p50'])} "
                         f"({growth:.2f}×)", growth <= 2))
            rows.append((f"{db_name}: suggestion p95 ≤ 50 ms",
                         f"p95 {ms(sugg['all']['p95'])} over all {n:,} trials, "
                         f"{ms(sugg['late']['p95'])} in the last 100",
                         sugg["all"]["p95"] <= 0.05))
        return rows

    def render(self, result: dict[str, Any]) -> str:
        n = result["trials"]
        lines = [
            f"A {n:,}-trial sweep, trivial objective (2 floats, TPE multivariate with constant "
            f"liar, seed 1), parallelism {result['parallelism']}. tunehub's controller runs "
            "its real path (trial rows, working directories and logs, backend events, the "
            "report route with its token check, Optuna's sampler on the controller's in-memory "
            "study (`tuner/search/mirror.py`) and every trial written to the study in the same "
            "database) on an "
            "**in-process backend whose trials finish the moment they launch** "
            "(`tuner/backends/instant.py`), so this isolates controller cost from process "
            "start-up. " + (
                f"Every trial reports {result['steps']} intermediate values (the objective "
                "scaled by step) through the same route, judged by successive halving (ASHA, "
                "reduction factor 3): pruned trials stop there. " if result.get("steps") else
                "") + "Peer: plain Optuna's ask/tell loop with the same sampler config and "
            "the same kind of storage opened the same way (SQLite: WAL, "
            "`synchronous=NORMAL`), 4 trials in flight (final values only).",
            "",
            f"\"Early\" = trials 51–150, \"late\" = the last 100 trials (of {n:,} for "
            f"tunehub, of {result.get('peer_trials', n):,} for plain Optuna).",
            "",
            "| database | what | early p50 | late p50 | late / early | late p95 |",
            "|---|---|---|---|---|---|",
        ]
        for db_name, entry in result["databases"].items():
            th, op = entry.get("tunehub", {}), entry.get("optuna", {})
            rows = [
                ("tunehub per trial (ask+launch+tell)", th.get("per_trial_s")),
                ("  of which the ask (`on_trial_asked`)", th.get("ask_s")),
                ("  of which the launch (`on_trial_start`, with the trial's reports)",
                 th.get("launch_s")),
                ("  one report (`report`: row, study, pruner)", th.get("report_s")),
                ("  of which the tell (`on_trial_end`)", th.get("tell_s")),
                ("  suggestion (`study.ask` on the in-memory study, inside the ask)",
                 th.get("optuna_ask_s")),
                ("plain Optuna per trial (ask+tell)", op.get("per_trial_s")),
                ("  plain Optuna `study.ask`", op.get("ask_s")),
            ]
            for label, stats in rows:
                if not stats:
                    continue
                early, late = stats["early"], stats["late"]
                lines.append(
                    f"| {db_name} | {label} | {ms(early['p50'])} | {ms(late['p50'])} | "
                    f"{ratio(late['p50'], early['p50'])} | {ms(late['p95'])} |"
                )
        lines += [
            "",
            "| database | tool | wall (whole sweep) | trials/s early | trials/s late | "
            "suggestion p50 / p95 (all trials) |",
            "|---|---|---|---|---|---|",
        ]
        for db_name, entry in result["databases"].items():
            for tool in ("tunehub", "optuna"):
                d = entry.get(tool)
                if not d:
                    continue
                tp = d.get("throughput_per_s", {})
                sugg = d.get("optuna_ask_s" if tool == "tunehub" else "ask_s", {}).get("all", {})
                lines.append(
                    f"| {db_name} | {tool} | {secs(d.get('wall_s'))} | "
                    f"{_num(tp.get('early'))} | {_num(tp.get('late'))} | "
                    f"{ms(sugg.get('p50'))} / {ms(sugg.get('p95'))} |"
                )
        for db_name, entry in result["databases"].items():
            mem = entry.get("tunehub", {}).get("mirror")
            if mem:
                lines += ["", (
                    f"{db_name}: the controller's study in memory at {mem['trials']:,} trials "
                    f"holds {mem['held_bytes'] / 2**20:.1f} MiB "
                    f"({mem['bytes_per_trial'] / 1024:.1f} KiB per trial, tracemalloc); a "
                    f"resuming controller loads it in {secs(mem['load_s'])}, in a worker "
                    "thread (the event loop goes on).")]
        lines += ["", (
            "No process RSS is given: the benchmark process also holds the other benchmarks' "
            "imports, and a peer forked from it inherits its high-water mark "
            "(`ru_maxrss` survives exec), so neither figure would measure the controller.")]
        lines += [
            "",
            "Targets (issues 6 and 15): per-trial cost within 2× from trial 100 to the last "
            "trial; p95 suggestion ≤ 50 ms. The `late / early` column is the first; the suggestion "
            "p95 column the second.",
        ]
        return "\n".join(lines)


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"
