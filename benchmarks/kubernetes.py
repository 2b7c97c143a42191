"""Kubernetes backend: N concurrent trials against the Kubernetes API emulator (``python -m
kubesim``): API requests per trial, reads and writes separately (the emulator counts every
request of the code under test), and the controller's memory as the sweep grows.

Runs only when both parts exist in the tree: the backend (``tuner/backends/kubernetes.py``) and
the emulator (``kubesim``); otherwise it reports what is missing instead of a number.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks._base import Benchmark, NotMeasured, RunContext
from benchmarks._common import REPO, git_commit, secs, sqlite_url

TRIAL_CODE = Path(__file__).resolve().parent / "trials" / "kube"
EMULATOR_START_TIMEOUT = 120.0


def _committed(*paths: str) -> bool:
    """Whether git tracks any of ``paths``: a part someone is still writing (untracked in
    this shared checkout) is not benchmarked."""
    out = subprocess.run(["git", "ls-files", "--", *paths], cwd=REPO, capture_output=True,
                         text=True)
    return bool(out.stdout.strip())


def missing_parts() -> list[str]:
    """What this benchmark needs that the tree does not have yet."""
    missing = []
    if importlib.util.find_spec("tuner.backends.kubernetes") is None or not _committed(
        "tuner/backends/kubernetes", "tuner/backends/kubernetes.py"
    ):
        missing.append("the Kubernetes backend tuner/backends/kubernetes (issue 4) is not "
                       f"committed at {git_commit()}")
    if not _committed("kubesim/__main__.py"):
        missing.append("the Kubernetes emulator kubesim")
    return missing


def priority_class(url: str, name: str, token: str) -> None:
    """The PriorityClass the backend's Jobs name, created as the harness (not counted) with
    the emulator's admin token."""
    import httpx

    r = httpx.post(f"{url}/apis/scheduling.k8s.io/v1/priorityclasses", timeout=30,
                   headers={"User-Agent": "tunehub-kube-harness/bench",
                            "Authorization": f"Bearer {token}"},
                   json={"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                         "metadata": {"name": name}, "value": 1000})
    if r.status_code not in (201, 409):
        raise RuntimeError(f"creating PriorityClass {name}: {r.status_code} {r.text[:300]}")


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@contextlib.contextmanager
def emulator(data: Path, workdir: Path) -> Iterator[dict[str, Any]]:
    """``python -m kubesim`` in a process of its own; yields its JSON line (url,
    kubeconfig, namespace, counters)."""
    data.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubesim", "--data", str(data), "--workdir", str(workdir)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=(workdir / "emulator.log").open("wb"),
        text=True,
        # Pods run as local processes with the emulator's environment: `python` is this venv's.
        env={**os.environ,
             "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the emulator prints its address or dies
        if not line.startswith("{"):
            raise RuntimeError(f"the emulator did not start (exit {proc.poll()}); see "
                               f"{workdir / 'emulator.log'}")
        yield json.loads(line)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def counters(url: str, reset: bool = False) -> dict[str, dict[str, dict[str, int]]]:
    import httpx

    if reset:
        httpx.delete(f"{url}/_emulator/counters", timeout=30)
        return {}
    return dict(httpx.get(f"{url}/_emulator/counters", timeout=30).json())


WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


def split_counts(counts: dict[str, dict[str, dict[str, int]]]) -> dict[str, Any]:
    client = counts.get("client", {})
    reads = sum(n for verbs in client.values() for v, n in verbs.items() if v not in WRITE_VERBS)
    writes = sum(n for verbs in client.values() for v, n in verbs.items() if v in WRITE_VERBS)
    return {"reads": reads, "writes": writes, "by_resource": client}


def kube_spec(trials: int) -> dict[str, Any]:
    return {
        "name": "kube-bench", "command": "python trial.py", "code": str(TRIAL_CODE),
        "metric": "score", "trials": trials, "parallelism": trials, "sampler": "random",
        "seed": 1, "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        "resources": {"cpu": 0.001, "memory": "64Mi", "gpu": 0},
    }


async def _sweep_with_rss(settings: Any, db: Any, spec: Any) -> tuple[Any, list[float]]:
    from benchmarks._tunehub import run_sweep

    samples: list[float] = []

    async def sample() -> None:
        while True:
            samples.append(rss_mib())
            await asyncio.sleep(0.5)  # a sampling period, not synchronisation

    sampler = asyncio.get_running_loop().create_task(sample())
    try:
        run = await run_sweep(settings, db, spec, "kubernetes")
    finally:
        sampler.cancel()
    return run, samples


def run_size(home: Path, data: Path, trials: int, cluster: dict[str, Any]) -> dict[str, Any]:
    from benchmarks._tunehub import settings_for
    from tuner.db import Database
    from tuner.spec import SweepSpec

    url = sqlite_url(home)
    settings = settings_for(home, url, data)
    db = Database(url)
    counters(cluster["url"], reset=True)
    before = rss_mib()
    try:
        t0 = time.perf_counter()
        run, samples = asyncio.run(_sweep_with_rss(settings, db, SweepSpec.from_dict(
            kube_spec(trials))))
        wall = time.perf_counter() - t0
    finally:
        db.dispose()
    counts = split_counts(counters(cluster["url"]))
    return {"trials": trials, "state": run.state, "wall_s": wall, "rss_before_mib": before,
            "rss_peak_mib": max(samples, default=before), **counts,
            "reads_per_trial": counts["reads"] / trials,
            "writes_per_trial": counts["writes"] / trials}


class KubernetesBenchmark(Benchmark):
    name = "kubernetes"
    title = "Kubernetes backend"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        missing = missing_parts()
        if missing:
            raise NotMeasured("not in the tree yet: " + "; ".join(missing))
        trials = ctx.size("kube_trials", 20, 500)
        sizes = sorted({max(1, trials // 5), trials})
        data = (ctx.scratch / "data").resolve()
        with emulator(data, ctx.scratch / "kube") as cluster:
            # The backend's settings (tuner/backends/kubernetes/settings.py): the emulator's
            # kubeconfig, its namespace, and TUNEHUB_HOME inside the data store the
            # emulator mounts as the tunehub-data claim.
            # The per-person caps (tuner/limits.py) raised to the sizes measured: all trials
            # of the sweep at once is what this benchmark is about.
            os.environ.update({"KUBECONFIG": cluster["kubeconfig"],
                               "TUNEHUB_K8S_NAMESPACE": cluster["namespace"],
                               "TUNEHUB_DATA": str(data),
                               "TUNEHUB_MAX_PARALLELISM": str(trials),
                               "TUNEHUB_MAX_WORKERS_PER_PERSON": str(trials)})
            priority_class(cluster["url"], "tunehub-sweep-normal", cluster["token"])
            runs = []
            for n in sizes:
                ctx.log(f"kubernetes: {n} concurrent trials")
                home = data / f"home-{n}"
                os.environ["TUNEHUB_HOME"] = str(home)
                runs.append(run_size(home, data, n, cluster))
        return {"runs": runs}

    def headline(self, result: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
        runs = result["runs"]
        if len(runs) < 2:
            return []
        small, big = runs[0], runs[-1]
        per = (big["reads_per_trial"] + big["writes_per_trial"]) / max(
            1e-9, small["reads_per_trial"] + small["writes_per_trial"])
        g_small = (small["rss_peak_mib"] - small["rss_before_mib"]) / small["trials"]
        g_big = (big["rss_peak_mib"] - big["rss_before_mib"]) / big["trials"]
        return [
            ("constant API requests per trial (no polling)",
             f"{small['trials']} trials: {small['reads_per_trial']:.1f} reads + "
             f"{small['writes_per_trial']:.1f} writes; {big['trials']}: "
             f"{big['reads_per_trial']:.1f} + {big['writes_per_trial']:.1f}", per <= 1.2),
            ("controller memory at most linear in trials",
             f"{g_small * 1024:.0f} KiB/trial at {small['trials']}, {g_big * 1024:.0f} "
             f"KiB/trial at {big['trials']}", g_big <= max(g_small, 0.05) * 1.5),
        ]

    def render(self, result: dict[str, Any]) -> str:
        lines = [
            "All trials of a sweep at once (parallelism = trials) on the Kubernetes backend "
            "against the API emulator over real HTTP (its kubelet stand-in runs the pods' "
            "commands as local processes). Requests are those of tunehub's controller only "
            "(the emulator's own kubelet/Job controller are counted apart).",
            "",
            "| trials | state | wall | reads / trial | writes / trial | controller RSS before"
            " → peak | growth / trial |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in result["runs"]:
            growth = (r["rss_peak_mib"] - r["rss_before_mib"]) / r["trials"] * 1024
            lines.append(
                f"| {r['trials']} | {r['state']} | {secs(r['wall_s'])} | "
                f"{r['reads_per_trial']:.2f} | {r['writes_per_trial']:.2f} | "
                f"{r['rss_before_mib']:.0f} → {r['rss_peak_mib']:.0f} MiB | {growth:.0f} KiB |"
            )
        lines += ["", "Target (issue 6): constant requests per trial (no polling), memory "
                      "growing no faster than linearly with the number of trials."]
        return "\n".join(lines)
