"""Prometheus metrics of the tuner: what an operator graphs and alerts on."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import tornado.web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from tunehub_base.gpu_holders import KINDS, HolderBook
from tunehub_base.gpus import discover_gpus

SWEEPS_SUBMITTED = Counter("tunehub_sweeps_submitted_total", "Sweeps submitted", ["backend"])
SWEEPS_FINISHED = Counter("tunehub_sweeps_finished_total", "Sweeps finished", ["state"])
TRIALS_LAUNCHED = Counter("tunehub_trial_attempts_launched_total", "Trial attempts launched")
TRIALS_FINISHED = Counter("tunehub_trials_finished_total", "Trials finished", ["state"])
TRIALS_PREEMPTED = Counter("tunehub_trial_attempts_preempted_total",
                           "Trial attempts stopped for a notebook and put back in the queue")
TRIALS_RUNNING = Gauge("tunehub_trials_running", "Trial attempts running now")
TRIAL_STARTS = Counter(
    "tunehub_trial_starts_total",
    "Local trial attempts started, by warm (forked from a preloaded process) or cold",
    ["mode"],
)
REPORTS = Counter("tunehub_trial_reports_total", "Intermediate values reported by trials")
API_REQUESTS = Histogram(
    "tunehub_api_request_seconds", "Tuner API request latency", ["method", "route", "status"]
)


class GpuPoolCollector:
    """This machine's GPU pool, read at each scrape (:mod:`tunehub_base.gpu_holders`):
    ``tunehub_gpu_held{gpu, kind}`` (1 held by a notebook / a trial, else 0) and
    ``tunehub_gpu_allocated_seconds_total{person, kind}`` (the ledger's ended holdings plus the
    open ones so far; a holder that died counts again from when the next holder of its GPU
    closes its record)."""

    def __init__(self, lock_dir: Path) -> None:
        self.book = HolderBook(lock_dir)

    def collect(self) -> Iterator[Metric]:
        held = GaugeMetricFamily("tunehub_gpu_held", "Whether a GPU is held, by kind of holder",
                                 labels=["gpu", "kind"])
        allocated = CounterMetricFamily(
            "tunehub_gpu_allocated_seconds", "GPU-seconds allocated, by person and kind",
            labels=["person", "kind"])
        seconds: defaultdict[tuple[str, str], float] = defaultdict(float)
        try:
            now = time.time()
            for row in self.book.pool(discover_gpus()[0]):
                holder = row.get("holder") or {}
                for kind in KINDS:
                    held.add_metric([row["gpu"], kind], 1.0 if holder.get("kind") == kind else 0.0)
                if holder:
                    seconds[(holder["person"], holder["kind"])] += now - float(row["since"])
            for span in self.book.intervals():
                seconds[(str(span["person"]), str(span.get("kind")))] += (
                    float(span["end"]) - float(span["start"]))
        except OSError:
            return  # no pool to read: nothing to say
        for (person, kind), value in sorted(seconds.items()):
            allocated.add_metric([person, kind], max(0.0, value))
        yield held
        yield allocated


def watch_gpu_pool(lock_dir: Path, registry: CollectorRegistry = REGISTRY) -> GpuPoolCollector:
    """Add the pool's figures to the scrape (once per process)."""
    collector = GpuPoolCollector(lock_dir)
    registry.register(collector)
    return collector


class MetricsHandler(tornado.web.RequestHandler):
    """Prometheus scrape endpoint of a tunehub process (no user data, no auth)."""

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest())
