"""Trial start latency: from the controller launching a trial to the user's code running with
TensorFlow imported. tunehub cold (``TUNEHUB_WARM_START=0``: a new Python process per trial)
against warm (trials forked from a process that already imported TensorFlow, see
``tuner/backends/local/zygote_process.py``); peer: Ray Tune, whose trainable imports
TensorFlow, from Tune's ``on_trial_start`` to the trainable's code running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks._base import Benchmark, RunContext
from benchmarks._common import ms, ratio, run_peer, sqlite_url, summary, tunehub_env

TRIAL_CODE = Path(__file__).resolve().parent / "trials" / "tf_start"
PARALLELISM = 1  # one at a time: latency, not throughput (TensorFlow imports contend for CPU)


def latency_spec(trials: int, marks: Path) -> dict[str, Any]:
    return {
        "name": "start-latency",
        "command": "python trial.py",
        "code": str(TRIAL_CODE),
        "metric": "score",
        "trials": trials,
        "parallelism": PARALLELISM,
        "sampler": "random",
        "seed": 1,
        "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        "env": {"BENCH_MARKS": str(marks)},
    }


@contextlib.contextmanager
def warm_start(enabled: bool) -> Iterator[None]:
    before = os.environ.get("TUNEHUB_WARM_START")
    os.environ["TUNEHUB_WARM_START"] = "1" if enabled else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TUNEHUB_WARM_START", None)
        else:
            os.environ["TUNEHUB_WARM_START"] = before


def run_tunehub(home: Path, trials: int, warm: bool) -> dict[str, Any]:
    from benchmarks._tunehub import LaunchClock, run_sweep, settings_for
    from tuner.db import Database
    from tuner.spec import SweepSpec

    marks = home / "marks"
    marks.mkdir(parents=True, exist_ok=True)
    url = sqlite_url(home)
    settings = settings_for(home, url)
    db = Database(url)
    clock = LaunchClock()
    try:
        spec = SweepSpec.from_dict(latency_spec(trials, marks))
        with warm_start(warm):
            run = asyncio.run(run_sweep(settings, db, spec, "local", [clock]))
    finally:
        db.dispose()
    latencies = []
    for trial_id, start in sorted(clock.launched.items()):
        mark = marks / f"ran-{trial_id}"
        if mark.exists():
            latencies.append(float(mark.read_text()) - start)
    return {"state": run.state, "trials": trials, "latency_s": latencies,
            "wall_s": run.wall_s}


def _digest(latencies: list[float]) -> dict[str, Any]:
    """All trials, and the trials after the first (a warm sweep's first trial also boots the
    process that imports TensorFlow once for the whole sweep)."""
    return {"all": summary(latencies), "after_first": summary(latencies[1:]),
            "first": latencies[0] if latencies else None, "raw": latencies}


class StartLatencyBenchmark(Benchmark):
    name = "start_latency"
    title = "Trial start latency"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        trials = ctx.size("latency_trials", 3, 20)
        result: dict[str, Any] = {"trials": trials, "tools": {}}
        for mode, warm in (("tunehub_cold", False), ("tunehub_warm", True)):
            ctx.log(f"start_latency: {mode}, {trials} trials")
            raw = run_tunehub(ctx.scratch / mode, trials, warm)
            result["tools"][mode] = {**_digest(raw["latency_s"]), "state": raw["state"]}
        for key, extra in (("ray", []), ("ray_reuse", ["--reuse-actors"])):
            ctx.log(f"start_latency: Ray Tune ({key}), {trials} trials importing TensorFlow")
            ray_dir = ctx.scratch / key
            ray_dir.mkdir(parents=True, exist_ok=True)
            ray = run_peer(
                "ray_sleep",
                ["--trials", str(trials), "--parallelism", str(PARALLELISM), "--sleep", "0",
                 "--import-tf", "--storage-path", str(ray_dir), *extra],
                env={**tunehub_env(ctx.scratch, "sqlite://"),
                     "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"},
            )
            ray["command"] = ray["command"].replace(str(ray_dir), "<scratch>")
            result["tools"][key] = {**_digest(ray["start_latency_s"]),
                                    "command": ray["command"]}
        return result

    def headline(self, result: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
        tools = result["tools"]
        warm = tools.get("tunehub_warm", {}).get("all", {})
        cold = tools.get("tunehub_cold", {}).get("all", {})
        ray = tools.get("ray", {}).get("all", {})
        if not warm.get("n"):
            return []
        return [("warm start median ≤ 0.5 s (launch → code running with TensorFlow)",
                 f"warm p50 {ms(warm['p50'])}, p95 {ms(warm['p95'])} (cold p50 "
                 f"{ms(cold.get('p50'))}; Ray Tune p50 {ms(ray.get('p50'))})",
                 warm["p50"] <= 0.5)]

    def render(self, result: dict[str, Any]) -> str:
        lines = [
            f"{result['trials']} trials per mode, one at a time; the trial imports TensorFlow "
            "and Keras and records the moment its code runs. tunehub: from the controller's "
            "launch (`ControllerObserver.on_trial_start`) to that moment (includes the "
            "trial's database rows, working directory, "
            "and the process start). Ray Tune: from `Callback.on_trial_start` on the driver "
            "to that moment in the trainable (with `reuse_actors=True` a trial runs in an actor "
            "of an earlier trial, so TensorFlow is already imported, but trials share one "
            "process: no isolation).",
            "",
            "| mode | p50 | p95 | max | first trial | p50 excl. first | p50 / tunehub warm |",
            "|---|---|---|---|---|---|---|",
        ]
        tools = result["tools"]
        warm_p50 = tools.get("tunehub_warm", {}).get("all", {}).get("p50")
        for key, label in (("tunehub_cold", "tunehub cold (new process)"),
                           ("tunehub_warm", "tunehub warm (fork of a TF-loaded process)"),
                           ("ray", "Ray Tune, defaults (new actor per trial)"),
                           ("ray_reuse", "Ray Tune, reuse_actors=True")):
            d = tools.get(key)
            if not d or not d["all"].get("n"):
                lines.append(f"| {label} | no trial ran | | | | | |")
                continue
            a, rest = d["all"], d["after_first"]
            lines.append(
                f"| {label} | {ms(a['p50'])} | {ms(a['p95'])} | {ms(a['max'])} | "
                f"{ms(d['first'])} | {ms(rest.get('p50'))} | {ratio(a['p50'], warm_p50)} |"
            )
        lines += ["", "Target (issue 6): warm median ≤ 0.5 s, each trial still its own "
                      "process (a crash or leak cannot reach the next trial)."]
        return "\n".join(lines)
