"""Helpers shared by benchmarks: the machine description, package versions, statistics, a
fresh tunehub home, a throw-away PostgreSQL schema, and peers run as subprocesses."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PG_BASE = os.environ.get(
    "TUNEHUB_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
PACKAGES = (
    "tunehub", "optuna", "ray", "sqlalchemy", "psycopg", "tensorflow-cpu", "tensorflow",
    "keras", "numpy", "scikit-learn", "tornado",
)


def machine() -> dict[str, Any]:
    """Cores, memory and CPU model: numbers only mean something next to the machine."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu_model": model or platform.processor() or "unknown",
        "logical_cpus": os.cpu_count(),
        "usable_cpus": affinity,
        "memory_gib": round(mem_kib / 2**20, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "load_average": list(os.getloadavg()),
    }


def versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    return out


def git_commit() -> str:
    proc = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    return proc.stdout.strip() or "unknown"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); the statistic hubtraf and Ray report."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary(values: Sequence[float]) -> dict[str, float]:
    """p50/p95/mean/max of a list of durations (seconds)."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "mean": statistics.fmean(values),
        "max": max(values),
    }


def ms(seconds: float | None) -> str:
    return "n/a" if seconds is None or seconds != seconds else f"{seconds * 1000:.1f} ms"


def secs(seconds: float | None) -> str:
    return "n/a" if seconds is None or seconds != seconds else f"{seconds:.1f} s"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or not b or a != a or b != b:
        return "n/a"
    return f"{a / b:.2f}×"


def tunehub_env(home: Path, db_url: str) -> dict[str, str]:
    """The environment of a fresh tunehub installation (no GPUs, quiet TensorFlow)."""
    env = dict(os.environ)
    env.update(
        {
            "TUNEHUB_HOME": str(home),
            "TUNEHUB_DB_URL": db_url,
            "TUNEHUB_LOCAL_GPUS": "",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        }
    )
    return env


def sqlite_url(directory: Path) -> str:
    return f"sqlite:///{directory / 'tunehub.sqlite'}"


@contextlib.contextmanager
def pg_schema(prefix: str = "bench") -> Iterator[str]:
    """A fresh schema in the shared PostgreSQL, dropped afterwards (even on failure)."""
    from sqlalchemy import create_engine, text

    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_BASE, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        yield f"{PG_BASE}?options=-csearch_path%3D{schema}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        admin.dispose()


@contextlib.contextmanager
def database_url(db_name: str, directory: Path, prefix: str) -> Iterator[str]:
    """A fresh database of the kind named ("sqlite": a file in ``directory``; "postgresql":
    a schema of its own, dropped afterwards)."""
    if db_name == "sqlite":
        directory.mkdir(parents=True, exist_ok=True)
        yield sqlite_url(directory)
    else:
        with pg_schema(prefix) as url:
            yield url


def run_peer(
    module: str, args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 3600
) -> dict[str, Any]:
    """Run ``python -m benchmarks.peers.<module> ARGS`` in a process of its own; the peer
    prints one JSON object on its last stdout line. Adds the process's wall time."""
    argv = [sys.executable, "-m", f"benchmarks.peers.{module}", *args]
    started = time.perf_counter()
    proc = subprocess.run(
        argv, cwd=REPO, env=env or tunehub_env(Path("/nonexistent"), "sqlite://"),
        capture_output=True, text=True, timeout=timeout,
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"{module} exited with {proc.returncode}:\n{tail}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{module} printed no JSON result:\n{proc.stdout[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    result["process_wall_s"] = wall
    result["command"] = " ".join(["python", "-m", f"benchmarks.peers.{module}", *args])
    return result


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def window(values: Sequence[float], center: int, width: int = 100) -> list[float]:
    """The values of the ``width`` trials around trial number ``center`` (1-based), clipped
    to the run: "around trial 100" is trials 51..150, "around trial 10,000" the last 100."""
    n = len(values)
    lo = max(0, min(center - width // 2, n - width))
    return list(values[lo : lo + width])


def throughput(finish_times: Sequence[float], center: int, width: int = 100) -> float | None:
    """Trials finished per second over the ``width`` finishes around ``center``."""
    times = sorted(finish_times)
    n = len(times)
    if n < 2:
        return None
    lo = max(0, min(center - width // 2, n - width))
    hi = min(n - 1, lo + width - 1)
    span = times[hi] - times[lo]
    return (hi - lo) / span if span > 0 else None


def free_port() -> int:
    """A TCP port free on loopback (for services the benchmarks start)."""
    from tunehub_base.ports import unclaimed_port

    return unclaimed_port()
