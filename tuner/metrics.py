"""Prometheus metrics of the tuner: what an operator graphs and alerts on."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
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
from tunehub_base.gpu_usage import sample
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
    closes its record); what the GPUs do, read from NVML at the scrape:
    ``tunehub_gpu_utilization_ratio{gpu}`` and ``tunehub_gpu_memory_used_bytes{gpu}`` (a GPU
    without figures is left out); and ``tunehub_gpu_used_seconds_total{person, kind}``, the
    GPU-seconds used (utilisation-weighted) as the holders measured them, labelled like the
    allocated seconds so that used / allocated is one division."""

    def __init__(self, lock_dir: Path) -> None:
        self.book = HolderBook(lock_dir)

    def collect(self) -> Iterator[Metric]:
        held = held_family()
        seconds: defaultdict[tuple[str, str], float] = defaultdict(float)
        used_seconds: defaultdict[tuple[str, str], float] = defaultdict(float)
        ids = discover_gpus()[0]
        try:
            now = time.time()
            for row in self.book.pool(ids):
                holder = row.get("holder") or {}
                for kind in KINDS:
                    held.add_metric([row["gpu"], kind], 1.0 if holder.get("kind") == kind else 0.0)
                if holder:
                    who = (holder["person"], holder["kind"])
                    seconds[who] += now - float(row["since"])
                    used_seconds[who] += _used(row.get("use"))
            for span in self.book.intervals():
                who = (str(span["person"]), str(span.get("kind")))
                seconds[who] += float(span["end"]) - float(span["start"])
                used_seconds[who] += _used(span.get("use"))
        except OSError:
            return  # no pool to read: nothing to say
        yield held
        yield from gpu_seconds(seconds, used_seconds)
        yield from doing((gpu, r.utilization, r.memory_used_bytes)
                         for gpu, r in sorted(sample(ids).items()))


def held_family() -> GaugeMetricFamily:
    """``tunehub_gpu_held{gpu, kind}``: GPUs held, by kind of holder (one machine: each GPU
    0 or 1; Kubernetes: each flavor, how many)."""
    return GaugeMetricFamily("tunehub_gpu_held", "Whether a GPU is held, by kind of holder "
                             "(on Kubernetes: GPUs held per flavor)", labels=["gpu", "kind"])


def gpu_seconds(seconds: Mapping[tuple[str, str], float],
                used_seconds: Mapping[tuple[str, str], float]) -> Iterator[Metric]:
    """GPU-seconds allocated and used, by (person, kind): one shape for both modes."""
    allocated = CounterMetricFamily(
        "tunehub_gpu_allocated_seconds", "GPU-seconds allocated, by person and kind",
        labels=["person", "kind"])
    used = CounterMetricFamily(
        "tunehub_gpu_used_seconds", "GPU-seconds used (utilisation-weighted, as measured), "
        "by person and kind", labels=["person", "kind"])
    for (person, kind), value in sorted(seconds.items()):
        allocated.add_metric([person, kind], max(0.0, value))
        used.add_metric([person, kind], used_seconds.get((person, kind), 0.0))
    yield allocated
    yield used


def _used(use: object) -> float:
    try:
        return max(0.0, float(use.get("used_seconds") or 0)) if isinstance(use, dict) else 0.0
    except (TypeError, ValueError):
        return 0.0


def doing(readings: Iterable[tuple[str, float | None, int | None]]) -> Iterator[Metric]:
    """Each GPU's utilisation and memory in use now (``gpu``, utilisation, memory used; a
    figure that is None is left out): from NVML here, from a pod's readings on Kubernetes."""
    ratio = GaugeMetricFamily("tunehub_gpu_utilization_ratio",
                              "GPU utilisation over NVML's last sample period, 0..1",
                              labels=["gpu"])
    memory = GaugeMetricFamily("tunehub_gpu_memory_used_bytes", "GPU memory in use",
                               labels=["gpu"])
    for gpu, utilization, memory_used in readings:
        if utilization is not None:
            ratio.add_metric([gpu], utilization)
        if memory_used is not None:
            memory.add_metric([gpu], float(memory_used))
    yield ratio
    yield memory


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
